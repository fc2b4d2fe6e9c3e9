"""One reconcile pass: read -> plan -> render -> apply -> prune -> status (written on change).

Every trigger (create, spec update, resume, a child's event, the periodic resync) runs this
same level-based function, so the result depends only on what is in the cluster now.
A spec that cannot be planned changes nothing that runs: its children stay as they were and
only the status says why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from ..api import KimiK3Deployment, KimiK3DeploymentStatus, ObjectMeta, first_error
from ..api.reasons import APPLY_REJECTED, CHAT_TEMPLATE_INVALID, INVALID_SPEC, MISSING_DEPENDENCY, NO_MATCHING_NODES
from ..contract.kinds import BY_KIND, CONFIG_MAP, DEPLOYMENT, JOB, LEADER_WORKER_SET, SERVICE, WEIGHTS
from ..contract.names import ANNOTATION_HASH
from ..k8s import Cluster, MissingApiError, RejectedApiError
from ..k8s.cache import deployment_mark
from ..planner import Plan, PlanningError, plan_deployment, with_staged
from ..planner.capacity import shortfalls
from ..planner.chat_template import problem as chat_template_problem
from ..planner.facts import PoolFacts
from ..planner.images import OPERATOR_IMAGE
from ..render import Owner, render_routers, render_serving, render_weights
from ..render.names import LABEL_COMPAT, LABEL_POOL, deployment_label
from .autoscaler import SloScaler, autoscaling_statuses, hand_over, previous_autoscaling, with_live_counts
from .disaggregation import DisaggregationProbe
from .pairing import leader_endpoints, revision_pairs, serving_hash
from .pass_memo import PassMemo
from .queueing import QueueProbe, queued_roles, recheck_seconds
from .rollout import ROLLOUT_POLL_SECONDS, old_routers, partitions, router_weights
from .status import compute_status, transitions
from .status_pace import StatusPace
from .weights_status import weights_state

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


def reconcile(cluster: Cluster, namespace: str, name: str, now: Callable[[], str] = utc_now,
              tools_image: str = OPERATOR_IMAGE, scaler: SloScaler | None = None,
              body: dict[str, Any] | None = None, memo: PassMemo | None = None,
              pace: StatusPace | None = None, probe: DisaggregationProbe | None = None,
              queues: QueueProbe | None = None) -> Outcome:
    """One pass over deployment `name`; `body` when the caller holds a fresher copy than the cache,
    `memo` what earlier passes worked out (node facts, GPU usage, plans), `pace` when this
    deployment's status was last written (without it every change is written at once), `probe`
    what measures whether a P/D deployment that serves disaggregates (no Disaggregating condition
    without it), `queues` what reads Kueue's Workloads of queued roles (read on every pass without it)."""
    outcome = Outcome()
    mine = deployment_label(Owner(name=name, namespace=namespace, uid=""))  # what its children carry
    seen = cluster.observe(namespace, name, mine, body)
    body = seen.deployment
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return outcome  # gone or going: garbage collection removes the children
    meta = ObjectMeta.model_validate(body["metadata"])
    owner = Owner(name=meta.name, namespace=meta.namespace, uid=meta.uid)
    previous = _previous_status(body)

    def fail(error: PlanningError) -> Outcome:
        outcome.error = error
        _write_status(cluster, pace, owner, previous, outcome, compute_status(
            owner=owner, generation=meta.generation, previous=previous, plan=None, error=error,
            workloads={}, now=now()))
        return outcome

    memo = memo or PassMemo()
    prometheus_url = scaler.prometheus_url if scaler else None
    plan_key = ((meta.uid, meta.generation, seen.nodes_revision, prometheus_url)
                if meta.uid and meta.generation and seen.nodes_revision is not None else None)
    if (known := memo.plans.get(plan_key)) is None:
        try:
            cr = KimiK3Deployment.model_validate(body)
        except ValidationError as exc:
            return fail(PlanningError(INVALID_SPEC, first_error(exc)))
    else:
        cr = known[0]
    facts = {pool.name: memo.facts.pool(pool.node_selector, seen.nodes, seen.nodes_revision) for pool in cr.spec.pools}
    own_pods = [p for p in seen.pods if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]

    try:
        _check_not_stranded(cr, facts, own_pods)
        if known is None:
            plan = plan_deployment(cr.spec, facts, prometheus_url=prometheus_url)
            memo.plans.put(plan_key, cr, plan)
        else:
            plan = known[1]
    except PlanningError as exc:
        return fail(exc)

    used = memo.usage.used_except(seen.active_pods, seen.active_pods_revision, deployment_mark, (namespace, mine))
    live = {_key(o): o for o in seen.children}
    current: dict[tuple[str, str], dict[str, Any]] = {}
    held: dict[tuple[str, str], int] = {}
    try:
        # Weights first: nothing new serves until its checkpoints are staged at a known commit.
        desired = render_weights(owner, plan, tools_image)
        _apply_all(cluster, desired, live, current, outcome)
        jobs = {n: o for (k, n), o in current.items() if k == JOB.kind}
        progress = {n: o for (k, n), o in current.items() if k == CONFIG_MAP.kind}
        job_pods = [p for p in seen.pods if (p["metadata"].get("labels") or {}).get(COMPONENT_LABEL) == "weights"]
        weights = weights_state(owner, plan.weights, jobs, job_pods, progress, previous.weights if previous else ())
        wanted = {_key(o) for o in desired}
        plan = with_staged(plan, weights.commits) if weights.all_staged else plan
        paired = serving_hash(plan, own_pods, _selected_hashes(live))
        endpoints = leader_endpoints(plan, own_pods)
        pairs = revision_pairs(plan, own_pods)
        if weights.all_staged:
            # each role's count as this pass applies it (an autoscaled role's: its scaler's)
            counted = with_live_counts(owner, plan, {n: o for (k, n), o in live.items() if k == LEADER_WORKER_SET.kind})
            replicas: dict[tuple[str, str], int] = {(p.name, r.role): r.replicas for p, r in counted.role_plans()}
            held = partitions(plan, own_pods, replicas)
            serving = render_serving(owner, plan, paired, router_weights(plan, own_pods, replicas, pairs), held)
            if held and old_routers(plan, own_pods):
                outcome.due = ROLLOUT_POLL_SECONDS
            if (problem := _chat_template_problem(cluster, plan, serving, live)) is not None:
                return fail(problem)
            hand_over(cluster, owner, plan, {n: o for (k, n), o in live.items() if k == LEADER_WORKER_SET.kind},
                      serving)
            _apply_all(cluster, serving, live, current, outcome)
            wanted |= {_key(o) for o in serving}
        else:
            # What serves now keeps serving (a new revision stages into a folder of its own), and
            # its routers keep following the leaders that serve.
            wanted |= {k for k in live if BY_KIND[k[0]].stage != WEIGHTS}
            _apply_all(cluster, [o for o in render_routers(owner, plan, pairs) if _key(o) in live],
                       live, current, outcome)
    except MissingApiError as exc:
        hint = BY_KIND[exc.kind].missing_hint
        return fail(PlanningError(MISSING_DEPENDENCY, f"{exc}: {hint}" if hint else str(exc), depends_on_nodes=True))
    except RejectedApiError as exc:
        return fail(PlanningError(APPLY_REJECTED, f"the API server refused {exc.kind} {exc.name}: {exc.message}"))
    for key, obj in live.items():
        if key not in wanted and _owned_by(obj, meta.uid) and BY_KIND[key[0]].pruned:
            cluster.delete(obj)
            outcome.deleted.append("/".join(key))

    kept = {k: o for k, o in {**live, **current}.items() if k in wanted}
    workloads: dict[str, Mapping[str, Any]] = {n: o for (k, n), o in kept.items() if k == LEADER_WORKER_SET.kind}
    plan = with_live_counts(owner, plan, workloads)
    admission = (queues or QueueProbe()).admission(cluster, owner, queued_roles(owner, plan, workloads))
    waiting = admission.waiting if admission else {}
    if admission and (again := recheck_seconds(admission)) is not None:
        outcome.due = min(again, outcome.due or again)
    scaling = previous_autoscaling(previous)
    if scaler is not None and scaler.due((namespace, name), plan):
        scaling, rescaled = scaler.step(cluster, owner, plan, facts, used, workloads, scaling, owner.reference(),
                                        waiting)
        workloads = {**workloads, **rescaled}
        plan = with_live_counts(owner, plan, workloads)
        pace = None  # the scaler's memory (last scale, breach since) lives in the status: never held back
    scaling = autoscaling_statuses(owner, plan, scaling)
    _write_status(cluster, pace, owner, previous, outcome, compute_status(
        owner=owner, generation=meta.generation, previous=previous, plan=plan, error=None,
        workloads=workloads, now=now(), capacity=shortfalls(plan, facts, used, {k: plan.max_surge for k in held}),
        weights=weights, endpoints=endpoints, pairs=pairs,
        routers={n: o for (k, n), o in kept.items() if k == DEPLOYMENT.kind}, autoscaling=scaling,
        disaggregating=probe.verdict(owner, plan) if probe is not None and workloads else None,
        admission=admission))
    return outcome


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


