"""One reconcile pass, in named stages over one context (Pass): observe -> plan -> apply -> prune -> status
(written on change); a problem in plan or apply ends the pass in fail.

Every trigger (create, spec update, resume, a child's event, the periodic resync) runs this
same level-based function, so the result depends only on what is in the cluster now.
A spec that cannot be planned changes nothing that runs: its children stay as they were and
only the status says why.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from ..api import KimiK3Deployment, KimiK3DeploymentStatus, ObjectMeta, first_error
from ..api.reasons import (
    APPLY_REJECTED,
    CHAT_TEMPLATE_INVALID,
    GROUP_RESTARTED,
    INVALID_SPEC,
    MISSING_DEPENDENCY,
    NO_MATCHING_NODES,
)
from ..contract.kinds import BY_KIND, CONFIG_MAP, DEPLOYMENT, JOB, LEADER_WORKER_SET, SERVICE, WEIGHTS
from ..contract.names import ANNOTATION_HASH
from ..k8s import Cluster, MissingApiError, RejectedApiError
from ..k8s.cache import Observation, deployment_mark
from ..planner import Plan, PlanningError, plan_deployment, with_staged
from ..planner.capacity import shortfalls
from ..planner.chat_template import problem as chat_template_problem
from ..planner.facts import PoolFacts
from ..planner.images import OPERATOR_IMAGE, PROJECT_ROUTER_IMAGES, RouterImages
from ..render import Owner, RoleEndpoints, render_routers, render_serving, render_weights
from ..render.names import LABEL_COMPAT, LABEL_POOL, deployment_label, workload_name
from .autoscaler import SloScaler, autoscaling_statuses, hand_over, previous_autoscaling, with_live_counts
from .disaggregation import DisaggregationProbe
from .failing import Failure, FailureMemory, failing
from .pairing import leader_endpoints, revision_pairs, serving_hash
from .pass_memo import PassMemo
from .queueing import QueueProbe, queued_roles, recheck_seconds
from .rollout import ROLLOUT_POLL_SECONDS, OldGroups, old_groups, old_routers, partitions, router_weights
from .scale_in import RESTART_GRACE_SECONDS, restarts
from .status import compute_status, transitions
from .status_pace import StatusPace
from .weights_status import WeightsState, weights_state

COMPONENT_LABEL = "app.kubernetes.io/component"

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What one pass did; handlers turn `error` into kopf's retry semantics."""

    applied: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    status_written: bool = False
    events: list[str] = field(default_factory=list)
    phase: str | None = None
    """The phase the status shows after this pass (written or not)."""
    error: PlanningError | None = None
    due: float | None = None
    """Seconds until a pass should run again: when the status this pass held back may be written
    (status_pace.py), or sooner while a rollout waits for old routers to drain (no child event tells
    when their pods are gone)."""


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid and ref.get("controller")
               for ref in obj["metadata"].get("ownerReferences") or [])


