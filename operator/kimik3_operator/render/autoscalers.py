"""The scaler objects of roles in autoscaling mode KEDA or HPA; both target the role's
LeaderWorkerSet through its /scale subresource.

LWS serves /scale with `status.hpaPodSelector` as the selector, which picks leader pods only
(sigs.k8s.io/lws v0.9.0 pkg/controllers/leaderworkerset_controller.go:539): a pods metric is
averaged over the replicas' engines, not over headless workers. The scale-down stabilization is
spec.autoscaling.scaleDownCooldownSeconds and a replica goes one at a time: each is a multi-node
group that takes minutes to load, so a brief lull must not cost one. Scale-up waits for the load
to hold for breachSeconds (the HPA's scale-up stabilization window).
"""

from __future__ import annotations

from typing import Any

from ..contract.kinds import HORIZONTAL_POD_AUTOSCALER, LEADER_WORKER_SET, SCALED_OBJECT
from ..planner import Plan, PoolPlan, RolePlan
from ..planner.scaling import RoleScaling, ScalingSettings
from .names import Owner, object_meta, workload_name
from .promql import ADAPTER_METRICS, load_query, selector


def scalers(owner: Owner, plan: Plan) -> list[dict[str, Any]]:
    out = []
    for pool, role in plan.role_plans():
        scaling, settings = role.autoscaling, plan.scaling
        if scaling is None or settings is None:
            continue
        if scaling.mode == "KEDA":
            out.append(scaled_object(owner, pool, role, scaling, settings))
        elif scaling.mode == "HPA":
            out.append(horizontal_pod_autoscaler(owner, pool, role, scaling, settings))
    return out


def _target_ref(owner: Owner, pool: PoolPlan, role: RolePlan) -> dict[str, str]:
    return {"apiVersion": LEADER_WORKER_SET.api_version, "kind": LEADER_WORKER_SET.kind,
            "name": workload_name(owner, pool.name, role.role)}


MAX_WINDOW_SECONDS = 3600
MAX_PERIOD_SECONDS = 1800
"""The HPA API's bounds on a stabilization window and a policy period (autoscaling/v2 validation)."""


def _behavior(settings: ScalingSettings) -> dict[str, Any]:
    def one_replica_per(seconds: int) -> list[dict[str, Any]]:
        return [{"type": "Pods", "value": 1, "periodSeconds": min(MAX_PERIOD_SECONDS, max(15, seconds))}]
    return {
        "scaleUp": {"stabilizationWindowSeconds": settings.breach_seconds,
                    "policies": one_replica_per(settings.scale_up_cooldown_seconds)},
        "scaleDown": {"stabilizationWindowSeconds": min(MAX_WINDOW_SECONDS, settings.scale_down_cooldown_seconds),
                      "policies": one_replica_per(settings.scale_down_cooldown_seconds)},
    }


def _milli(value: float) -> str:
    """A quantity the API server keeps as given (a float would round-trip as 1500m or 1.5)."""
    return f"{round(value * 1000)}m"


def scaled_object(owner: Owner, pool: PoolPlan, role: RolePlan, scaling: RoleScaling,
                  settings: ScalingSettings) -> dict[str, Any]:
    """KEDA's Prometheus scaler: desired = ceil(query / threshold) (metricType AverageValue,
    keda pkg/scalers/prometheus_scaler.go), the same per-replica target as the other modes."""
    name = workload_name(owner, pool.name, role.role)
    assert settings.prometheus_url, "the planner refuses a KEDA role without Prometheus's URL"
    return {
        **SCALED_OBJECT.type_meta(),
        "metadata": object_meta(owner, name, pool.name, role.role),
        "spec": {
            "scaleTargetRef": _target_ref(owner, pool, role),
            "minReplicaCount": scaling.min_replicas,
            "maxReplicaCount": scaling.max_replicas,
            "pollingInterval": settings.interval_seconds,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(settings)}},
            "triggers": [{
                "type": "prometheus",
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": settings.prometheus_url,
                    "query": load_query(scaling.metric, selector(owner, pool.name, role.role),
                                        settings.window_seconds),
                    "threshold": f"{scaling.target:g}",
                },
            }],
        },
    }


def horizontal_pod_autoscaler(owner: Owner, pool: PoolPlan, role: RolePlan, scaling: RoleScaling,
                              settings: ScalingSettings) -> dict[str, Any]:
    """An autoscaling/v2 HPA on the role's pods metric from the custom metrics API
    (promql.ADAPTER_METRICS): desired = ceil(sum over leaders / averageValue)."""
    name = workload_name(owner, pool.name, role.role)
    return {
        **HORIZONTAL_POD_AUTOSCALER.type_meta(),
        "metadata": object_meta(owner, name, pool.name, role.role),
        "spec": {
            "scaleTargetRef": _target_ref(owner, pool, role),
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": ADAPTER_METRICS[scaling.metric]},
                "target": {"type": "AverageValue", "averageValue": _milli(scaling.target)}}}],
            "behavior": _behavior(settings),
        },
    }
