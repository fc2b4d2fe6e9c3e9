"""Queued roles (spec queueName) and Kueue: the label on the LeaderWorkerSet, the Admitted verdict
from Kueue's Workloads (pure), and in a reconcile pass (in-memory cluster) the condition, its
events, the queued replicas in status and the pace of the Workload reads."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from kimik3_operator.api import KimiK3Deployment, reasons
from kimik3_operator.contract.kueue import GROUP_INDEX_ANNOTATION, JOB_UID_LABEL, QUEUE_LABEL
from kimik3_operator.k8s import RejectedApiError
from kimik3_operator.planner.queueing import QueuedRole, judge_admission
from kimik3_operator.reconcile.queueing import CHECK_SECONDS, MISSING_SECONDS, QueueProbe, kueue_groups
from kimik3_operator.reconcile.reconciler import Pass, reconcile
from tests.support.clocks import Clock
from tests.support.memory_cluster import NODES, MemoryCluster, pd_body, staged

DECODE = QueuedRole(where="pool gb300 role decode", workload="k3-gb300-decode", uid="u1", queue="gpus", groups=2)


def workload(uid: str, group: int, *, admitted: bool = False, reason: str = "Pending",
             message: str = "insufficient unused quota for nvidia.com/gpu in flavor gb300, 8 more needed",
             **meta: Any) -> dict[str, Any]:
    conditions = ([{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                   {"type": "Admitted", "status": "True", "reason": "Admitted"}] if admitted else
                  [{"type": "QuotaReserved", "status": "False", "reason": reason, "message": message}])
    return {"metadata": {"name": f"leaderworkerset-x-{group}", "labels": {JOB_UID_LABEL: uid},
                         "annotations": {GROUP_INDEX_ANNOTATION: str(group)}, **meta},
            "status": {"conditions": conditions}}


def test_no_queued_role_no_verdict() -> None:
    assert judge_admission([], []) is None


def test_every_group_admitted_is_true() -> None:
    verdict = judge_admission([DECODE], [workload("u1", 0, admitted=True), workload("u1", 1, admitted=True)])
    assert verdict is not None and (verdict.verdict.status, verdict.verdict.reason) == ("True", reasons.ADMITTED)
    assert verdict.waiting == {"k3-gb300-decode": 0}
    assert "pool gb300 role decode: 2/2 in LocalQueue gpus" in verdict.verdict.message


def test_a_waiting_group_is_false_with_kueues_reason_and_message() -> None:
    verdict = judge_admission([DECODE], [workload("u1", 0, admitted=True), workload("u1", 1)])
    assert verdict is not None and (verdict.verdict.status, verdict.verdict.reason) == ("False", "Pending")
    assert verdict.waiting == {"k3-gb300-decode": 1}
    assert "1 of 2 group(s) wait in LocalQueue gpus, holding no GPU; Kueue on group 1: insufficient unused quota" \
        in verdict.verdict.message


def test_workloads_of_other_sets_finished_deleted_or_beyond_the_groups_do_not_count() -> None:
    others = [workload("u2", 0, admitted=True),  # another LeaderWorkerSet's
              workload("u1", 1, admitted=True, deletionTimestamp="2026-12-04T00:00:00Z"),
              workload("u1", 5, admitted=True)]  # a group beyond spec.replicas
    finished = workload("u1", 0, admitted=True)
    finished["status"]["conditions"].append({"type": "Finished", "status": "True", "reason": "Succeeded"})
    verdict = judge_admission([DECODE], [*others, finished])
    assert verdict is not None and verdict.verdict.reason == reasons.NO_WORKLOAD
    assert verdict.waiting == {"k3-gb300-decode": 0}  # not known to wait: nothing gates pods without a Workload
    assert "group 0 has no Workload yet" in verdict.verdict.message


def test_without_kueue_the_queue_is_said_to_be_missing() -> None:
    verdict = judge_admission([DECODE], None)
    assert verdict is not None and (verdict.verdict.status, verdict.verdict.reason) == ("False", reasons.KUEUE_MISSING)
    assert "LocalQueue gpus" in verdict.verdict.message and "Kueue v0.17" in verdict.verdict.message


def test_several_roles_take_the_first_waiting_roles_reason_and_every_waiting_roles_message() -> None:
    prefill = QueuedRole(where="pool b200 role prefill", workload="k3-b200-prefill", uid="u2", queue="hgx", groups=1)
    verdict = judge_admission([DECODE, prefill], [workload("u1", 0, admitted=True), workload("u1", 1, admitted=True),
                                                  workload("u2", 0, reason="Inadmissible",
                                                           message="LocalQueue hgx doesn't exist")])
    assert verdict is not None and verdict.verdict.reason == "Inadmissible"
    assert verdict.waiting == {"k3-gb300-decode": 0, "k3-b200-prefill": 1}
    assert "pool b200 role prefill" in verdict.verdict.message and "doesn't exist" in verdict.verdict.message


class KueueCluster(MemoryCluster):
    """The in-memory cluster with Kueue's Workloads (None: no Kueue installed)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.workloads: list[dict[str, Any]] | None = []
        self.lists: list[tuple[str, ...]] = []
        self.fail = False

    def list_kueue_workloads(self, namespace: str, job_uids: Any) -> list[dict[str, Any]] | None:
        self.lists.append(tuple(job_uids))
        if self.fail:
            raise RejectedApiError("Workload", namespace, 403, "workloads.kueue.x-k8s.io is forbidden")
        return None if self.workloads is None else [
            w for w in self.workloads if w["metadata"]["labels"][JOB_UID_LABEL] in job_uids]