@dataclass
class Pass:
    """One pass's context: its inputs, what each stage finds for the next, and its Outcome.

    Inputs: the deployment, the cluster, and the long-lived helpers a caller may hand in. `body` when
    the caller holds a fresher copy than the cache; `memo` what earlier passes worked out (node facts,
    GPU usage, plans); `pace` when this deployment's status was last written (without it every change
    is written at once); `probe` what measures whether a P/D deployment that serves disaggregates (no
    Disaggregating condition without it); `queues` what reads Kueue's Workloads of queued roles (read
    on every pass without it); `scaler` the SLO autoscaler; `failure_memory` what earlier passes saw
    Ready (without it a hung engine reads as starting)."""

    cluster: Cluster
    namespace: str
    name: str
    now: Callable[[], str] = utc_now
    tools_image: str = OPERATOR_IMAGE
    router_images: RouterImages = PROJECT_ROUTER_IMAGES
    scaler: SloScaler | None = None
    body: dict[str, Any] | None = None
    memo: PassMemo = field(default_factory=PassMemo)
    pace: StatusPace | None = None
    probe: DisaggregationProbe | None = None
    queues: QueueProbe = field(default_factory=QueueProbe)
    failure_memory: FailureMemory = field(default_factory=FailureMemory)
    """Which replica slots were Ready, and the failures last seen on them (reconcile/failing.py)."""
    outcome: Outcome = field(default_factory=Outcome)

    # observe
    seen: Observation = field(default_factory=lambda: Observation(deployment=None))
    owner: Owner = field(default_factory=lambda: Owner(name="", namespace="", uid=""))
    generation: int = 0
    previous: KimiK3DeploymentStatus | None = None
    # plan
    cr: KimiK3Deployment | None = None
    facts: dict[str, PoolFacts] = field(default_factory=dict)
    own_pods: list[dict[str, Any]] = field(default_factory=list)
    plan: Plan | None = None
    # apply
    live: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    current: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    wanted: set[tuple[str, str]] = field(default_factory=set)
    held: dict[tuple[str, str], int] = field(default_factory=dict)
    old: dict[tuple[str, str], OldGroups] = field(default_factory=dict)
    """Each rolling role's old groups, and which of them are broken (reconcile/rollout.py)."""
    weights: WeightsState | None = None
    endpoints: Sequence[RoleEndpoints] = ()
    pairs: dict[str, int] = field(default_factory=dict)

    @property
    def planned(self) -> Plan:
        """The plan, once the plan stage has run."""
        assert self.plan is not None, "the plan stage has not run"
        return self.plan


def reconcile(p: Pass) -> Outcome:
    """One pass over deployment `p.name`: observe, plan, apply, prune, status. A planning or apply
    problem ends the pass with a status that says why (fail), and changes nothing that runs."""
    if not observe(p):
        return p.outcome  # gone or going: garbage collection removes the children
    try:
        plan(p)
        apply(p)
    except PlanningError as error:
        fail(p, error)
        return p.outcome
    prune(p)
    status(p)
    return p.outcome


