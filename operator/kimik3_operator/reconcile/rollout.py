"""How a P/D rollout keeps serving: which of each paired role's old groups it holds, and for how long.

LeaderWorkerSet rolls each role on its own (sigs.k8s.io/lws v0.9.0, leaderworkerset_controller.go):
with maxSurge it starts a surge group on the new template, then replaces the old groups from the
highest index down, each once the one before is Ready. Left alone, a one-replica prefill is replaced
as soon as its surge group is Ready, while the decodes are still old: the old pairs lose their
prefill before a new decode exists, and nothing can serve. `rollingUpdateConfiguration.partition`
keeps every group below it on the template it runs (documented there for xPyD rollouts), so:

1. until the new revision has a Ready leader in every paired role, each paired role holds all of
   its groups (partition = its replicas): only the surge groups start, on the new template, and the
   old revision serves whole;
2. then each role rolls but keeps its group 0 on the old revision (partition 1): the old revision's
   router keeps a whole pair for as long as it serves. Released one role at a time, the old router
   would lose its last decode while it still had a prefill, and answer 503 "No available workers:
   N prefill, 0 decode" (vllm-router 0.1.17 routers/http/vllm_pd_router.rs) until its readiness
   probe failed and its Service dropped it; LeaderWorkerSet replaces a group the moment the one
   above it is Ready, faster than any pass could hold it back then. The surge group stays while
   group 0 is held (calculateRollingUpdateReplicas keeps `unready - maxUnavailable` surge groups),
   so every role reaches its replicas on the new revision;
3. once every paired role has its replicas Ready on the new revision and the new revision's router
   has a Ready pod, the old revisions' routers go (`router_weights` leaves them out, so their
   Deployments are pruned), the old groups 0 still held: the routers' preStop pause and drain
   finish the requests they carry on the old pairs;
4. once no pod of an old revision's router is left, terminating ones included (until their
   deletionTimestamp passed), the last old groups go and stay released: terminating leaders hold
   nothing back.

A paired role at 0 replicas takes no part (it never has a leader to wait for).

Routable capacity (per role: routed Ready leaders over replicas) so never falls below what the
plan asks. Only the default rollout (maxSurge >= 1, maxUnavailable 0) is held: without surge
(maxSurge 0: a cluster sized for one copy) a held role could never start a new group, and with
maxUnavailable >= 1 LeaderWorkerSet reclaims the surge group while group 0 is held, so the new
revision could never fill; the user has allowed a dip there (README, Rollouts).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from ..contract import timestamps
from ..planner import Plan
from ..render.names import LABEL_COMPAT, LABEL_POOL, LABEL_ROLE
from ..render.router import LABEL_REVISION
from ..render.workloads import LWS_WORKER_INDEX_LABEL
from .pairing import PAIRED, routable

Key = tuple[str, str]

ROLLOUT_POLL_SECONDS = 2.0
"""How often a pass looks again while old groups are held and an old revision's router is still
there: its pods' going is no child event (only LeaderWorkerSets, Deployments, ... start passes)."""


def _leaders(pods: Iterable[Mapping[str, Any]]) -> list[tuple[Key, str, bool]]:
    """(role, revision, routable) of the paired leaders that are not on their way out: a released
    old group that terminates holds nothing back any more."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if meta.get("deletionTimestamp"):
            continue
        if labels.get(LABEL_ROLE) in PAIRED and labels.get(LWS_WORKER_INDEX_LABEL) == "0":
            out.append(((labels.get(LABEL_POOL, ""), labels[LABEL_ROLE]), labels.get(LABEL_COMPAT, ""), routable(pod)))
    return out


def _roles(plan: Plan, replicas: Mapping[Key, int]) -> list[Key]:
    """The paired roles that run at all: a role at 0 replicas never has a leader of any revision,
    so waiting for one would hold the others for ever."""
    return [key for pool, role in plan.role_plans()
            if role.role in PAIRED and replicas.get(key := (pool.name, role.role), 0) > 0]


def _new_ready(plan: Plan, leaders: list[tuple[Key, str, bool]], replicas: Mapping[Key, int]) -> dict[Key, int]:
    return {key: sum(1 for k, h, ok in leaders if k == key and h == plan.compat_hash and ok)
            for key in _roles(plan, replicas)}


def _routers(pods: Iterable[Mapping[str, Any]], now: datetime | None = None) -> list[tuple[str, bool]]:
    """(revision, routable) of every P/D router pod (only they carry LABEL_REVISION), terminating
    ones included until their deletionTimestamp (deletion time + grace period) has passed: by then
    the kubelet has killed the container, and a pod left past it sits on a node that no longer
    answers and carries no request (it must not hold a rollout for ever)."""
    now = now or datetime.now(UTC)
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if not (revision := (meta.get("labels") or {}).get(LABEL_REVISION)):
            continue
        if (deadline := timestamps.parse(meta.get("deletionTimestamp"))) is not None and deadline <= now:
            continue
        out.append((revision, routable(pod)))
    return out


def old_routers(plan: Plan, pods: Iterable[Mapping[str, Any]]) -> bool:
    """A pod of another revision's P/D router is still there (terminating ones included)."""
    return any(revision != plan.compat_hash for revision, _ in _routers(pods))


def _full(plan: Plan, pods: Iterable[Mapping[str, Any]], replicas: Mapping[Key, int]) -> bool:
    """Every paired role has its replicas Ready on the plan's revision."""
    new_ready = _new_ready(plan, _leaders(pods), replicas)
    return bool(new_ready) and all(new_ready[key] >= replicas[key] for key in new_ready)


def router_weights(plan: Plan, pods: Iterable[Mapping[str, Any]], replicas: Mapping[Key, int],
                   pairs: Mapping[str, int]) -> dict[str, int]:
    """The revisions whose P/D routers run, with their routable pairs (render.router.router_replicas):
    `pairs`, less the older revisions once the plan's revision is full and has a Ready router of
    its own (module docstring)."""
    pods = list(pods)
    if not any(h != plan.compat_hash for h in pairs) or not _full(plan, pods, replicas):
        return dict(pairs)
    if not any(revision == plan.compat_hash and ok for revision, ok in _routers(pods)):
        return dict(pairs)
    return {h: n for h, n in pairs.items() if h == plan.compat_hash}


def partitions(plan: Plan, pods: Iterable[Mapping[str, Any]], replicas: Mapping[Key, int]) -> dict[Key, int]:
    """(pool, role) -> the partition of its LeaderWorkerSet, for the paired roles that still run an
    old revision; the others are left out (partition 0). `replicas`: each role's count now (its
    scaler's, for an autoscaled role)."""
    roles = _roles(plan, replicas)
    if plan.max_surge < 1 or plan.max_unavailable > 0 or not roles:
        return {}
    pods = list(pods)
    leaders = _leaders(pods)
    old = {key for key, h, _ in leaders if h != plan.compat_hash}
    if not old:
        return {}
    if not all(_new_ready(plan, leaders, replicas).values()):
        return {key: replicas[key] for key in roles if key in old}
    if not old_routers(plan, pods):
        # Step 4, and it stays so: the old routers went (step 3 saw the new revision full) and
        # every role serves on the new revision; a new pod turning unready later must not bring
        # an old group back, which would reload the weights with no router to use it.
        return {}
    return {key: 1 for key in roles if key in old}
