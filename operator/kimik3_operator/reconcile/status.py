"""Status as a pure function of the deployment, its plan and its live children.

Conditions follow metav1.Condition: `lastTransitionTime` moves only when a condition's status
flips, and the caller writes the status only when the computed one differs from the stored one.
Which phase and conditions a pass shows is one table (SITUATIONS), first match wins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..api import Condition, KimiK3DeploymentStatus, PoolStatus, RoleStatus
from ..api.reasons import (
    ADMITTED,
    ALL_REPLICAS_READY,
    AS_EXPECTED,
    DECODE_RECOMPUTES_PROMPTS,
    INSUFFICIENT_CAPACITY,
    INVALID_SPEC,
    KUEUE_MISSING,
    NO_KV_TRANSFERS,
    PODS_NOT_READY,
    ROUTER_NOT_READY,
    STABLE,
    UNSCHEDULABLE,
    UPDATING,
    WEIGHTS_FAILED,
    WEIGHTS_STAGING,
)
from ..api.status import EngineStatus, RoleAutoscalingStatus, RouterStatus
from ..metrics import DEPLOYMENT_SERIES
from ..planner import Plan, PlanningError
from ..planner.disaggregation import Verdict
from ..planner.queueing import Admission
from ..render import RoleEndpoints
from ..render.names import Owner, workload_name
from ..render.plan_fields import pool_fields, role_fields, router_fields
from ..render.router import RouterTargets, router_targets, router_url
from ..render.services import service_url
from .failing import Failure
from .weights_status import WeightsState

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
"""True when the deployment cannot reach what the spec asks without someone acting (a spec the
planner refuses, nodes without room, a staging Job that gave up); what already runs keeps running."""
DISAGGREGATING = "Disaggregating"
"""P/D deployments only: whether the decode engines receive their prompts' KV from prefill or
recompute it (planner/disaggregation.py); measured, not derived from the children."""
ADMITTED_CONDITION = ADMITTED
"""Deployments with a queued role only: whether Kueue admitted every group, else Kueue's reason for
the first that waits (planner/queueing.py). Named after Kueue's own Workload condition, as is its
True reason."""


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


def role_statuses(owner: Owner, plan: Plan, workloads: Mapping[str, Mapping[str, Any]],
                  autoscaling: Mapping[tuple[str, str], RoleAutoscalingStatus] | None = None,
                  waiting: Mapping[str, int] | None = None) -> list[PoolStatus]:
    """The plan's facts (the keys `kimik3 plan -o json` shows, the planned replicas among them)
    with the counts the workloads report, as they report them: a LeaderWorkerSet running groups
    beyond the plan (scaled by hand, a surge) shows more ready than planned."""
    pools = []
    for pool in plan.pools:
        roles = []
        for role in pool.roles:
            name = workload_name(owner, pool.name, role.role)
            live = (workloads.get(name) or {}).get("status") or {}
            roles.append(RoleStatus(
                **role_fields(role),
                block_size=role.block_size,
                ready_replicas=int(live.get("readyReplicas") or 0),
                updated_replicas=int(live.get("updatedReplicas") or 0),
                queued_replicas=(waiting or {}).get(name, 0),
                workload=name,
                endpoint=service_url(owner, pool.name, role.role),
                autoscaling=(autoscaling or {}).get((pool.name, role.role)),
            ))
        pools.append(PoolStatus(**pool_fields(pool), roles=roles))
    return pools


def role_lag(pool: str, role: RoleStatus, live: Mapping[str, Any]) -> str | None:
    """Why a role does not run as planned, or None when it does: its LeaderWorkerSet (`live`)
    reports, on its current generation, exactly the planned replicas ready and updated, and asks
    for no other count. Otherwise the role is not Ready, whatever the counts: groups still
    starting or rolling, groups beyond the plan still running (a surge; a scale-down, as after a
    write through /scale was taken back), a spec.replicas someone else set that no pass took back
    yet (a pass re-applies it, except to what serves while a new revision stages), or counts of
    an older generation, which say nothing about what the current spec runs."""
    planned, status = role.replicas, live.get("status") or {}
    generation = int((live.get("metadata") or {}).get("generation") or 0)
    asked = (live.get("spec") or {}).get("replicas")
    groups = int(status.get("replicas") or 0)
    notes = [note for wrong, note in (
        (asked is not None and int(asked) != planned, f"spec.replicas {asked}, planned {planned}"),
        (groups > planned, f"{groups} groups running"),
        (int(status.get("observedGeneration") or 0) < generation, f"generation {generation} not observed yet"),
    ) if wrong]
    if not notes and role.ready_replicas == planned and role.updated_replicas == planned:
        return None
    return ", ".join([f"pool {pool} role {role.role}: {role.ready_replicas}/{planned} ready, "
                      f"{role.updated_replicas} updated", *notes])


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
    """Where clients go without a router (spec.router.replicas 0): the first aggregated role, else
    the first decode role (which then prefills every prompt itself)."""
    for wanted in ("aggregated", "decode"):
        for pool in pools:
            for role in pool.roles:
                if role.role == wanted:
                    return role.endpoint
    return None


def _router_status(owner: Owner, targets: RouterTargets, endpoints: Sequence[RoleEndpoints],
                   live: Mapping[str, Any]) -> tuple[RouterStatus, str | None]:
    """A router Deployment's status, and why it does not serve as rendered yet (None when it does)."""
    status = live.get("status") or {}
    desired = targets.replicas
    ready = min(int(status.get("readyReplicas") or 0), desired)
    # Counts of an older generation say nothing about the new pods.
    observed = int(status.get("observedGeneration") or 0) >= int((live.get("metadata") or {}).get("generation") or 0)
    updated = int(status.get("updatedReplicas") or 0) if observed else 0
    found = {role: len({a for e in endpoints if e.role == role and (e.pool, e.role) in targets.plan.routes
                        and (targets.compat_hash is None or e.compat_hash == targets.compat_hash)
                        for a in e.addresses}) for role in targets.plan.roles}
    out = RouterStatus(
        **router_fields(targets.plan), name=targets.deployment, service=targets.name,
        endpoint=router_url(owner, targets.name), replicas=desired, ready_replicas=ready,
        compatibility_hash=targets.compat_hash, **{f"{role}_workers": n for role, n in found.items()})
    if missing := [role for role, n in found.items() if not n]:
        revision = f" of compatibility hash {targets.compat_hash}" if targets.compat_hash else ""
        return out, f"router {targets.deployment}: no routable {' or '.join(missing)} leader{revision}"
    done = observed and updated >= desired and ready >= desired and int(status.get("replicas") or 0) <= desired
    return out, None if done else f"router {targets.deployment}: {ready}/{desired} ready, {updated} updated"


