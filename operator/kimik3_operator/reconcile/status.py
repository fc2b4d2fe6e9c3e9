"""Status as a pure function of the deployment, its plan and its live children.

Conditions follow metav1.Condition: `lastTransitionTime` moves only when a condition's status
flips, and the caller writes the status only when the computed one differs from the stored one.
Which phase and conditions a pass shows is one table (SITUATIONS), first match wins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..api import Condition, KimiK3DeploymentStatus, PoolStatus, RoleStatus
from ..api.reasons import (
    ALL_REPLICAS_READY,
    AS_EXPECTED,
    INSUFFICIENT_CAPACITY,
    INVALID_SPEC,
    PODS_NOT_READY,
    STABLE,
    UPDATING,
    WEIGHTS_FAILED,
    WEIGHTS_STAGING,
)
from ..api.v1alpha1 import EngineStatus
from ..planner import Plan, PlanningError
from ..render.names import Owner, workload_name
from ..render.plan_fields import pool_fields, role_fields
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
    """The plan's facts (the keys `kimik3 plan -o json` shows) with what the workloads report."""
    pools = []
    for pool in plan.pools:
        roles = []
        for role in pool.roles:
            name = workload_name(owner, pool.name, role.role)
            live = (workloads.get(name) or {}).get("status") or {}
            roles.append(RoleStatus(
                **role_fields(role),
                block_size=role.block_size,
                ready_replicas=min(int(live.get("readyReplicas") or 0), role.replicas),
                updated_replicas=min(int(live.get("updatedReplicas") or 0), role.replicas),
                workload=name,
                endpoint=service_url(owner, pool.name, role.role),
            ))
        pools.append(PoolStatus(**pool_fields(pool), roles=roles))
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


@dataclass(frozen=True)
class Seen:
    """What one pass saw of a planned deployment, as the SITUATIONS table reads it."""

    ready: int
    desired: int
    lagging: list[str]
    """Roles whose replicas are not all ready and updated, one line each."""
    short: list[str]
    """Capacity shortfalls: why lagging pods find no room."""
    serving: bool
    """Workloads exist: what serves keeps serving while a new revision stages."""
    weights: WeightsState | None

    @property
    def weights_failed(self) -> bool:
        return bool(self.weights and self.weights.failed)

    @property
    def weights_staging(self) -> bool:
        return self.weights is not None and not self.weights.all_staged


def _counts(s: Seen) -> str:
    return f"{s.ready}/{s.desired} replicas ready"


def _weights(s: Seen) -> str:
    return s.weights.summary() if s.weights else ""


def _counts_and_weights(s: Seen) -> str:
    return f"{_counts(s)}; {_weights(s)}"


def _short(s: Seen) -> str:
    return "; ".join(s.short)


def _lagging(s: Seen) -> str:
    return "; ".join(s.lagging)


Said = tuple[bool, str, Callable[[Seen], str]]
"""A condition as a situation states it: status, reason, message."""


@dataclass(frozen=True)
class Situation:
    """One row: when it holds, the phase, and each condition's (status, reason, message)."""

    when: Callable[[Seen], bool]
    phase: str
    ready: Said
    progressing: Said
    degraded: Said

    def conditions(self) -> dict[str, Said]:
        return {READY: self.ready, PROGRESSING: self.progressing, DEGRADED: self.degraded}


SITUATIONS: tuple[Situation, ...] = (
    # A staging Job gave up: what serves keeps serving, nothing new will until someone acts.
    Situation(lambda s: s.weights_failed and s.ready > 0 and not s.lagging, "Degraded",
              (True, WEIGHTS_FAILED, _weights), (False, WEIGHTS_FAILED, _weights), (True, WEIGHTS_FAILED, _weights)),
    Situation(lambda s: s.weights_failed and s.ready > 0, "Degraded",
              (False, WEIGHTS_FAILED, _weights), (False, WEIGHTS_FAILED, _weights), (True, WEIGHTS_FAILED, _weights)),
    Situation(lambda s: s.weights_failed, "Failed",
              (False, WEIGHTS_FAILED, _weights), (False, WEIGHTS_FAILED, _weights), (True, WEIGHTS_FAILED, _weights)),
    # Checkpoints staging: a new revision stages beside the one serving, or nothing serves yet.
    Situation(lambda s: s.weights_staging and s.serving and not s.lagging, "Progressing",
              (True, ALL_REPLICAS_READY, _counts_and_weights), (True, WEIGHTS_STAGING, _weights),
              (False, AS_EXPECTED, _weights)),
    Situation(lambda s: s.weights_staging, "Progressing",
              (False, WEIGHTS_STAGING, _weights), (True, WEIGHTS_STAGING, _weights), (False, AS_EXPECTED, _weights)),
    # Replicas not ready: for want of room on the nodes, or still starting or rolling.
    Situation(lambda s: bool(s.lagging and s.short) and s.ready > 0, "Degraded",
              (False, INSUFFICIENT_CAPACITY, _short), (True, UPDATING, _short), (True, INSUFFICIENT_CAPACITY, _short)),
    Situation(lambda s: bool(s.lagging and s.short), "Pending",
              (False, INSUFFICIENT_CAPACITY, _short), (True, UPDATING, _short), (True, INSUFFICIENT_CAPACITY, _short)),
    Situation(lambda s: bool(s.lagging), "Progressing",
              (False, PODS_NOT_READY, _lagging), (True, UPDATING, _lagging), (False, AS_EXPECTED, _lagging)),
    Situation(lambda s: True, "Ready",
              (True, ALL_REPLICAS_READY, _counts), (False, STABLE, _counts), (False, AS_EXPECTED, _counts)),
)
"""Phase and conditions of a planned deployment: the first situation whose `when` holds. A new
situation (or reason) is a row here; a new condition type a field of Situation, set in every row."""


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
        reason = error.reason if error else INVALID_SPEC
        message = error.message if error else "the deployment could not be planned"
        put(READY, False, reason, message)
        put(PROGRESSING, False, reason, message)
        put(DEGRADED, True, reason, message)
        # The last known plan facts stay visible: what runs is still what was last planned.
        return (previous or KimiK3DeploymentStatus()).model_copy(update={
            "observed_generation": generation, "phase": "Failed", "conditions": conditions})
    pools = role_statuses(owner, plan, workloads)
    roles = [(p.name, r) for p in pools for r in p.roles]
    seen = Seen(
        ready=sum(r.ready_replicas for _, r in roles), desired=sum(r.replicas for _, r in roles),
        lagging=[f"pool {p} role {r.role}: {r.ready_replicas}/{r.replicas} ready, {r.updated_replicas} updated"
                 for p, r in roles if r.ready_replicas < r.replicas or r.updated_replicas < r.replicas],
        short=capacity or [], serving=bool(workloads), weights=weights)
    situation = next(s for s in SITUATIONS if s.when(seen))
    for type_, (ok, reason, describe) in situation.conditions().items():
        put(type_, ok, reason, describe(seen))
    return KimiK3DeploymentStatus(
        observed_generation=generation,
        phase=situation.phase,
        conditions=conditions,
        pools=pools,
        endpoint=entry_endpoint(pools),
        engine=engine_status(plan),
        ready_summary=f"{seen.ready}/{seen.desired}",
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