def _apply_all(cluster: Cluster, desired: list[dict[str, Any]], live: dict[tuple[str, str], dict[str, Any]],
               current: dict[tuple[str, str], dict[str, Any]], outcome: Outcome) -> None:
    for obj in desired:
        if BY_KIND[obj["kind"]].create_only and _key(obj) in live:
            current[_key(obj)] = live[_key(obj)]
            continue
        result = cluster.apply(obj, live.get(_key(obj)))
        current[_key(obj)] = result.obj
        if result.written:
            outcome.applied.append("/".join(_key(obj)))


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


def _write_status(cluster: Cluster, pace: StatusPace | None, owner: Owner, previous: KimiK3DeploymentStatus | None,
                  outcome: Outcome, status: KimiK3DeploymentStatus) -> None:
    outcome.phase = status.phase
    if previous == status:
        return
    key = (owner.namespace, owner.name)
    if pace is not None and (wait := pace.wait(key, previous, status)) > 0:
        outcome.due = min(wait, outcome.due or wait)
        return
    cluster.apply_status(owner.namespace, owner.name, status.wire())
    if pace is not None:
        pace.wrote(key)
    outcome.status_written = True
    log.info("Updated status of %s/%s: phase %s", owner.namespace, owner.name, status.phase)
    for type_, reason, message in transitions(previous, status):
        cluster.post_event(owner.reference(), owner.namespace, type_, reason, message)
        outcome.events.append(reason)
