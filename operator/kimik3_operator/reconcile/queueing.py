"""The `Admitted` condition's reads: Kueue's Workloads of a deployment's queued roles
(planner/queueing.py judges them).

A deployment with a queued role has its Workloads read at most every CHECK_SECONDS, one list
selected by the LeaderWorkerSets' UIDs, whatever its passes; while a group waits the pass asks to
run again by then (Outcome.due), so an admission shows within CHECK_SECONDS even if the pods it
releases were not ours to watch. A deployment without queued roles reads nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..api.reasons import KUEUE_MISSING, KUEUE_UNAVAILABLE
from ..k8s import Cluster, RejectedApiError, TransientApiError
from ..planner import Plan
from ..planner.disaggregation import Verdict
from ..planner.queueing import Admission, QueuedRole, judge_admission
from ..render.names import Owner, workload_name

log = logging.getLogger(__name__)

CHECK_SECONDS = 5.0
"""How stale the Workloads a pass judges may be: a group waits for minutes, an admission should
show within a few seconds."""
MISSING_SECONDS = 60.0
"""How long "the cluster serves no Workload kind" is believed: asking the client for an unknown
kind makes it rediscover every API group."""

Key = tuple[str, str]


def queued_roles(owner: Owner, plan: Plan, workloads: Mapping[str, Mapping[str, Any]]) -> list[QueuedRole]:
    """The plan's queued roles whose LeaderWorkerSets exist, as they are (`workloads` by name)."""
    roles = []
    for pool, role in plan.role_plans():
        name = workload_name(owner, pool.name, role.role)
        if role.queue is None or name not in workloads:
            continue
        live = workloads[name]
        roles.append(QueuedRole(where=f"pool {pool.name} role {role.role}", workload=name,
                                uid=(live.get("metadata") or {}).get("uid"), queue=role.queue,
                                groups=kueue_groups(live)))
    return roles


def kueue_groups(live: Mapping[str, Any]) -> int:
    """How many groups of a LeaderWorkerSet Kueue keeps a Workload for, as Kueue v0.17.0 counts
    them (pkg/controller/jobs/leaderworkerset/leaderworkerset_reconciler.go, filterWorkloads and
    isRollingUpdateWithSurge): spec.replicas, or status.replicas while a rolling update with a
    whole-number maxSurge above 0 has not updated every group (its surge groups). A scale-down's
    lagging status.replicas does not count: Kueue has already deleted those Workloads."""
    spec = live.get("spec") or {}
    status = live.get("status") or {}
    replicas = spec.get("replicas")
    asked = 1 if replicas is None else int(replicas)
    running = int(status.get("replicas") or 0)
    surge = ((spec.get("rolloutStrategy") or {}).get("rollingUpdateConfiguration") or {}).get("maxSurge")
    rolling = _int_value(surge) > 0 and int(status.get("updatedReplicas") or 0) < asked
    return max(asked, running) if rolling else asked


def _int_value(value: Any) -> int:
    """intstr's IntValue(): a number, or a string that parses as one; "25%" is 0, as in Go."""
    if isinstance(value, int):
        return value
    try:
        return int(str(value))
    except ValueError:
        return 0


def recheck_seconds(admission: Admission) -> float | None:
    """When a pass should look again without an event: soon while Kueue has not admitted every
    group (an admission ungates pods this operator may not be told of at once), rarely while Kueue
    is missing, never once all is admitted."""
    if admission.verdict.status == "True":
        return None
    return MISSING_SECONDS if admission.verdict.reason == KUEUE_MISSING else CHECK_SECONDS


class QueueProbe:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[Key, tuple[float, tuple[str, ...], list[dict[str, Any]] | None]] = {}

    def admission(self, cluster: Cluster, owner: Owner, roles: Sequence[QueuedRole]) -> Admission | None:
        """The verdict over `roles`, from Workloads read at most CHECK_SECONDS ago for these same
        LeaderWorkerSets; None without queued roles (no condition)."""
        key = (owner.namespace, owner.name)
        if not roles:
            self._last.pop(key, None)
            return None
        uids = tuple(sorted(r.uid for r in roles if r.uid))
        now = self._clock()
        last = self._last.get(key)
        fresh = MISSING_SECONDS if last is not None and last[2] is None else CHECK_SECONDS
        if last is not None and last[1] == uids and now - last[0] < fresh:
            found = last[2]
        else:
            try:
                found = cluster.list_kueue_workloads(owner.namespace, uids)
            except (TransientApiError, RejectedApiError) as exc:
                log.warning("Admitted of %s/%s: %s", owner.namespace, owner.name, exc)
                self._last.pop(key, None)
                return Admission(Verdict("Unknown", KUEUE_UNAVAILABLE, f"reading Kueue's Workloads failed: {exc}"),
                                 {r.workload: 0 for r in roles})
            self._last[key] = (now, uids, found)
        return judge_admission(roles, found)

    def forget_all_but(self, keys: set[Key]) -> None:
        self._last = {k: v for k, v in self._last.items() if k in keys}
