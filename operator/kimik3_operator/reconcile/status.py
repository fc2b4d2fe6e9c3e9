"""Status as a pure function of the deployment, its plan and its live children.

Conditions follow metav1.Condition: `lastTransitionTime` moves only when a condition's status
flips, and the caller writes the status only when the computed one differs from the stored one.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..api import Condition, KimiK3DeploymentStatus, PoolStatus, RoleStatus
from ..api.v1alpha1 import EngineStatus
from ..planner import Plan, PlanningError
from ..render.names import Owner, workload_name
from ..render.services import service_url
from .weights_status import WeightsState

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
"""True when the deployment cannot reach what the spec asks without someone acting (a spec the
planner refuses, nodes without room, a staging Job that gave up); what already runs keeps running."""


def set_condition(conditions: list[Condition], new: Condition) -> list[Condition]:
    """Replace the condition of `new.type`, keeping its transition time if status is unchanged."""
    out: list[Condition] = []
    for old in conditions:
        if old.type == new.type:
            if old.status == new.status:
                new = new.model_copy(update={"last_transition_time": old.last_transition_time})
            continue
        out.append(old)
    return sorted([*out, new], key=lambda c: c.type)


def _condition(type_: str, ok: bool, reason: str, message: str, generation: int, now: str) -> Condition:
    return Condition(type=type_, status="True" if ok else "False", reason=reason, message=message,
                     last_transition_time=now, observed_generation=generation)


def role_statuses(owner: Owner, plan: Plan, workloads: Mapping[str, Mapping[str, Any]]) -> list[PoolStatus]:
    pools = []
    for pool in plan.pools:
        roles = []
        for role in pool.roles:
            name = workload_name(owner, pool.name, role.role)
            live = (workloads.get(name) or {}).get("status") or {}
            roles.append(RoleStatus(
                role=role.role,
                replicas=role.replicas,
                replicas_source=role.replicas_source,  # type: ignore[arg-type]
                block_size=role.block_size,
                ready_replicas=min(int(live.get("readyReplicas") or 0), role.replicas),
                updated_replicas=min(int(live.get("updatedReplicas") or 0), role.replicas),
                gpus_per_replica=role.gpus_per_replica,
                nodes_per_replica=role.nodes_per_replica,
                tensor_parallel=role.layout.tensor,
                pipeline_parallel=role.layout.pipeline,
                data_parallel=role.layout.data,
                expert_parallel=role.layout.expert,
                all2all_backend=role.all2all_backend,
                moe_backend=role.moe_backend,
                compute_domain=role.compute_domain,
                workload=name,
                endpoint=service_url(owner, pool.name, role.role),
            ))
        pools.append(PoolStatus(name=pool.name, gpu_product=pool.gpu_product, interconnect=pool.interconnect,
                                gpus_per_node=pool.gpus_per_node, roles=roles))
    return pools


def engine_status(plan: Plan) -> EngineStatus:
    engine = plan.engine
    spec = engine.speculative_config or {}
    return EngineStatus(
        kv_cache_dtype=engine.kv_cache_dtype, retention_policy=engine.retention_policy,
        retention_interval_tokens=engine.retention_interval if engine.prefix_caching else None,
        requested_retention_interval_tokens=engine.retention_requested if engine.prefix_caching else None,
        block_size=engine.retention_granularity,
        speculative_method=spec.get("method"), num_speculative_tokens=spec.get("num_speculative_tokens"),
        compatibility_hash=plan.compat_hash,
    )


def entry_endpoint(pools: list[PoolStatus]) -> str | None:
    """Where clients go until the router lands: the first aggregated role, else the first
    decode role (decode-first routing, as llm-d does: decode pulls the prompt's KV from prefill)."""
    for wanted in ("aggregated", "decode"):
        for pool in pools:
            for role in pool.roles:
                if role.role == wanted:
                    return role.endpoint
    return None


def compute_status(*, owner: Owner, generation: int, previous: KimiK3DeploymentStatus | None,
                   plan: Plan | None, error: PlanningError | None,
                   workloads: Mapping[str, Mapping[str, Any]], now: str,
                   capacity: list[str] | None = None, weights: WeightsState | None = None) -> KimiK3DeploymentStatus:
    """The status to store. `error` (a spec or planning problem) wins over `plan`; replicas that
    are not ready while the nodes lack room for them (`capacity` shortfalls) say so; until the
    checkpoints are staged (`weights`) nothing new serves and the conditions say how far it got."""
    conditions = list(previous.conditions) if previous else []

    def put(type_: str, ok: bool, reason: str, message: str) -> None:
        nonlocal conditions
        conditions = set_condition(conditions, _condition(type_, ok, reason, message, generation, now))

    if error is not None or plan is None:
        reason = error.reason if error else "InvalidSpec"
        message = error.message if error else "the deployment could not be planned"
        put(READY, False, reason, message)
        put(PROGRESSING, False, reason, message)
        put(DEGRADED, True, reason, message)
        # The last known plan facts stay visible: what runs is still what was last planned.
        return (previous or KimiK3DeploymentStatus()).model_copy(update={
            "observed_generation": generation, "phase": "Failed", "conditions": conditions})
    pools = role_statuses(owner, plan, workloads)
    roles = [(p.name, r) for p in pools for r in p.roles]
    lagging = [f"pool {p} role {r.role}: {r.ready_replicas}/{r.replicas} ready, {r.updated_replicas} updated"
               for p, r in roles if r.ready_replicas < r.replicas or r.updated_replicas < r.replicas]
    ready = sum(r.ready_replicas for _, r in roles)
    desired = sum(r.replicas for _, r in roles)
    failed = weights.failed if weights else []
    staging = weights is not None and not weights.all_staged and not failed
    weights_message = weights.summary() if weights else ""

    if failed:
        put(READY, ready > 0 and not lagging, "WeightsFailed", weights_message)
        put(PROGRESSING, False, "WeightsFailed", weights_message)
        put(DEGRADED, True, "WeightsFailed", weights_message)
        phase = "Degraded" if ready else "Failed"
    elif staging:
        if workloads and not lagging:  # a new revision stages beside the one serving
            put(READY, True, "AllReplicasReady", f"{ready}/{desired} replicas ready; {weights_message}")
        else:
            put(READY, False, "WeightsStaging", weights_message)
        put(PROGRESSING, True, "WeightsStaging", weights_message)
        put(DEGRADED, False, "AsExpected", weights_message)
        phase = "Progressing"
    elif lagging:
        reason = "InsufficientCapacity" if capacity else "PodsNotReady"
        message = "; ".join(capacity or lagging)
        put(READY, False, reason, message)
        put(PROGRESSING, True, "Updating", message)
        put(DEGRADED, bool(capacity), "InsufficientCapacity" if capacity else "AsExpected", message)
        phase = ("Degraded" if ready else "Pending") if capacity else "Progressing"
    else:
        message = f"{ready}/{desired} replicas ready"
        put(READY, True, "AllReplicasReady", message)
        put(PROGRESSING, False, "Stable", message)
        put(DEGRADED, False, "AsExpected", message)
        phase = "Ready"
    return KimiK3DeploymentStatus(
        observed_generation=generation,
        phase=phase,  # type: ignore[arg-type]
        conditions=conditions,
        pools=pools,
        endpoint=entry_endpoint(pools),
        engine=engine_status(plan),
        ready_summary=f"{ready}/{desired}",
        gpus=plan.gpus,
        weights=weights.sources if weights else [],
    )


def transitions(previous: KimiK3DeploymentStatus | None, status: KimiK3DeploymentStatus) -> list[tuple[str, str, str]]:
    """(event type, reason, message) for every condition whose status or reason changed: the
    Kubernetes events worth posting. A pass that changes only counts or messages posts none."""
    before = {c.type: (c.status, c.reason) for c in (previous.conditions if previous else [])}
    out = []
    for c in status.conditions:
        if before.get(c.type) == (c.status, c.reason):
            continue
        bad = (c.type == DEGRADED and c.status == "True") or (c.type == READY and status.phase == "Failed")
        if c.type == PROGRESSING and any(o.type == READY and o.reason == c.reason for o in status.conditions):
            continue  # says what the Ready event says
        if c.type == DEGRADED and c.status == "False" and before.get(c.type, ("False",))[0] == "False":
            continue  # "not degraded" is news only when it was
        out.append(("Warning" if bad else "Normal", c.reason, f"{c.type}={c.status}: {c.message}"))
    return out