def router_statuses(owner: Owner, plan: Plan, endpoints: Sequence[RoleEndpoints], pairs: Mapping[str, int],
                    routers: Mapping[str, Mapping[str, Any]]) -> tuple[list[RouterStatus], list[str]]:
    """Each router Deployment's status, and a line for each one of the plan's own revision (or
    the aggregated router) that does not serve as rendered yet: an old revision's router without
    a pair is on its way out, not a reason to call the deployment unready."""
    out = [(t, *_router_status(owner, t, endpoints, routers.get(t.deployment) or {}))
           for t in router_targets(owner, plan, pairs)]
    return ([status for _, status, _ in out],
            [why for t, _, why in out if why and t.compat_hash in (None, plan.compat_hash)])


def routable_capacity(plan: Plan, endpoints: Sequence[RoleEndpoints], pairs: Mapping[str, int]) -> int | None:
    """Per role, the routable leaders some router sends requests to (for prefill and decode: of a
    revision that has a pair) over its planned replicas; the fewest over the roles, in percent.
    None without a router or a role."""
    if not plan.routers:
        return None
    routed: dict[tuple[str, str], int] = {(p.name, r.role): 0 for p, r in plan.role_plans()}
    for e in endpoints:
        if (e.pool, e.role) in routed and (e.role == "aggregated" or pairs.get(e.compat_hash or "", 0) > 0):
            routed[(e.pool, e.role)] += len(e.addresses)
    planned: dict[tuple[str, str], int] = {(p.name, r.role): r.replicas for p, r in plan.role_plans()}
    shares = [100 * n // planned[key] for key, n in routed.items() if planned[key] > 0]
    return min(shares) if shares else None


def without_router(plan: Plan, endpoint: str | None) -> str | None:
    """What clients reach when no router is rendered, and what that costs."""
    if plan.routers:
        return None
    split = any(role.role != "aggregated" for _, role in plan.role_plans())
    return (f"no router (spec.router.replicas is 0): clients reach {endpoint} directly"
            + ("; prefill and decode do not disaggregate without the router (a decode engine prefills every "
               "prompt itself and the prefill roles idle)" if split else ""))


@dataclass(frozen=True)
class Seen:
    """What one pass saw of a planned deployment, as the SITUATIONS table reads it."""

    ready: int
    desired: int
    lagging: list[str]
    """Roles that do not run as planned (`role_lag`), one line each."""
    short: list[str]
    """Capacity shortfalls: why lagging pods find no room."""
    serving: bool
    """Workloads exist: what serves keeps serving while a new revision stages."""
    weights: WeightsState | None
    routing: list[str] = field(default_factory=list)
    """Routers that do not serve as rendered yet, one line each."""
    held_back: list[str] = field(default_factory=list)
    """Autoscaled roles whose scaler wants more replicas than the pool's free GPUs hold."""
    failures: Sequence[Failure] = ()
    """Replicas and router pods that fail (reconcile/failing.py), not start, roll or scale."""
    rolling: bool = False
    """A role's workload is being updated or scaled (its generation, count or updated replicas lag)."""

    @property
    def failing(self) -> bool:
        """Replicas fail for a reason of their own: not a replacement that finds no room, which the
        capacity rows explain with the numbers (InsufficientCapacity)."""
        return bool(self.failures) and not (self.short and all(f.reason == UNSCHEDULABLE for f in self.failures))

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


def _held_back(s: Seen) -> str:
    return f"{_counts(s)}; " + "; ".join(s.held_back)


def _lagging(s: Seen) -> str:
    return "; ".join(s.lagging)


def _routing(s: Seen) -> str:
    return "; ".join(s.routing)


def _failing(s: Seen) -> str:
    return "; ".join(f.line() for f in s.failures)


def _failure(s: Seen) -> str:
    return s.failures[0].reason


Said = tuple[bool, str | Callable[[Seen], str], Callable[[Seen], str]]
"""A condition as a situation states it: status, reason (or how to name it), message."""


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
    # A replica or router pod fails with no change asked for (a crash, an OOM, an image, a hang):
    # Progressing only while a rollout or scaling goes on beside it.
    Situation(lambda s: s.failing and bool(s.lagging) and s.rolling, "Degraded",
              (False, _failure, _failing), (True, UPDATING, _lagging), (True, _failure, _failing)),
    Situation(lambda s: s.failing and bool(s.lagging or s.routing), "Degraded",
              (False, _failure, _failing), (False, _failure, _failing), (True, _failure, _failing)),
    Situation(lambda s: s.failing, "Degraded",
              (True, ALL_REPLICAS_READY, _counts), (False, _failure, _failing), (True, _failure, _failing)),
    # Every engine serves, but the router in front (the one endpoint) does not yet.
    Situation(lambda s: bool(s.routing) and s.serving and not s.lagging, "Progressing",
              (False, ROUTER_NOT_READY, _routing), (True, ROUTER_NOT_READY, _routing), (False, AS_EXPECTED, _routing)),
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
    # Everything asked for serves, but a scaler wants more than the nodes hold: serving, short of its targets.
    Situation(lambda s: bool(s.held_back), "Degraded",
              (True, ALL_REPLICAS_READY, _held_back), (False, INSUFFICIENT_CAPACITY, _held_back),
              (True, INSUFFICIENT_CAPACITY, _held_back)),
    Situation(lambda s: True, "Ready",
              (True, ALL_REPLICAS_READY, _counts), (False, STABLE, _counts), (False, AS_EXPECTED, _counts)),
)
"""Phase and conditions of a planned deployment: the first situation whose `when` holds. A new
situation (or reason) is a row here; a new condition type a field of Situation, set in every row."""


