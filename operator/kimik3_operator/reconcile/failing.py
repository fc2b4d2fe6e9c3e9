"""Which replicas fail, as opposed to starting, rolling or scaling: what the Degraded condition says.

A serving replica is a LeaderWorkerSet group, a slot (workload, group index) that outlives its pods:
with RecreateGroupOnPodRestart, LWS deletes and recreates a group once one of its pods restarts. So
the evidence of a crash lives on the pods only for a moment, and a recreated group looks like a
starting one. A slot therefore counts as failing when:

- one of its pods shows a failure as its kubelet reports it: a container waiting in CrashLoopBackOff
  or on its image (ImagePullBackOff, ErrImagePull, ...) or on a broken container config, or one
  that exited (lastState.terminated: OOMKilled, or an exit code); the reason is remembered for the
  slot until it is Ready again, so it still reads while LWS recreates the group;
- or it was Ready on its template revision and its leader is not, on the same revision, with
  nothing to show why (an engine that hangs and fails its readiness probe; a replacement pod the
  scheduler cannot place: Unschedulable).

What never counts: a slot never Ready on this revision (a cold start, a scale-out), a slot whose
pods carry another revision (a rollout replaced it), a slot at or above the planned replicas (a
scale-in), a pod being deleted. Router pods count only by their own failures (a crash, an OOM, an
image): a router without a pair is unready because of its engines, which say why themselves.

What a slot was Ready on is kept in memory (FailureMemory, one per operator process): after a
restart of the operator a hung engine reads as starting until its kubelet reports a restart.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..api.reasons import CONTAINER_EXITED, CRASH_LOOP, ENGINE_NOT_READY, IMAGE_PULL, OOM_KILLED, UNSCHEDULABLE

LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
REVISION = "leaderworkerset.sigs.k8s.io/template-revision-hash"
COMPONENT = "app.kubernetes.io/component"

WAITING: dict[str, str] = {
    "CrashLoopBackOff": CRASH_LOOP, "ImagePullBackOff": IMAGE_PULL, "ErrImagePull": IMAGE_PULL,
    "ErrImageNeverPull": IMAGE_PULL, "InvalidImageName": IMAGE_PULL, "CreateContainerConfigError": CONTAINER_EXITED,
    "CreateContainerError": CONTAINER_EXITED, "RunContainerError": CONTAINER_EXITED,
}
"""A container's waiting reason that is a failure -> the condition's reason (Kubernetes' own words
where they are stable)."""


@dataclass(frozen=True)
class Failure:
    """One failing replica (or router pod) and why."""

    reason: str
    what: str
    """pool/role group N, or the router's Deployment."""
    pod: str
    detail: str
    group: tuple[str, int] | None = None
    """(LeaderWorkerSet, group index) of a failing replica; None for a router pod."""
    revision: str | None = None
    """The LeaderWorkerSet template revision the failing group runs (its leader's, or the one it
    ran when it was last seen failing): a rollout replaces an old one instead of waiting on it
    (reconcile/rollout.py)."""

    def line(self) -> str:
        return f"{self.what}: pod {self.pod} {self.detail}"


