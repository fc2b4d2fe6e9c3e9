"""The one client of Prometheus's HTTP API (the SLO scaler's reads): instant queries to a number.

https://prometheus.io/docs/prometheus/latest/querying/api/ — GET /api/v1/query answers
{"status": "success", "data": {"resultType": "vector", "result": [{"value": [t, "1.5"]}]}}.
An empty vector or NaN (a quantile over no requests) is "no data", not zero: the scaler must
not read an idle histogram as perfect latency, nor a missing target as no load.
"""

from __future__ import annotations

import math

import requests

TIMEOUT_SECONDS = 5.0
NO_URL = ("no Prometheus URL: set spec.autoscaling.prometheusUrl or the operator's --prometheus-url "
          "(chart value autoscaling.prometheusUrl)")
"""What the SLO scaler and the Disaggregating condition say when they have nothing to ask."""


class PrometheusError(Exception):
    """Prometheus could not answer: unreachable, an HTTP error, or a query it refused."""


class Prometheus:
    def __init__(self, url: str, session: requests.Session | None = None) -> None:
        self.url = url.rstrip("/")
        self._session = session or requests.Session()

    def scalar(self, query: str) -> float | None:
        """The query's single value now; None when it has none (no series, or NaN)."""
        try:
            reply = self._session.get(f"{self.url}/api/v1/query", params={"query": query}, timeout=TIMEOUT_SECONDS)
        except requests.RequestException as exc:
            raise PrometheusError(f"Prometheus at {self.url} unreachable: {exc.__class__.__name__}") from exc
        try:
            body = reply.json()
        except ValueError as exc:
            raise PrometheusError(f"Prometheus at {self.url} answered HTTP {reply.status_code}, not JSON") from exc
        if reply.status_code != 200 or body.get("status") != "success":
            raise PrometheusError(f"Prometheus refused {query!r}: {body.get('error') or reply.status_code}")
        result = (body.get("data") or {}).get("result") or []
        if not result:
            return None
        if len(result) > 1:
            raise PrometheusError(f"{query!r} gave {len(result)} series, not one")
        value = float(result[0]["value"][1])
        return None if math.isnan(value) else value