def compute_status(*, owner: Owner, generation: int, previous: KimiK3DeploymentStatus | None,
                   plan: Plan | None, error: PlanningError | None,
                   workloads: Mapping[str, Mapping[str, Any]], now: str,
                   capacity: list[str] | None = None, weights: WeightsState | None = None,
                   endpoints: Sequence[RoleEndpoints] = (), pairs: Mapping[str, int] | None = None,
                   routers: Mapping[str, Mapping[str, Any]] | None = None,
                   autoscaling: Mapping[tuple[str, str], RoleAutoscalingStatus] | None = None,
                   disaggregating: Verdict | None = None, admission: Admission | None = None,
                   failures: Sequence[Failure] = (),
                   ) -> KimiK3DeploymentStatus:
    """The status to store. `error` (a spec or planning problem) wins over `plan`; replicas that
    are not ready while the nodes lack room for them (`capacity` shortfalls) say so; until the
    checkpoints are staged (`weights`) nothing new serves and the conditions say how far it got;
    the routers (live Deployments by name) find the `endpoints` (routable leaders of every revision,
    `pairs` per revision) and are ready, or it is not Ready. `disaggregating` is the measured
    verdict of a P/D deployment, `admission` Kueue's of the queued roles; without one its condition goes.
    `failures` are the replicas and router pods that fail (reconcile/failing.py): Degraded says why."""
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
        return _exported(owner, (previous or KimiK3DeploymentStatus()).model_copy(update={
            "observed_generation": generation, "phase": "Failed", "conditions": conditions,
            "reason": _headline(conditions)}))
    pools = role_statuses(owner, plan, workloads, autoscaling, admission.waiting if admission else None)
    roles = [(p.name, r) for p in pools for r in p.roles]
    statuses, routing = router_statuses(owner, plan, endpoints, pairs or {}, routers or {})
    endpoint = statuses[0].endpoint if statuses else entry_endpoint(pools)
    seen = Seen(
        ready=sum(r.ready_replicas for _, r in roles), desired=sum(r.replicas for _, r in roles),
        lagging=[lag for p, r in roles if (lag := role_lag(p, r, workloads.get(r.workload or "") or {}))],
        short=capacity or [], serving=bool(workloads), weights=weights, routing=routing,
        held_back=[f"pool {pool} role {role}: {a.capacity_limited}"
                   for (pool, role), a in sorted((autoscaling or {}).items()) if a.capacity_limited],
        failures=failures, rolling=any(_rolling(r, workloads.get(r.workload or "") or {}) for _, r in roles))
    situation = next(s for s in SITUATIONS if s.when(seen))
    for type_, (ok, named, describe) in situation.conditions().items():
        put(type_, ok, named if isinstance(named, str) else named(seen), describe(seen))
    measured = ((DISAGGREGATING, disaggregating), (ADMITTED_CONDITION, admission.verdict if admission else None))
    for type_, verdict in measured:
        if verdict is None:
            conditions = [c for c in conditions if c.type != type_]
        else:
            conditions = set_condition(conditions, Condition(
                type=type_, status=verdict.status, reason=verdict.reason,
                message=verdict.message, last_transition_time=now, observed_generation=generation))
    return _exported(owner, KimiK3DeploymentStatus(
        observed_generation=generation,
        phase=situation.phase,
        reason=_headline(conditions),
        conditions=conditions,
        pools=pools,
        endpoint=endpoint,
        routers=statuses,
        routable_capacity_percent=routable_capacity(plan, endpoints, pairs or {}),
        routing=without_router(plan, endpoint),
        engine=engine_status(plan),
        ready_summary=f"{seen.ready}/{seen.desired}",
        gpus=plan.gpus,
        weights=weights.sources if weights else [],
    ))