def observe(p: Pass) -> bool:
    """Read everything the pass needs, once; False when the deployment is gone or going."""
    mine = deployment_label(Owner(name=p.name, namespace=p.namespace, uid=""))  # what its children carry
    p.seen = p.cluster.observe(p.namespace, p.name, mine, p.body)
    body = p.seen.deployment
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return False
    meta = ObjectMeta.model_validate(body["metadata"])
    p.owner, p.generation = Owner(name=meta.name, namespace=meta.namespace, uid=meta.uid), meta.generation
    p.previous = _previous_status(body)
    p.live = {_key(o): o for o in p.seen.children}
    p.own_pods = [o for o in p.seen.pods if (o.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
    return True


def plan(p: Pass) -> None:
    """The spec, validated and planned over the nodes' facts (remembered while neither changes)."""
    seen, memo = p.seen, p.memo
    assert seen.deployment is not None
    prometheus_url = p.scaler.prometheus_url if p.scaler else None
    plan_key = ((p.owner.uid, p.generation, seen.nodes_revision, prometheus_url)
                if p.owner.uid and p.generation and seen.nodes_revision is not None else None)
    if (known := memo.plans.get(plan_key)) is None:
        try:
            p.cr = KimiK3Deployment.model_validate(seen.deployment)
        except ValidationError as exc:
            raise PlanningError(INVALID_SPEC, first_error(exc)) from None
    else:
        p.cr = known[0]
    p.facts = {pool.name: memo.facts.pool(pool.node_selector, seen.nodes, seen.nodes_revision)
               for pool in p.cr.spec.pools}
    _check_not_stranded(p.cr, p.facts, p.own_pods)
    if known is None:
        p.plan = plan_deployment(p.cr.spec, p.facts, prometheus_url=prometheus_url, router_images=p.router_images)
        memo.plans.put(plan_key, p.cr, p.plan)
    else:
        p.plan = known[1]


def apply(p: Pass) -> None:
    """Apply the children: the weights first (nothing new serves until its checkpoints are staged at a
    known commit), then the serving workloads and routers, or, while a revision stages, only the
    routers of what serves. An API the cluster lacks or refuses is a planning problem of its own."""
    try:
        _apply_children(p)
    except MissingApiError as exc:
        hint = BY_KIND[exc.kind].missing_hint
        raise PlanningError(MISSING_DEPENDENCY, f"{exc}: {hint}" if hint else str(exc), depends_on_nodes=True) from None
    except RejectedApiError as exc:
        raise PlanningError(APPLY_REJECTED, f"the API server refused {exc.kind} {exc.name}: {exc.message}") from None


def _apply_children(p: Pass) -> None:
    owner, live, own_pods = p.owner, p.live, p.own_pods
    plan = p.planned
    desired = render_weights(owner, plan, p.tools_image)
    _apply_all(p, desired)
    jobs = {n: o for (k, n), o in p.current.items() if k == JOB.kind}
    progress = {n: o for (k, n), o in p.current.items() if k == CONFIG_MAP.kind}
    job_pods = [o for o in p.seen.pods if (o["metadata"].get("labels") or {}).get(COMPONENT_LABEL) == "weights"]
    p.weights = weights = weights_state(owner, plan.weights, jobs, job_pods, progress,
                                        p.previous.weights if p.previous else ())
    p.wanted = {_key(o) for o in desired}
    p.plan = plan = with_staged(plan, weights.commits) if weights.all_staged else plan
    paired = serving_hash(plan, own_pods, _selected_hashes(live))
    p.endpoints = leader_endpoints(plan, own_pods)
    p.pairs = revision_pairs(plan, own_pods)
    if not weights.all_staged:
        # What serves now keeps serving (a new revision stages into a folder of its own), and its
        # routers keep following the leaders that serve.
        p.wanted |= {k for k in live if BY_KIND[k[0]].stage != WEIGHTS}
        _apply_all(p, [o for o in render_routers(owner, plan, p.pairs) if _key(o) in live])
        return
    lws = {n: o for (k, n), o in live.items() if k == LEADER_WORKER_SET.kind}
    # each role's count as this pass applies it (an autoscaled role's: its scaler's)
    counted = with_live_counts(owner, plan, lws)
    replicas: dict[tuple[str, str], int] = {(pool.name, r.role): r.replicas for pool, r in counted.role_plans()}
    failures = _failures(p, counted)
    p.old = old_groups(own_pods, failures, replicas)
    p.held = partitions(plan, own_pods, replicas, p.old)
    serving = render_serving(owner, plan, paired, router_weights(plan, own_pods, replicas, p.pairs, p.old), p.held,
                             {key: n for key, old in p.old.items() if (n := old.allowance())})
    if p.held and old_routers(plan, own_pods):
        p.outcome.due = ROLLOUT_POLL_SECONDS
    if (problem := _chat_template_problem(p.cluster, plan, serving, live)) is not None:
        raise problem
    hand_over(p.cluster, owner, plan, lws, serving)
    _apply_all(p, serving)
    p.wanted |= {_key(o) for o in serving}
    _restart_for_scale_in(p, counted, failures)


def _restart_for_scale_in(p: Pass, counted: Plan, failures: list[Failure]) -> None:
    """Restart each failing group a scale-in keeps (reconcile/scale_in.py), once, saying so."""
    key = (p.namespace, p.name)
    counts = {workload_name(p.owner, pool.name, role.role): role.replicas for pool, role in counted.role_plans()}
    for restart in restarts(p.failure_memory.fallen(key, counts), failures, p.own_pods):
        pod = str(restart.pod["metadata"]["name"])
        p.cluster.delete({**restart.pod, "apiVersion": "v1", "kind": "Pod"}, RESTART_GRACE_SECONDS)
        p.failure_memory.note_restart(key, restart.failure, restart.note())
        p.cluster.post_event(p.owner.reference(), p.namespace, "Normal", GROUP_RESTARTED,
                             f"group {restart.slot[1]} of {restart.slot[0]} (leader pod {pod}) failed and was "
                             f"{restart.note()}")


def prune(p: Pass) -> None:
    """Delete what this deployment owns and no longer wants (kinds that are pruned at all)."""
    for key, obj in p.live.items():
        if key not in p.wanted and _owned_by(obj, p.owner.uid) and BY_KIND[key[0]].pruned:
            p.cluster.delete(obj)
            p.outcome.deleted.append("/".join(key))


def status(p: Pass) -> None:
    """The status of what now runs: live counts, Kueue's admission, the SLO scaler's step, and the
    conditions; written only when it changed (and when the pace allows)."""
    owner, namespace, name, plan = p.owner, p.namespace, p.name, p.planned
    used = p.memo.usage.used_except(p.seen.active_pods, p.seen.active_pods_revision, deployment_mark,
                                    (namespace, deployment_label(owner)))
    kept = {k: o for k, o in {**p.live, **p.current}.items() if k in p.wanted}
    workloads: dict[str, Mapping[str, Any]] = {n: o for (k, n), o in kept.items() if k == LEADER_WORKER_SET.kind}
    plan = with_live_counts(owner, plan, workloads)
    admission = p.queues.admission(p.cluster, owner, queued_roles(owner, plan, workloads))
    waiting = admission.waiting if admission else {}
    if admission and (again := recheck_seconds(admission)) is not None:
        p.outcome.due = min(again, p.outcome.due or again)
    scaling = previous_autoscaling(p.previous)
    pace = p.pace
    if p.scaler is not None and p.scaler.due((namespace, name), plan):
        scaling, rescaled = p.scaler.step(p.cluster, owner, plan, p.facts, used, workloads, scaling,
                                          owner.reference(), waiting)
        workloads = {**workloads, **rescaled}
        plan = with_live_counts(owner, plan, workloads)
        pace = None  # the scaler's memory (last scale, breach since) lives in the status: never held back
    scaling = autoscaling_statuses(owner, plan, scaling)
    failures = _what_is_done_said(p, _failures(p, plan))
    _write_status(p, pace, compute_status(
        owner=owner, generation=p.generation, previous=p.previous, plan=plan, error=None,
        workloads=workloads, now=p.now(), capacity=shortfalls(plan, p.facts, used, {k: plan.max_surge for k in p.held}),
        weights=p.weights, endpoints=p.endpoints, pairs=p.pairs,
        routers={n: o for (k, n), o in kept.items() if k == DEPLOYMENT.kind}, autoscaling=scaling,
        disaggregating=p.probe.verdict(owner, plan) if p.probe is not None and workloads else None,
        admission=admission, failures=failures))


def _failures(p: Pass, plan: Plan) -> list[Failure]:
    """The deployment's failing replicas and router pods now, with `plan`'s replica counts."""
    slots = {workload_name(p.owner, pool.name, role.role): (f"pool {pool.name} role {role.role}", role.replicas)
             for pool, role in plan.role_plans()}
    return failing(p.failure_memory, (p.namespace, p.name), p.seen.pods, slots)


def _what_is_done_said(p: Pass, failures: list[Failure]) -> list[Failure]:
    """`failures`, those of broken old groups that this pass's rollout replaces saying so, and those a
    scale-in restarted."""
    broken = {(workload_name(p.owner, *key), index) for key, old in p.old.items() for index in old.broken}
    said = {group: "the rollout replaces it, not waiting on it" for group in broken}
    said |= p.failure_memory.restart_notes((p.namespace, p.name), [f.group for f in failures if f.group])
    return [dataclasses.replace(f, detail=f"{f.detail}; {said[f.group]}") if f.group in said else f
            for f in failures]


def fail(p: Pass, error: PlanningError) -> None:
    """End the pass on a problem: only the status says why."""
    p.outcome.error = error
    _write_status(p, p.pace, compute_status(owner=p.owner, generation=p.generation, previous=p.previous,
                                            plan=None, error=error, workloads={}, now=p.now()))


def _chat_template_problem(cluster: Cluster, plan: Plan, serving: list[dict[str, Any]],
                           live: dict[tuple[str, str], dict[str, Any]]) -> PlanningError | None:
    """Why engines must not (re)start on engine.chatTemplate, checked when a LeaderWorkerSet is about
    to be created or changed: vLLM reads the template once, at start, and a broken one crash-loops
    every engine after minutes of loading. Between rolls the ConfigMap is not read (a pass costs no
    extra request); what runs keeps running on the template it started with.

    Not a planning error: the ConfigMap can be fixed without touching the spec, so the resync
    retries (depends_on_nodes)."""
    if plan.engine.chat_template is None:
        return None
    rolling = [o for o in serving if o["kind"] == LEADER_WORKER_SET.kind
               and ((live.get(_key(o)) or {}).get("metadata", {}).get("annotations") or {}).get(ANNOTATION_HASH)
               != o["metadata"]["annotations"][ANNOTATION_HASH]]
    if not rolling:
        return None
    name, key = plan.engine.chat_template
    found = cluster.read_config_map_key(rolling[0]["metadata"]["namespace"], name, key)
    message = chat_template_problem(plan.engine.chat_template, found.text, found.missing)
    return PlanningError(CHAT_TEMPLATE_INVALID, message, depends_on_nodes=True) if message else None


def _selected_hashes(live: dict[tuple[str, str], dict[str, Any]]) -> set[str]:
    """Compatibility hashes our Services select now (paired prefill/decode Services only)."""
    return {h for (kind, _), o in live.items() if kind == SERVICE.kind
            if (h := ((o.get("spec") or {}).get("selector") or {}).get(LABEL_COMPAT))}


def _apply_all(p: Pass, desired: list[dict[str, Any]]) -> None:
    for obj in desired:
        if BY_KIND[obj["kind"]].create_only and _key(obj) in p.live:
            p.current[_key(obj)] = p.live[_key(obj)]
            continue
        result = p.cluster.apply(obj, p.live.get(_key(obj)))
        p.current[_key(obj)] = result.obj
        if result.written:
            p.outcome.applied.append("/".join(_key(obj)))


def _check_not_stranded(cr: KimiK3Deployment, facts: dict[str, PoolFacts], own_pods: list[dict[str, Any]]) -> None:
    """A pool that selects no node any more (nodes deleted, relabelled or cordoned) while its pods
    still run on nodes is not re-planned: planned ahead of nodes it would lose what only the nodes
    tell (RDMA device, NVLink clique, GPU memory) and roll the serving pods onto nowhere. Its
    children stay as they are and the status says why until nodes match again."""
    for pool in cr.spec.pools:
        if facts[pool.name].nodes:
            continue
        hosts = sorted({p["spec"]["nodeName"] for p in own_pods
                        if (p["metadata"].get("labels") or {}).get(LABEL_POOL) == pool.name
                        and (p.get("spec") or {}).get("nodeName")})
        if hosts:
            raise PlanningError(
                NO_MATCHING_NODES,
                f"pool {pool.name}: no schedulable GPU node matches nodeSelector {dict(pool.node_selector)} "
                f"any more; its pods still run on {', '.join(hosts)} and are left as they are until "
                "nodes match again", depends_on_nodes=True)


def _previous_status(body: dict[str, Any]) -> KimiK3DeploymentStatus | None:
    raw = body.get("status")
    if not raw:
        return None
    try:
        return KimiK3DeploymentStatus.model_validate(raw)
    except ValidationError:
        return None  # written by something else: replace it wholesale


def _write_status(p: Pass, pace: StatusPace | None, status: KimiK3DeploymentStatus) -> None:
    owner, previous, outcome = p.owner, p.previous, p.outcome
    outcome.phase = status.phase
    if previous == status:
        return
    key = (owner.namespace, owner.name)
    if pace is not None and (wait := pace.wait(key, previous, status)) > 0:
        outcome.due = min(wait, outcome.due or wait)
        return
    p.cluster.apply_status(owner.namespace, owner.name, status.wire())
    if pace is not None:
        pace.wrote(key)
    outcome.status_written = True
    log.info("Updated status of %s/%s: phase %s", owner.namespace, owner.name, status.phase)
    for type_, reason, message in transitions(previous, status):
        p.cluster.post_event(owner.reference(), owner.namespace, type_, reason, message)
        outcome.events.append(reason)
