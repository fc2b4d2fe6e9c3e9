"""A scale-in restarts a broken group it keeps instead of keeping it broken (issue 41).

LeaderWorkerSet removes the highest group indexes on a scale-in (leaderworkerset_controller.go
scales the leader StatefulSet, which removes its highest ordinals), whatever their health: scaling
3 -> 2 with group 1 hung keeps the hung group and removes the healthy group 2, and the role then
serves one replica where it asked for two. Nothing restarts a hung engine by itself: engines have no
liveness probe (a long prefill must not be killed for a slow /health).

So when a role's count falls, each group it keeps that fails in a way a fresh start can cure (a crash
loop, an OOM, an error exit, an engine that was Ready and hangs) is restarted once for that scale-in:
its leader pod is deleted with a uid precondition and a short grace period (RESTART_GRACE_SECONDS),
and LeaderWorkerSet recreates the whole group (the
workers' StatefulSet belongs to the leader pod; RecreateGroupOnPodRestart), which the scheduler may
place on other nodes. A group that cannot pull its image or be scheduled is left alone: a new pod
fails the same way. Status says which (the Degraded message names the group, "restarted for the
scale-in to N replicas"), and a Normal event records each restart.

Both who lower a count are covered: the operator (spec replicas) and an autoscaler (HPA, KEDA, the SLO
scaler), since the count compared is the one the pass applies (the LeaderWorkerSet's own for an
autoscaled role). The count at the last pass lives in the operator's memory (FailureMemory): the first
pass after an operator restart sees no fall.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..api.reasons import CONTAINER_EXITED, CRASH_LOOP, ENGINE_NOT_READY, OOM_KILLED
from .failing import GROUP_INDEX, LWS_NAME, WORKER_INDEX, Failure

RESTART_GRACE_SECONDS = 30
"""The grace period of a restart's delete, instead of the pod's drain budget (engine shutdown timeout
+ preStop + 30 s, 340 s by default): a failing group serves nothing to drain, and a process stuck
whole ignores SIGTERM until SIGKILL ends it."""

RESTARTABLE = frozenset({CRASH_LOOP, OOM_KILLED, CONTAINER_EXITED, ENGINE_NOT_READY})
"""Failures a new start may cure; an image that cannot be pulled or a pod that cannot be placed fail
again the same way."""


@dataclass(frozen=True)
class Restart:
    """Restart one group: delete its leader pod (`pod`, as observed: the uid precondition)."""

    failure: Failure
    pod: Mapping[str, Any]
    replicas: int
    """The role's count after the scale-in."""

    @property
    def slot(self) -> tuple[str, int]:
        assert self.failure.group is not None
        return self.failure.group

    def note(self) -> str:
        return f"restarted for the scale-in to {self.replicas} replicas"


def restarts(fallen: Mapping[str, int], failures: Sequence[Failure], pods: Iterable[Mapping[str, Any]]
             ) -> list[Restart]:
    """The groups to restart now: below the new count of a workload whose count fell (`fallen`),
    failing for a reason a restart may cure, with a leader pod that is not already going."""
    if not fallen:
        return []
    leaders: dict[tuple[str, int], Mapping[str, Any]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if (labels.get(LWS_NAME) in fallen and labels.get(WORKER_INDEX) == "0"
                and labels.get(GROUP_INDEX, "").isdigit() and not meta.get("deletionTimestamp")):
            leaders[(labels[LWS_NAME], int(labels[GROUP_INDEX]))] = pod
    return [Restart(f, leaders[f.group], fallen[f.group[0]]) for f in failures
            if f.group is not None and f.group[0] in fallen and f.group[1] < fallen[f.group[0]]
            and f.reason in RESTARTABLE and f.group in leaders]