def _headline(conditions: Sequence[Condition]) -> str | None:
    """Degraded's reason while it is True, else Ready's (the status's `reason`, a printer column)."""
    by_type = {c.type: c for c in conditions}
    degraded, ready = by_type.get(DEGRADED), by_type.get(READY)
    if degraded is not None and degraded.status == "True":
        return degraded.reason
    return ready.reason if ready is not None else None


def _rolling(role: RoleStatus, live: Mapping[str, Any]) -> bool:
    """The role's workload is being updated or scaled: it asks for another count than planned, runs
    other groups than planned, has not observed its generation, or has groups not updated yet."""
    status, spec = live.get("status") or {}, live.get("spec") or {}
    generation = int((live.get("metadata") or {}).get("generation") or 0)
    return (spec.get("replicas") is not None and int(spec["replicas"]) != role.replicas
            or int(status.get("replicas") or 0) != role.replicas
            or int(status.get("observedGeneration") or 0) < generation
            or int(status.get("updatedReplicas") or 0) < role.replicas)


def _exported(owner: Owner, status: KimiK3DeploymentStatus) -> KimiK3DeploymentStatus:
    """`status`, also exported as the deployment's metrics (metrics.DEPLOYMENT_SERIES): every pass
    computes it, whether it is written or not, so the series are there after a restart too."""
    DEPLOYMENT_SERIES.record(owner.namespace, owner.name, status)
    return status


