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

from ..api.reasons import KUEUE_UNAVAILABLE
from ..k8s import Cluster, RejectedApiError, TransientApiError
from ..planner import Plan
from ..planner.disaggregation import Verdict
from ..planner.queueing import Admission, QueuedRole, judge_admission
from ..render.names import Owner, workload_name

log = logging.getLogger(__name__)

CHECK_SECONDS = 5.0
"""How stale the Workloads a pass judges may be: a group waits for minutes, an admission should
show within a few seconds."""

Key = tuple[str, str]


def queued_roles(owner: Owner, plan: Plan, workloads: Mapping[str, Mapping[str, Any]]) -> list[QueuedRole]:
    """The plan's queued roles whose LeaderWorkerSets exist, as they are (`workloads` by name)."""
    roles = []
    for pool, role in plan.role_plans():
        name = workload_name(owner, pool.name, role.role)
        if role.queue is None or name not in workloads:
            continue
        live = workloads[name]
        groups = (live.get("spec") or {}).get("replicas")
        roles.append(QueuedRole(where=f"pool {pool.name} role {role.role}", workload=name,
                                uid=(live.get("metadata") or {}).get("uid"), queue=role.queue,
                                groups=int(groups if groups is not None else role.replicas)))
    return roles


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
        if last is not None and last[1] == uids and now - last[0] < CHECK_SECONDS:
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
