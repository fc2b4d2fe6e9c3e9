"""Which roles autoscale, on what, toward which target per replica (resolved from the spec and the
perf model).

The load metrics are vLLM's own (vllm/v1/metrics/loggers.py in 0.33.0; docs/vllm-facts.md
"Metrics"), summed over the role's engines, so a target is always per replica: the contract KEDA's
Prometheus trigger (AverageValue) and an HPA pods metric (averageValue) share, where the desired
count is ceil(total / target). Defaults follow the signals the peers scale on: Dynamo's planner and
llm-d scale prefill on prompt throughput and TTFT, decode on in-flight requests (KV and batch
pressure) and inter-token latency.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..api import KimiK3DeploymentSpec, RoleName
from ..api.reasons import AUTOSCALING_TARGET_UNKNOWN, AUTOSCALING_UNCONFIGURED
from ..api.spec import Autoscaling, Role, ScalingMetric
from .perf import DECODE_UTILISATION, PREFILL_UTILISATION
from .plan import PlanningError, PoolPlan
from .scaling import RoleScaling, ScalingSettings
from .split import DEFAULT_WORKLOAD

DEFAULT_METRIC: dict[str, ScalingMetric] = {
    "prefill": "PromptTokensPerSecond", "decode": "RequestsInFlight", "aggregated": "RequestsInFlight"}
DEFAULT_SETTINGS = Autoscaling()
KV_CACHE_TARGET = 0.8
"""KvCacheUsage per replica: past ~80% vLLM starts preempting (recomputing) running requests."""
WAITING_TARGET = 2.0
"""RequestsWaiting per replica: a queue of two keeps the batch full without TTFT growing."""


def settings(spec: KimiK3DeploymentSpec, pools: tuple[PoolPlan, ...],
             default_url: str | None) -> ScalingSettings | None:
    """The scalers' settings, with the Prometheus they read: the spec's, else the operator's. A
    KEDA trigger names it, so a KEDA role without one cannot be rendered (the SLO scaler instead
    holds, and says why, until there is one)."""
    if not any(r.autoscaling for p in pools for r in p.roles):
        return None
    a = spec.autoscaling or DEFAULT_SETTINGS
    url = a.prometheus_url or default_url
    keda = [f"pool {p.name} role {r.role}" for p in pools for r in p.roles
            if r.autoscaling and r.autoscaling.mode == "KEDA"]
    if url is None and keda:
        # The operator's settings decide, not the spec alone: a condition (retried by the resync),
        # never an admission refusal.
        raise PlanningError(AUTOSCALING_UNCONFIGURED,
                            f"{', '.join(keda)}: autoscaling mode KEDA needs Prometheus's URL: set "
                            "spec.autoscaling.prometheusUrl or the operator's --prometheus-url "
                            "(chart value autoscaling.prometheusUrl)", depends_on_nodes=True)
    ratio = a.prefill_decode_ratio
    return ScalingSettings(a.interval_seconds, a.window_seconds, a.breach_seconds, a.scale_up_cooldown_seconds,
                           a.scale_down_cooldown_seconds, url, (ratio.min, ratio.max) if ratio else None,
                           frozenset(spec.experimental.accept_known_issues if spec.experimental else ()))


def role_scaling(spec: KimiK3DeploymentSpec, where: str, kind: RoleName, role: Role,
                 predicted: Mapping[str, float], input_tokens: int) -> RoleScaling | None:
    """The resolved autoscaling of one role; None when it is not autoscaled."""
    auto = role.autoscaling
    if auto is None:
        return None
    mode = auto.mode or (spec.autoscaling or DEFAULT_SETTINGS).mode
    metric = auto.metric or DEFAULT_METRIC[kind]
    if auto.target is not None:
        target, source = auto.target, "spec"
    else:
        found = _capacity(metric, predicted, input_tokens)
        if found is None:
            raise PlanningError(
                AUTOSCALING_TARGET_UNKNOWN,
                f"{where}: autoscaling on {metric} needs a target per replica, and the perf model has no "
                f"capacity for this role (unknown GPU product or layout); set autoscaling.target")
        target, source = found
    latency: list[tuple[str, float]] = []
    if mode == "SLO" and spec.slo:
        if kind in ("prefill", "aggregated") and spec.slo.ttft_milliseconds:
            latency.append(("ttft", spec.slo.ttft_milliseconds / 1e3))
        if kind in ("decode", "aggregated") and spec.slo.itl_milliseconds:
            latency.append(("itl", spec.slo.itl_milliseconds / 1e3))
    return RoleScaling(mode, auto.min_replicas, auto.max_replicas, metric, round(target, 3), source, tuple(latency))


def _capacity(metric: ScalingMetric, predicted: Mapping[str, float], input_tokens: int) -> tuple[float, str] | None:
    """One replica's share of `metric` at the planner's utilisation (split.py sizes with the same)."""
    if metric == "KvCacheUsage":
        return KV_CACHE_TARGET, "default"
    if metric == "RequestsWaiting":
        return WAITING_TARGET, "default"
    if metric == "PromptTokensPerSecond" and predicted.get("prefillRequestsPerSecond"):
        return predicted["prefillRequestsPerSecond"] * input_tokens * PREFILL_UTILISATION, "perf model"
    if metric == "RequestsInFlight" and predicted.get("decodeBatchAtSlo"):
        return max(1.0, predicted["decodeBatchAtSlo"] * DECODE_UTILISATION), "perf model"
    if metric == "GenerationTokensPerSecond" and predicted.get("decodeItlMsAtSlo"):
        # Each sequence emits a token per ITL: a speculative step emits its acceptance length.
        batch = predicted["decodeBatchAtSlo"]
        return batch / (predicted["decodeItlMsAtSlo"] / 1e3) * DECODE_UTILISATION, "perf model"
    return None


def clamp(replicas: int, scaling: RoleScaling) -> int:
    return max(scaling.min_replicas, min(scaling.max_replicas, replicas))


def with_autoscaling(spec: KimiK3DeploymentSpec, pools: tuple[PoolPlan, ...]) -> tuple[PoolPlan, ...]:
    """Attach each role's autoscaling; its planned replicas become where it starts, within min..max."""
    input_tokens = (spec.workload or DEFAULT_WORKLOAD).input_tokens
    by_name = {p.name: p for p in spec.pools}
    out = []
    for pool in pools:
        roles = []
        for role in pool.roles:
            given = getattr(by_name[pool.name], role.role)
            scaling = role_scaling(spec, f"pool {pool.name} role {role.role}", role.role, given,
                                   role.predicted, input_tokens)
            roles.append(role if scaling is None else dataclasses.replace(
                role, autoscaling=scaling, replicas=clamp(role.replicas, scaling)))
        out.append(dataclasses.replace(pool, roles=tuple(roles)))
    return tuple(out)
