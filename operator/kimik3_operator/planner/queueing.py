"""Has Kueue admitted the queued roles? The verdict behind the `Admitted` condition, and how many
replicas of each role wait (which the SLO scaler must not count as capacity).

Kueue v0.17.0's leaderworkerset integration makes one Workload per group of a LeaderWorkerSet
labelled with a queue (pkg/controller/jobs/leaderworkerset/leaderworkerset_reconciler.go: named
for the set's UID and the group index, labelled kueue.x-k8s.io/job-uid, annotated with the group
index), with the leader and the workers as pod sets admitted together; its pod webhook gates the
group's pods (scheduling gate kueue.x-k8s.io/admission) until the Workload is admitted. A waiting
group's pods are never scheduled and hold no GPU. A Workload says why it waits in its QuotaReserved
condition (apis/kueue/v1beta2/workload_types.go: False with reason Pending or Inadmissible and the
ClusterQueue's message, e.g. "insufficient unused quota for nvidia.com/gpu in flavor ..."), and
Admitted turns True once quota is reserved and admission checks pass. docs/queues.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..api.reasons import ADMITTED, KUEUE_MISSING, NO_WORKLOAD
from ..contract.kueue import ADMITTED as WL_ADMITTED
from ..contract.kueue import (
    EVICTED,
    FINISHED,
    GROUP_INDEX_ANNOTATION,
    JOB_UID_LABEL,
    QUOTA_RESERVED,
    WORKLOAD_API_VERSION,
    WORKLOAD_KIND,
)
from .disaggregation import Verdict


@dataclass(frozen=True)
class QueuedRole:
    """A role whose LeaderWorkerSet names a queue, as the cluster runs it."""

    where: str
    """"pool P role R", for messages."""
    workload: str
    """The LeaderWorkerSet's name."""
    uid: str | None
    """Its UID (None before it exists): the Workloads carry it."""
    queue: str
    groups: int
    """The groups Kueue makes Workloads for: spec.replicas, or status.replicas while a rolling update
    surges above it (leaderworkerset_reconciler.go, filterWorkloads): a surge group needs quota too."""


@dataclass(frozen=True)
class Admission:
    verdict: Verdict
    waiting: Mapping[str, int]
    """LeaderWorkerSet name -> groups not admitted (their pods gated, holding no GPU)."""


def _condition(workload: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in (workload.get("status") or {}).get("conditions") or [] if c.get("type") == type_), None)


def _admitted(workload: Mapping[str, Any]) -> bool:
    """Admitted and not being evicted (an evicted Workload's pods are stopped and it queues again)."""
    return ((_condition(workload, WL_ADMITTED) or {}).get("status") == "True"
            and (_condition(workload, EVICTED) or {}).get("status") != "True")


def _why(workload: Mapping[str, Any]) -> tuple[str, str]:
    """Kueue's reason and message for a Workload that is not admitted: its eviction's, else (quota
    reserved, admission checks pending) its Admitted condition's, else its QuotaReserved's."""
    for type_ in (EVICTED, WL_ADMITTED, QUOTA_RESERVED):
        c = _condition(workload, type_) or {}
        if (c.get("status") == "True") == (type_ == EVICTED) and c.get("reason"):
            if type_ == WL_ADMITTED and (_condition(workload, QUOTA_RESERVED) or {}).get("status") != "True":
                continue  # no quota yet: QuotaReserved says why
            return str(c["reason"]), str(c.get("message") or "")
    return "Pending", "no quota reserved yet"


def _group(workload: Mapping[str, Any]) -> int | None:
    raw = ((workload.get("metadata") or {}).get("annotations") or {}).get(GROUP_INDEX_ANNOTATION)
    return int(raw) if raw is not None and str(raw).isdigit() else None


def _current(workload: Mapping[str, Any], uid: str | None) -> bool:
    """One of this LeaderWorkerSet's Workloads that still stands for a group (not deleted, not finished)."""
    meta = workload.get("metadata") or {}
    return (uid is not None and (meta.get("labels") or {}).get(JOB_UID_LABEL) == uid
            and not meta.get("deletionTimestamp") and (_condition(workload, FINISHED) or {}).get("status") != "True")


def judge_admission(roles: Sequence[QueuedRole], workloads: Sequence[Mapping[str, Any]] | None) -> Admission | None:
    """The verdict over the queued `roles` from the namespace's Kueue Workloads (`workloads`, None
    when the cluster serves no Workload kind: Kueue is not installed). None without queued roles."""
    if not roles:
        return None
    if workloads is None:
        where = ", ".join(f"{r.where} (LocalQueue {r.queue})" for r in roles)
        return Admission(Verdict(
            "False", KUEUE_MISSING,
            f"{where}: the cluster serves no {WORKLOAD_KIND} ({WORKLOAD_API_VERSION}), so no queue admits these "
            "groups and they are scheduled unqueued; install Kueue v0.17 or later with its "
            "leaderworkerset.x-k8s.io/leaderworkerset integration"), {r.workload: 0 for r in roles})
    waiting: dict[str, int] = {}
    said: list[tuple[str, str]] = []  # (reason, message) of each role with groups waiting
    admitted_notes: list[str] = []
    for role in roles:
        by_group = {group: wl for wl in workloads if _current(wl, role.uid)
                    and (group := _group(wl)) is not None and group < role.groups}
        pending = [g for g in range(role.groups) if g not in by_group or not _admitted(by_group[g])]
        # A group without a Workload is not known to wait: its pods are gated only once Kueue marks
        # the set (a moment after creation, or never if Kueue does not manage it).
        waiting[role.workload] = sum(g in by_group for g in pending)
        if not pending:
            admitted_notes.append(f"{role.where}: {role.groups}/{role.groups} in LocalQueue {role.queue}")
            continue
        first = pending[0]
        head = (f"{role.where}: {len(pending)} of {role.groups} group(s) wait in LocalQueue {role.queue}, "
                "holding no GPU")
        if first not in by_group:
            said.append((NO_WORKLOAD, f"{head}; group {first} has no Workload yet (Kueue has not taken the "
                                      "LeaderWorkerSet in: is its leaderworkerset integration enabled?)"))
            continue
        reason, detail = _why(by_group[first])
        said.append((reason, f"{head}; Kueue on group {first}: {detail}"))
    if said:
        return Admission(Verdict("False", said[0][0], "; ".join(m for _, m in said)), waiting)
    return Admission(Verdict("True", ADMITTED, "Kueue admitted every group: " + "; ".join(admitted_notes)), waiting)
