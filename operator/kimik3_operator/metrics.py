"""Prometheus metrics of the operator itself (not of the vLLM pods it runs)."""

from __future__ import annotations

import platform
import threading
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import Counter, Gauge, Histogram, start_http_server

from . import __version__
from .api import KimiK3DeploymentStatus
from .api.reasons import PASS_ERRORS
from .api.status import WeightsStatus

# One spelling of a deployment across every series, the operator's and the scraped ones: the chart's
# PodMonitors relabel the engines' and routers' pods to `kimik3_deployment`/`kimik3_pool`/`kimik3_role`,
# and Prometheus adds their `namespace`, so a query joins the operator's series to vLLM's on these
# labels as they are (tests/unit/test_metric_labels.py keeps the chart and the operator to it).
DEPLOYMENT_LABELS = ["namespace", "kimik3_deployment"]
ROLE_LABELS = [*DEPLOYMENT_LABELS, "kimik3_pool", "kimik3_role"]

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
RECONCILE_PURE_CPU_SECONDS = Histogram(
    "kimik3_operator_reconcile_pure_cpu_seconds", "CPU time one reconcile pass's thread spent in the operator "
    "itself: its pure time less what it waited for a CPU or for the interpreter lock other passes and the "
    "informers held", buckets=PASS_BUCKETS,
)
RECONCILE_ERRORS = Counter(
    "kimik3_operator_reconcile_errors_total", "Reconcile passes that ended in an error", ["reason"],
)
TRANSIENT_API_ERROR = "TransientApiError"
"""The reason of a pass the API server cut short (retried): not a condition's, only this counter's."""
for _reason in sorted(PASS_ERRORS | {TRANSIENT_API_ERROR}):
    # Every reason a pass can end with, at 0 from the start: an error rate then reads 0 rather than
    # no data (the dashboard's error panel, the alert), as Prometheus advises for known label values.
    RECONCILE_ERRORS.labels(_reason)
APPLIES = Counter(
    "kimik3_operator_applies_total", "Server-side applies and deletes of children", ["kind", "action"],
)

CHILD_EVENTS = Counter(
    "kimik3_operator_child_events_total",
    "Changes of a watched child (what a pass reads of it) that asked for a pass of its deployment, by kind; "
    "changes within the coalescing window share one pass",
    ["kind"],
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
    [*ROLE_LABELS, "direction"],
)
SCALER_REPLICAS = Gauge(
    "kimik3_operator_slo_scaler_replicas", "The replica count the SLO scaler last decided per role",
    ROLE_LABELS,
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


def _version_of(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


BUILD_INFO = Gauge(
    "kimik3_operator_build_info", "Always 1: the operator's version, and the Python and kopf it runs on",
    ["version", "python", "kopf"],
)
BUILD_INFO.labels(__version__, platform.python_version(), _version_of("kopf")).set(1)

READY_REPLICAS = Gauge(
    "kimik3_deployment_ready_replicas",
    "Ready replicas of a role as its status shows them (status.pools[].roles[].readyReplicas)", ROLE_LABELS,
)
PLANNED_REPLICAS = Gauge(
    "kimik3_deployment_replicas", "Planned replicas of a role (status.pools[].roles[].replicas)", ROLE_LABELS,
)
UPDATED_REPLICAS = Gauge(
    "kimik3_deployment_updated_replicas",
    "Replicas of a role on its current revision (status.pools[].roles[].updatedReplicas): a rollout's progress",
    ROLE_LABELS,
)
COLD_START_SECONDS = Gauge(
    "kimik3_deployment_cold_start_predicted_seconds",
    "Predicted seconds from a new replica's pods scheduled to Ready, compile cache warm "
    "(status.pools[].roles[].coldStart.readySeconds; docs/cold-start.md)", ROLE_LABELS,
)
WEIGHTS_STAGED = Gauge(
    "kimik3_deployment_weights_staged_ratio",
    "Share of a checkpoint's bytes staged into the cache volume, 0 to 1 (status.weights[].percent; 1 once "
    "Staged)", [*DEPLOYMENT_LABELS, "checkpoint"],
)
PHASE = Gauge(
    "kimik3_deployment_phase", "1 for the phase a deployment's status shows, 0 for the others",
    [*DEPLOYMENT_LABELS, "phase"],
)
CONDITION = Gauge(
    "kimik3_deployment_condition",
    "1 per condition of a deployment's status, with its current status and reason (a changed reason "
    "replaces the series)", [*DEPLOYMENT_LABELS, "type", "status", "reason"],
)


SERIES_OF_A_DEPLOYMENT = (READY_REPLICAS, PLANNED_REPLICAS, UPDATED_REPLICAS, COLD_START_SECONDS, WEIGHTS_STAGED,
                          PHASE, CONDITION)


def _staged_ratio(weights: WeightsStatus) -> float | None:
    """None while a Job stages without a byte count yet: no series rather than a made-up 0."""
    if weights.phase == "Staged":
        return 1.0
    if weights.percent is not None:
        return min(weights.percent, 100.0) / 100
    return 0.0 if weights.phase == "Pending" else None


class DeploymentSeries:
    """The per-deployment series of the statuses the reconcile passes compute, in this (the
    leader's) process; a deployment that is gone loses its series at the next resync (`keep_only`),
    a role or condition reason that is gone at the next pass."""

    def __init__(self) -> None:
        self._labels: dict[tuple[str, str], dict[Gauge, set[tuple[str, ...]]]] = {}
        self._lock = threading.Lock()

    def record(self, namespace: str, name: str, status: KimiK3DeploymentStatus) -> None:
        key = (namespace, name)
        values: dict[Gauge, dict[tuple[str, ...], float]] = {gauge: {} for gauge in SERIES_OF_A_DEPLOYMENT}
        for pool in status.pools:
            for role in pool.roles:
                of_role: tuple[str, ...] = (*key, pool.name, role.role)
                values[READY_REPLICAS][of_role] = role.ready_replicas
                values[PLANNED_REPLICAS][of_role] = role.replicas
                values[UPDATED_REPLICAS][of_role] = role.updated_replicas
                if role.cold_start is not None:
                    values[COLD_START_SECONDS][of_role] = role.cold_start.ready_seconds
        for weights in status.weights:
            staged = _staged_ratio(weights)
            if staged is not None:
                values[WEIGHTS_STAGED][(*key, weights.name)] = staged
        if status.phase:
            values[PHASE] = {(*key, phase): float(phase == status.phase) for phase in PHASES}
        for c in status.conditions:
            values[CONDITION][(*key, c.type, c.status, c.reason)] = 1
        with self._lock:
            before = self._labels.get(key, {})
            for gauge, series in values.items():
                for labels in before.get(gauge, set()) - set(series):
                    gauge.remove(*labels)
                for labels, value in series.items():
                    gauge.labels(*labels).set(value)
            self._labels[key] = {gauge: set(series) for gauge, series in values.items()}

    def keep_only(self, keys: set[tuple[str, str]]) -> None:
        with self._lock:
            for key in set(self._labels) - keys:
                for gauge, series in self._labels.pop(key).items():
                    for labels in series:
                        gauge.remove(*labels)


DEPLOYMENT_SERIES = DeploymentSeries()
"""The one book of the process: every reconcile pass's status goes through it (reconcile/status.py)."""


def serve_metrics(port: int) -> None:
    """Expose /metrics on `port` from a background thread."""
    start_http_server(port)
