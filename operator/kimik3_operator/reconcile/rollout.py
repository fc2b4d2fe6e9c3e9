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

A group that fails (reconcile/failing.py: a crash loop, an OOM, an image, a hang) while its role rolls
is replaced, never waited on. Left alone, LeaderWorkerSet stalls on it: rollingUpdatePartition counts
a group that is not Ready below the groups it would replace next as unavailable, and with
maxUnavailable 0 replaces nothing more until that group is Ready again, which a crash-looping one
never is; and the hold would keep it as the old revision's "whole pair". So, per role, for its old
groups (`OldGroups`: below its replicas, on an older template than its newest group):

- the hold keeps a healthy old group, not a broken one: in step 1 the groups up to the highest
  healthy old one, in step 2 up to the lowest healthy old one (a broken group below it stays held;
  it is replaced once the hold ends); a role with only broken old groups is not held at all;
- "full" asks the new revision for its replicas less the broken old groups (they serve nothing now,
  and replacing them is the rollout's last step);
- its LeaderWorkerSet's maxUnavailable is raised by the broken old groups that lie below a healthy
  old one (`OldGroups.allowance`): the budget they already spend, so LeaderWorkerSet goes on
  replacing the healthy groups above them at the pace it would without them. It never counts a
  failing group of the new template: a new revision that crash-loops must not be given old groups
  to eat, and LeaderWorkerSet replaces only below a run of Ready updated groups anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..contract import timestamps
from ..planner import Plan
from ..render.names import LABEL_COMPAT, LABEL_POOL, LABEL_ROLE
from ..render.router import LABEL_REVISION
from ..render.workloads import LWS_WORKER_INDEX_LABEL
from .failing import GROUP_INDEX, LWS_NAME, REVISION, Failure
from .pairing import PAIRED, routable

Key = tuple[str, str]

ROLLOUT_POLL_SECONDS = 2.0
"""How often a pass looks again while old groups are held and an old revision's router is still
there: its pods' going is no child event (only LeaderWorkerSets, Deployments, ... start passes)."""


@dataclass(frozen=True)
class OldGroups:
    """One role's groups below its replicas that run an older template than its newest group."""

    healthy: frozenset[int]
    broken: frozenset[int]
    """Those that fail (reconcile/failing.py)."""

    def allowance(self) -> int:
        """The broken groups LeaderWorkerSet counts against maxUnavailable before it replaces the
        healthy old groups above them (rollingUpdatePartition): what the rollout adds to it."""
        return sum(1 for b in self.broken if any(h > b for h in self.healthy))

    def hold_all(self, replicas: int) -> int:
        """Step 1's partition: every group, or, with broken ones, up to the highest healthy one."""
        if not self.broken:
            return replicas
        return 1 + max(self.healthy) if self.healthy else 0

    def hold_one(self) -> int:
        """Step 2's partition: group 0, or, with broken ones, up to the lowest healthy one."""
        if not self.broken:
            return 1
        return 1 + min(self.healthy) if self.healthy else 0


NO_OLD_GROUPS = OldGroups(frozenset(), frozenset())


def old_groups(pods: Iterable[Mapping[str, Any]], failures: Sequence[Failure],
               replicas: Mapping[Key, int]) -> dict[Key, OldGroups]:
    """(pool, role) -> its old groups, for every role (paired or not) that runs one: a role's newest
    template is its highest group's (LeaderWorkerSet starts a surge group, or replaces the highest
    first, on the new one), a group's is its leader's or, while it is recreated, the one it failed on."""
    newest: dict[Key, tuple[int, str]] = {}
    revisions: dict[Key, dict[int, str]] = {}
    keys: dict[str, Key] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if (meta.get("deletionTimestamp") or labels.get(LWS_WORKER_INDEX_LABEL) != "0"
                or not labels.get(GROUP_INDEX, "").isdigit() or LABEL_ROLE not in labels):
            continue
        key, index = (labels.get(LABEL_POOL, ""), labels[LABEL_ROLE]), int(labels[GROUP_INDEX])
        revision = labels.get(REVISION, "")
        keys[labels.get(LWS_NAME, "")] = key
        revisions.setdefault(key, {})[index] = revision
        if index >= newest.get(key, (-1, ""))[0]:
            newest[key] = (index, revision)
    failed: dict[Key, dict[int, str | None]] = {}
    for f in failures:
        if f.group is not None and f.group[0] in keys:
            failed.setdefault(keys[f.group[0]], {})[f.group[1]] = f.revision
    out = {}
    for key, (_, new) in newest.items():
        below = replicas.get(key, 0)
        broken = frozenset(i for i, r in failed.get(key, {}).items() if i < below and r and r != new)
        healthy = frozenset(i for i, r in revisions[key].items() if i < below and r != new and i not in broken)
        if broken or healthy:
            out[key] = OldGroups(healthy, broken)
    return out


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


def _full(plan: Plan, pods: Iterable[Mapping[str, Any]], replicas: Mapping[Key, int],
          old: Mapping[Key, OldGroups]) -> bool:
    """Every paired role has its replicas Ready on the plan's revision, less its broken old groups."""
    new_ready = _new_ready(plan, _leaders(pods), replicas)
    return bool(new_ready) and all(new_ready[key] >= replicas[key] - len(old.get(key, NO_OLD_GROUPS).broken)
                                   for key in new_ready)


def router_weights(plan: Plan, pods: Iterable[Mapping[str, Any]], replicas: Mapping[Key, int],
                   pairs: Mapping[str, int], old: Mapping[Key, OldGroups] | None = None) -> dict[str, int]:
    """The revisions whose P/D routers run, with their routable pairs (render.router.router_replicas):
    `pairs`, less the older revisions once the plan's revision is full and has a Ready router of
    its own (module docstring), and from then on: once the old routers are gone, a broken group
    replaced (no longer discounted from "full") or a new pod turning unready brings none back."""
    pods = list(pods)
    if not any(h != plan.compat_hash for h in pairs):
        return dict(pairs)
    if not any(revision == plan.compat_hash and ok for revision, ok in _routers(pods)):
        return dict(pairs)
    if not _full(plan, pods, replicas, old or {}) and old_routers(plan, pods):
        return dict(pairs)
    return {h: n for h, n in pairs.items() if h == plan.compat_hash}


def partitions(plan: Plan, pods: Iterable[Mapping[str, Any]], replicas: Mapping[Key, int],
               old: Mapping[Key, OldGroups] | None = None) -> dict[Key, int]:
    """(pool, role) -> the partition of its LeaderWorkerSet, for the paired roles that still run an
    old revision; the others are left out (partition 0). `replicas`: each role's count now (its
    scaler's, for an autoscaled role); `old`: their old groups (`old_groups`), which say which
    are broken."""
    roles = _roles(plan, replicas)
    if plan.max_surge < 1 or plan.max_unavailable > 0 or not roles:
        return {}
    pods = list(pods)
    leaders = _leaders(pods)
    rolling = {key for key, h, _ in leaders if h != plan.compat_hash}
    if not rolling:
        return {}
    groups = {key: (old or {}).get(key, NO_OLD_GROUPS) for key in roles}
    if not all(_new_ready(plan, leaders, replicas).values()):
        held = {key: groups[key].hold_all(replicas[key]) for key in roles if key in rolling}
    elif not old_routers(plan, pods):
        # Step 4, and it stays so: the old routers went (step 3 saw the new revision full) and
        # every role serves on the new revision; a new pod turning unready later must not bring
        # an old group back, which would reload the weights with no router to use it.
        return {}
    else:
        held = {key: groups[key].hold_one() for key in roles if key in rolling}
    return {key: n for key, n in held.items() if n}
