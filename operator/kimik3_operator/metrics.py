"""Prometheus metrics of the operator itself (not of the vLLM pods it runs)."""

from __future__ import annotations

import threading

from prometheus_client import Counter, Gauge, Histogram, start_http_server

PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
RECONCILE_SECONDS = Histogram(
    "kimik3_operator_reconcile_duration_seconds", "Duration of one reconcile pass", ["result"],
    buckets=PASS_BUCKETS,
)
RECONCILE_API_SECONDS = Histogram(
    "kimik3_operator_reconcile_api_seconds", "Time one reconcile pass waited on the API server (its writes: "
    "reads come from the informers)", buckets=PASS_BUCKETS,
)
RECONCILE_PURE_SECONDS = Histogram(
    "kimik3_operator_reconcile_pure_seconds", "Time one reconcile pass spent in the operator itself (planning, "
    "rendering, drift checks, status): its duration less its API time", buckets=PASS_BUCKETS,
)
RECONCILE_ERRORS = Counter(
    "kimik3_operator_reconcile_errors_total", "Reconcile passes that ended in an error", ["reason"],
)
APPLIES = Counter(
    "kimik3_operator_applies_total", "Server-side applies and deletes of children", ["kind", "action"],
)

RESYNCS = Counter(
    "kimik3_operator_resyncs_total",
    "Completed resync rounds: every KimiK3Deployment of the watched namespaces reconciled once more",
)

LEADER = Gauge(
    "kimik3_operator_leader", "1 while this replica holds the leader Lease and acts, 0 while it stands by",
)

SCALER_DECISIONS = Counter(
    "kimik3_operator_slo_scaler_decisions_total",
    "Decisions of the operator's SLO scaler per role: up, down, hold, or error (metrics unreadable)",
    ["namespace", "deployment", "pool", "role", "direction"],
)
SCALER_REPLICAS = Gauge(
    "kimik3_operator_slo_scaler_replicas", "The replica count the SLO scaler last decided per role",
    ["namespace", "deployment", "pool", "role"],
)


DEPLOYMENTS = Gauge(
    "kimik3_operator_deployments", "KimiK3Deployments by the phase their status shows", ["phase"],
)
PHASES = ("Pending", "Progressing", "Ready", "Degraded", "Failed")


class PhaseBook:
    """The last phase of every deployment this process reconciled, exported as DEPLOYMENTS; a
    deployment that is gone is dropped at the next resync (`keep_only`)."""

    def __init__(self) -> None:
        self._phases: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def record(self, key: tuple[str, str], phase: str | None) -> None:
        with self._lock:
            if phase:
                self._phases[key] = phase
            self._export()

    def keep_only(self, keys: set[tuple[str, str]]) -> None:
        with self._lock:
            self._phases = {k: v for k, v in self._phases.items() if k in keys}
            self._export()

    def _export(self) -> None:
        for phase in PHASES:
            DEPLOYMENTS.labels(phase).set(sum(1 for p in self._phases.values() if p == phase))


def serve_metrics(port: int) -> None:
    """Expose /metrics on `port` from a background thread."""
    start_http_server(port)