def transitions(previous: KimiK3DeploymentStatus | None, status: KimiK3DeploymentStatus) -> list[tuple[str, str, str]]:
    """The Kubernetes events worth posting for a status write, as (type, reason, message): one at
    most for the situation, for the condition that tells most of those whose status or reason
    changed (a deployment turning Degraded, else Ready, else no longer Degraded, else Progressing),
    and one when Disaggregating turns. The conditions of one situation move together (SITUATIONS):
    an event each said the same news three ways, and a bring-up cost six events where four tell its
    story. A pass that changes only counts or messages posts none."""
    before = {c.type: (c.status, c.reason) for c in (previous.conditions if previous else [])}
    changed = {c.type: c for c in status.conditions if before.get(c.type) != (c.status, c.reason)}
    return (_situation_event(status, before, changed) + _disaggregation_event(changed.get(DISAGGREGATING))
            + _admission_event(changed.get(ADMITTED_CONDITION)))


def _disaggregation_event(turned: Condition | None) -> list[tuple[str, str, str]]:
    """Disaggregating moves on its own (measured, not one of the SITUATIONS): its turns are news of
    their own, a warning when decode recomputes prompts."""
    if turned is None:
        return []
    bad = turned.status == "False" and turned.reason in (DECODE_RECOMPUTES_PROMPTS, NO_KV_TRANSFERS)
    return [("Warning" if bad else "Normal", turned.reason, f"{turned.type}={turned.status}: {turned.message}")]


def _admission_event(turned: Condition | None) -> list[tuple[str, str, str]]:
    """Admitted moves with Kueue, not with the SITUATIONS: a group that starts or stops waiting is
    news of its own (Normal: waiting for quota is what a queue is for; so is a group without a
    Workload for the moment Kueue takes to make one), a warning when no queue can admit the groups."""
    if turned is None:
        return []
    bad = turned.reason == KUEUE_MISSING
    return [("Warning" if bad else "Normal", turned.reason, f"{turned.type}={turned.status}: {turned.message}")]


def _situation_event(status: KimiK3DeploymentStatus, before: Mapping[str, tuple[str, str]],
                     changed: Mapping[str, Condition]) -> list[tuple[str, str, str]]:
    degraded = changed.get(DEGRADED)
    was_degraded = before.get(DEGRADED, ("False",))[0] == "True"
    for c in (degraded if degraded is not None and degraded.status == "True" else None,
              changed.get(READY),
              degraded if degraded is not None and was_degraded else None,  # "not degraded" is news only when it was
              changed.get(PROGRESSING)):
        if c is not None:
            bad = c.type == DEGRADED and c.status == "True" or (c.type == READY and status.phase == "Failed")
            return [("Warning" if bad else "Normal", c.reason, f"{c.type}={c.status}: {c.message}")]
    return []