def _queued() -> dict[str, Any]:
    body = pd_body()
    body["spec"]["pools"][0]["decode"]["queueName"] = "gpus"
    return body


def _admitted(cluster: MemoryCluster) -> dict[str, Any] | None:
    return next((c for c in cluster.deployment.get("status", {}).get("conditions", []) if c["type"] == "Admitted"),
                None)


def _queued_replicas(cluster: MemoryCluster) -> dict[str, int]:
    return {r["role"]: r.get("queuedReplicas", 0) for p in cluster.deployment["status"]["pools"] for r in p["roles"]}


def test_a_queued_role_is_labelled_judged_and_read_at_its_pace() -> None:
    clock = Clock()
    probe = QueueProbe(clock=clock)
    cluster = staged(KueueCluster(_queued(), NODES), queues=probe)
    outcome = reconcile(Pass(cluster, "ns", "k3", queues=probe))
    decode = cluster.objects["LeaderWorkerSet", "k3-gb300-decode"]
    assert decode["metadata"]["labels"][QUEUE_LABEL] == "gpus"
    assert QUEUE_LABEL not in cluster.objects["LeaderWorkerSet", "k3-b200-prefill"]["metadata"]["labels"]
    uid = decode["metadata"]["uid"]
    condition = _admitted(cluster)
    assert condition is not None and (condition["status"], condition["reason"]) == ("False", reasons.NO_WORKLOAD)
    assert "event Normal NoWorkload" in cluster.writes  # for the moment Kueue takes to make them
    assert outcome.due is not None and outcome.due <= CHECK_SECONDS  # a pass comes back to see admission
    assert cluster.lists == [(uid,)]  # only the queued role's set

    # Kueue makes the Workloads, quota for one group: within CHECK_SECONDS nothing is read again.
    assert cluster.workloads is not None
    cluster.workloads += [workload(uid, 0, admitted=True), workload(uid, 1)]
    clock.now += CHECK_SECONDS - 1
    reconcile(Pass(cluster, "ns", "k3", queues=probe))
    assert len(cluster.lists) == 1 and _admitted(cluster)["reason"] == reasons.NO_WORKLOAD  # type: ignore[index]
    clock.now += 1
    cluster.writes.clear()
    reconcile(Pass(cluster, "ns", "k3", queues=probe))
    condition = _admitted(cluster)
    assert condition is not None and (condition["status"], condition["reason"]) == ("False", "Pending")
    assert _queued_replicas(cluster) == {"decode": 1, "prefill": 0}
    assert "event Normal Pending" in cluster.writes

    # Admitted: True, one Normal event; the same again writes nothing.
    cluster.workloads[1] = workload(uid, 1, admitted=True)
    clock.now += CHECK_SECONDS
    cluster.writes.clear()
    outcome = reconcile(Pass(cluster, "ns", "k3", queues=probe))
    condition = _admitted(cluster)
    assert condition is not None and (condition["status"], condition["reason"]) == ("True", reasons.ADMITTED)
    assert _queued_replicas(cluster) == {"decode": 0, "prefill": 0}
    assert "event Normal Admitted" in cluster.writes
    cluster.writes.clear()
    clock.now += CHECK_SECONDS
    reconcile(Pass(cluster, "ns", "k3", queues=probe))
    assert cluster.writes == []


@pytest.mark.parametrize(("workloads", "fail", "status", "reason"), [
    (None, False, "False", reasons.KUEUE_MISSING),
    ([], True, "Unknown", reasons.KUEUE_UNAVAILABLE),
])
def test_no_kueue_or_no_answer_is_said(workloads: list[dict[str, Any]] | None, fail: bool, status: str,
                                       reason: str) -> None:
    cluster = KueueCluster(_queued(), NODES)
    cluster.workloads, cluster.fail = workloads, fail
    staged(cluster)
    reconcile(Pass(cluster, "ns", "k3"))
    condition = _admitted(cluster)
    assert condition is not None and (condition["status"], condition["reason"]) == (status, reason)
    assert ("event Warning KueueMissing" in cluster.writes) == (reason == reasons.KUEUE_MISSING)


def test_an_unqueued_deployment_reads_no_workload_and_has_no_condition() -> None:
    cluster = staged(KueueCluster(pd_body(), NODES))
    reconcile(Pass(cluster, "ns", "k3"))
    assert cluster.lists == [] and _admitted(cluster) is None


