"""Prometheus metrics of the operator itself (not of the vLLM pods it runs)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RECONCILE_SECONDS = Histogram(
    "kimik3_operator_reconcile_duration_seconds", "Duration of one reconcile pass", ["result"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RECONCILE_ERRORS = Counter(
    "kimik3_operator_reconcile_errors_total", "Reconcile passes that ended in an error", ["reason"],
)
APPLIES = Counter(
    "kimik3_operator_applies_total", "Server-side applies and deletes of children", ["kind", "action"],
)

LEADER = Gauge(
    "kimik3_operator_leader", "1 while this replica holds the leader Lease and acts, 0 while it stands by",
)


def serve_metrics(port: int) -> None:
    """Expose /metrics on `port` from a background thread."""
    start_http_server(port)