@dataclass
class FailureMemory:
    """Per deployment: the revision each slot was last Ready on, and the failure last seen on it; each
    serving workload's replica count at the last pass, and the slots a scale-in restarted
    (reconcile/scale_in.py)."""

    _ready: dict[tuple[str, str], dict[tuple[str, int], str]] = field(default_factory=dict)
    _seen: dict[tuple[str, str], dict[tuple[str, int], Failure]] = field(default_factory=dict)
    _counts: dict[tuple[str, str], dict[str, int]] = field(default_factory=dict)
    _restarted: dict[tuple[str, str], dict[tuple[str, int], str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def forget_all_but(self, keys: Iterable[tuple[str, str]]) -> None:
        keep = set(keys)
        with self._lock:
            for store in (self._ready, self._seen, self._counts, self._restarted):
                for key in [k for k in store if k not in keep]:
                    del store[key]

    def fallen(self, key: tuple[str, str], counts: Mapping[str, int]) -> dict[str, int]:
        """The workloads whose replica count is lower than at the last pass, with their count now;
        remembers `counts` for the next pass (the first pass of a process sees no fall)."""
        with self._lock:
            before = self._counts.get(key, {})
            self._counts[key] = dict(counts)
        return {w: n for w, n in counts.items() if n < before.get(w, n)}

    def note_restart(self, key: tuple[str, str], failure: Failure, note: str) -> None:
        """`failure`'s group was restarted: it reads as failing ("being recreated") until it is Ready
        again, its old pod going and its new one starting included, and status adds `note`."""
        assert failure.group is not None
        with self._lock:
            self._seen.setdefault(key, {})[failure.group] = failure
            self._restarted.setdefault(key, {})[failure.group] = note

    def restart_notes(self, key: tuple[str, str],
                      failing_slots: Iterable[tuple[str, int]]) -> dict[tuple[str, int], str]:
        """What was said of each restarted slot that still fails; a slot that recovered is forgotten."""
        still = set(failing_slots)
        with self._lock:
            notes = {slot: note for slot, note in self._restarted.get(key, {}).items() if slot in still}
            self._restarted[key] = notes
        return dict(notes)


def pod_failure(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, detail) when the pod's kubelet reports a failure of one of its containers."""
    status = pod.get("status") or {}
    for c in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in WAITING:
            last = ((c.get("lastState") or {}).get("terminated")) or {}
            why = f" after it {_exit(last)}" if last else ""
            reason = OOM_KILLED if last.get("reason") == "OOMKilled" else WAITING[waiting["reason"]]
            return reason, f"container {c.get('name')} {waiting['reason']}{why} (restarts: {c.get('restartCount', 0)})"
        for terminated in (((c.get("state") or {}).get("terminated")) or {},
                           ((c.get("lastState") or {}).get("terminated")) or {}):
            if terminated and (terminated.get("exitCode") or terminated.get("reason") == "OOMKilled"):
                reason = OOM_KILLED if terminated.get("reason") == "OOMKilled" else CONTAINER_EXITED
                return reason, f"container {c.get('name')} {_exit(terminated)} (restarts: {c.get('restartCount', 0)})"
    return None


def _exit(terminated: Mapping[str, Any]) -> str:
    return f"exited {terminated.get('exitCode')} ({terminated.get('reason') or 'Error'})"


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _unschedulable(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in (pod.get("status") or {}).get("conditions") or [])


def failing(memory: FailureMemory, key: tuple[str, str], pods: Sequence[Mapping[str, Any]],
            planned: Mapping[str, tuple[str, int]]) -> list[Failure]:
    """The failing replicas and router pods of one deployment (`key`), from its pods now and what
    `memory` kept; `planned` maps each serving LeaderWorkerSet to its `pool/role` and planned replicas.
    Updates `memory`."""
    slots: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    routers = []
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(LWS_NAME) in planned and labels.get(GROUP_INDEX, "").isdigit():
            slots.setdefault((labels[LWS_NAME], int(labels[GROUP_INDEX])), []).append(pod)
        elif labels.get(COMPONENT) == "router":
            routers.append(pod)
    with memory._lock:
        ready = memory._ready.setdefault(key, {})
        seen = memory._seen.setdefault(key, {})
        for slot in seen:
            # a failing group between its old pods and its new ones (LWS recreating it) still fails
            slots.setdefault(slot, [])
        out = [f for slot, group in sorted(slots.items()) if slot[0] in planned
               and (f := _slot(slot, group, planned, ready, seen))]
        for slot in [s for s in [*ready, *seen] if s[0] not in planned or s[1] >= planned[s[0]][1]]:
            ready.pop(slot, None)
            seen.pop(slot, None)  # scaled in or gone: nothing to watch there
    for pod in routers:
        meta = pod.get("metadata") or {}
        if not meta.get("deletionTimestamp") and not _ready(pod) and (why := pod_failure(pod)):
            owner = (meta.get("labels") or {}).get("serving.kimik3.dev/router", "router")
            out.append(Failure(why[0], f"router {owner}", str(meta.get("name")), why[1]))
    return out


def _slot(slot: tuple[str, int], pods: list[Mapping[str, Any]], planned: Mapping[str, tuple[str, int]],
          ready: dict[tuple[str, int], str], seen: dict[tuple[str, int], Failure]) -> Failure | None:
    what, replicas = planned[slot[0]]
    if slot[1] >= replicas:
        return None
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    leader = next((p for p in live if ((p.get("metadata") or {}).get("labels") or {}).get(WORKER_INDEX) == "0"), None)
    revision = ((leader or {}).get("metadata") or {}).get("labels", {}).get(REVISION) if leader else None
    if leader is not None and all(_ready(p) for p in live):
        ready[slot] = revision or ""
        seen.pop(slot, None)
        return None
    if revision is not None and slot in seen and ready.get(slot) not in (None, revision):
        seen.pop(slot, None)  # a rollout replaced the slot
    where = f"{what} group {slot[1]}"
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name"))):
        if (why := pod_failure(pod)) is not None:
            seen[slot] = Failure(why[0], where, str(pod["metadata"]["name"]), why[1], slot,
                                 revision or (seen[slot].revision if slot in seen else ready.get(slot)))
            return seen[slot]
    if slot in seen:
        last = seen[slot]
        return Failure(last.reason, where, last.pod, f"{last.detail}; the group is being recreated", slot,
                       revision or last.revision)
    was = ready.get(slot)
    if was is None or leader is None or revision != was:
        return None  # never Ready on this revision: starting, rolling, or between pods
    unplaced = next((p for p in live if _unschedulable(p)), None)
    if unplaced is not None:
        return Failure(UNSCHEDULABLE, where, str(unplaced["metadata"]["name"]), "cannot be scheduled again",
                       slot, revision)
    if (leader.get("status") or {}).get("phase") != "Running":
        return None  # a replacement on its way (its node went): starting, as far as its pods tell
    stuck = next(p for p in [leader, *live] if not _ready(p))
    return Failure(ENGINE_NOT_READY, where, str(stuck["metadata"]["name"]),
                   "was Ready and is not, its container running (it fails its readiness probe)", slot, revision)