@pytest.mark.parametrize("name", ["GPUs", "gpu_queue", "-gpus", "q" * 64])
def test_a_queue_name_is_a_label_value_kueue_accepts(name: str) -> None:
    body = _queued()
    body["spec"]["pools"][0]["decode"]["queueName"] = name
    with pytest.raises(ValidationError, match="queueName"):
        KimiK3Deployment.model_validate(body)


def test_quota_reserved_but_not_admitted_or_evicted_takes_that_conditions_reason() -> None:
    checks = workload("u1", 1, admitted=True)
    checks["status"]["conditions"][1] = {"type": "Admitted", "status": "False", "reason": "UnsatisfiedChecks",
                                         "message": "The workload has not all admission checks Ready"}
    verdict = judge_admission([DECODE], [workload("u1", 0, admitted=True), checks])
    assert verdict is not None and verdict.verdict.reason == "UnsatisfiedChecks" and verdict.waiting == {
        "k3-gb300-decode": 1}
    evicted = workload("u1", 1, admitted=True)
    evicted["status"]["conditions"].append({"type": "Evicted", "status": "True", "reason": "Preempted",
                                            "message": "Preempted to accommodate a workload of higher priority"})
    verdict = judge_admission([DECODE], [workload("u1", 0, admitted=True), evicted])
    assert verdict is not None and verdict.verdict.reason == "Preempted" and verdict.waiting == {"k3-gb300-decode": 1}


def test_a_surge_group_of_a_rolling_update_needs_quota_too() -> None:
    """Kueue makes a Workload per group up to status.replicas while a rollout surges: with quota for
    spec.replicas groups only, the surge group waits and the rollout with it; status says so."""
    clock = Clock()
    cluster = staged(KueueCluster(_queued(), NODES))
    reconcile(Pass(cluster, "ns", "k3", queues=QueueProbe(clock=clock)))
    decode = cluster.objects["LeaderWorkerSet", "k3-gb300-decode"]
    uid = decode["metadata"]["uid"]
    decode["status"] = {**decode.get("status", {}), "replicas": 3}  # 2 planned + 1 surging
    assert cluster.workloads is not None
    cluster.workloads += [workload(uid, 0, admitted=True), workload(uid, 1, admitted=True), workload(uid, 2)]
    reconcile(Pass(cluster, "ns", "k3", queues=QueueProbe(clock=clock)))
    condition = _admitted(cluster)
    assert condition is not None and (condition["status"], condition["reason"]) == ("False", "Pending")
    assert "1 of 3 group(s) wait" in condition["message"] and _queued_replicas(cluster)["decode"] == 1


@pytest.mark.parametrize(("spec", "status", "groups"), [
    ({"replicas": 2}, {"replicas": 2, "updatedReplicas": 2}, 2),
    # rolling with surge: the surge group has a Workload of its own
    ({"replicas": 2, "rolloutStrategy": {"rollingUpdateConfiguration": {"maxSurge": 1}}},
     {"replicas": 3, "updatedReplicas": 1}, 3),
    # scale-down 3 -> 2: status lags, but Kueue already deleted group 2's Workload
    ({"replicas": 2, "rolloutStrategy": {"rollingUpdateConfiguration": {"maxSurge": 1}}},
     {"replicas": 3, "updatedReplicas": 3}, 2),
    # no surge: a rollout replaces groups in place
    ({"replicas": 2, "rolloutStrategy": {"rollingUpdateConfiguration": {"maxSurge": 0, "maxUnavailable": 1}}},
     {"replicas": 3, "updatedReplicas": 0}, 2),
    # Go's IntValue() reads "25%" as 0 and "1" as 1
    ({"replicas": 2, "rolloutStrategy": {"rollingUpdateConfiguration": {"maxSurge": "25%"}}},
     {"replicas": 3, "updatedReplicas": 0}, 2),
    ({"replicas": 2, "rolloutStrategy": {"rollingUpdateConfiguration": {"maxSurge": "1"}}},
     {"replicas": 3, "updatedReplicas": 0}, 3),
    ({}, {}, 1),
])
def test_groups_are_counted_as_kueue_counts_them(spec: dict[str, Any], status: dict[str, Any], groups: int) -> None:
    assert kueue_groups({"spec": spec, "status": status}) == groups


def test_a_missing_kueue_is_asked_about_once_a_minute_not_every_pass() -> None:
    clock = Clock()
    probe = QueueProbe(clock=clock)
    cluster = KueueCluster(_queued(), NODES)
    cluster.workloads = None
    staged(cluster, queues=probe)
    outcome = reconcile(Pass(cluster, "ns", "k3", queues=probe))
    asked = len(cluster.lists)
    assert outcome.due == MISSING_SECONDS
    clock.now += CHECK_SECONDS * 3
    reconcile(Pass(cluster, "ns", "k3", queues=probe))
    assert len(cluster.lists) == asked
    clock.now += MISSING_SECONDS
    reconcile(Pass(cluster, "ns", "k3", queues=probe))
    assert len(cluster.lists) == asked + 1
