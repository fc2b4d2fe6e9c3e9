"""The reconcile pass against an in-memory cluster: what it applies, prunes and writes."""

from __future__ import annotations

import copy
import json
from typing import Any

from kimik3_operator.api.reasons import (
    APPLY_REJECTED,
    INSUFFICIENT_MEMORY,
    INVALID_SPEC,
    MISSING_DEPENDENCY,
    NO_MATCHING_NODES,
    WEIGHTS_STAGING,
)
from kimik3_operator.contract.names import ANNOTATION_HASH
from kimik3_operator.k8s import ApplyResult
from kimik3_operator.reconcile.reconciler import reconcile
from tests.support.cases import base_deployment
from tests.support.nodes import b200_nodes, gb300_rack


class MemoryCluster:
    """Implements the Cluster methods reconcile uses; an apply of an identical object is a no-op."""

    def __init__(self, deployment: dict[str, Any], nodes: list[dict[str, Any]]) -> None:
        self.deployment = copy.deepcopy(deployment)
        self.deployment["metadata"].update(uid="uid-1", generation=1)
        self.nodes = nodes
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.writes: list[str] = []

    def finish_staging(self, commit: str = "c0ffee" * 6 + "c0ff") -> None:
        """Play the Job controller and kubelet: every staging Job succeeds, its pod reporting `commit`."""
        for (kind, name), job in self.objects.items():
            if kind == "Job":
                job["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
                record = json.dumps({"phase": "Complete", "commit": commit, "filesDone": 3, "filesTotal": 3})
                self.pods.append({"metadata": {"name": f"{name}-x", "creationTimestamp": "2026-11-30T00:00:00Z",
                                               "labels": {"batch.kubernetes.io/job-name": name}},
                                  "status": {"phase": "Succeeded", "containerStatuses": [
                                      {"state": {"terminated": {"exitCode": 0, "message": record}}}]}})

    def post_event(self, involved: dict[str, Any], namespace: str, type_: str, reason: str, message: str) -> None:
        self.writes.append(f"event {type_} {reason}")

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.pods)

    def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.deployment)

    def list_nodes(self) -> list[dict[str, Any]]:
        return self.nodes

    def list_active_pods(self) -> list[dict[str, Any]]:
        return []

    def list_children(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for o in self.objects.values()]

    def apply(self, desired: dict[str, Any], live: dict[str, Any] | None) -> ApplyResult:
        key = (desired["kind"], desired["metadata"]["name"])
        if live is not None and live["metadata"]["annotations"][ANNOTATION_HASH] == \
                desired["metadata"]["annotations"][ANNOTATION_HASH]:
            return ApplyResult(live, written=False)
        self.objects[key] = {**copy.deepcopy(desired), "status": {"readyReplicas": 0}}
        self.writes.append(f"apply {key}")
        return ApplyResult(self.objects[key], written=True)

    def delete(self, obj: dict[str, Any]) -> None:
        del self.objects[(obj["kind"], obj["metadata"]["name"])]
        self.writes.append(f"delete {obj['kind']}/{obj['metadata']['name']}")

    def apply_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.deployment["status"] = status
        self.writes.append("status")


def _pd() -> dict[str, Any]:
    body = base_deployment(name="k3", namespace="ns")
    body["spec"]["pools"] = [
        {"name": "gb300", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB300"},
         "decode": {"replicas": 2, "parallelism": {"tensor": 8}}},
        {"name": "b200", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-B200"},
         "prefill": {"replicas": 1, "parallelism": {"tensor": 8, "data": 2, "expert": True}}},
    ]
    return body


NODES = gb300_rack() + b200_nodes()


def _staged(cluster: MemoryCluster) -> MemoryCluster:
    reconcile(cluster, "ns", "k3")
    cluster.finish_staging()
    return cluster


def test_weights_are_staged_before_anything_serves_then_steady_state_writes_nothing() -> None:
    cluster = MemoryCluster(_pd(), NODES)
    first = reconcile(cluster, "ns", "k3", now=lambda: "2026-11-30T00:00:00Z")
    assert sorted(k.split("/")[0] for k in first.applied) == [
        "Job", "PersistentVolumeClaim", "Role", "RoleBinding", "ServiceAccount"]
    status = cluster.deployment["status"]
    assert status["phase"] == "Progressing"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", WEIGHTS_STAGING)
    assert [w["phase"] for w in status["weights"]] == ["Pending"]
    cluster.finish_staging()
    second = reconcile(cluster, "ns", "k3", now=lambda: "2026-11-30T00:01:00Z")
    assert len(second.applied) == 5 and second.status_written  # 2 Services, 1 ComputeDomain, 2 LWS
    (weights,) = cluster.deployment["status"]["weights"]
    assert weights["phase"] == "Staged" and weights["commit"] == "c0ffee" * 6 + "c0ff"
    lws = cluster.objects[("LeaderWorkerSet", "k3-gb300-decode")]
    (wait,) = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["initContainers"]
    assert wait["command"][4] == weights["commit"]  # python3 -c SCRIPT DEST COMMIT TIMEOUT
    cluster.writes.clear()
    third = reconcile(cluster, "ns", "k3", now=lambda: "2026-11-30T00:02:00Z")
    assert (third.applied, third.deleted, third.status_written) == ([], [], False)
    assert cluster.writes == []


def test_a_new_revision_stages_beside_what_serves() -> None:
    cluster = _staged(MemoryCluster(_pd(), NODES))
    reconcile(cluster, "ns", "k3")
    serving = {k: v for k, v in cluster.objects.items() if k[0] == "LeaderWorkerSet"}
    cluster.deployment["spec"]["model"]["revision"] = "v2"
    outcome = reconcile(cluster, "ns", "k3")
    assert [k for k in outcome.applied if not k.startswith(("Job/", "Role/"))] == []
    assert [k.split("/")[0] for k in outcome.deleted] == ["Job"]  # the old revision's Job
    assert {k: v for k, v in cluster.objects.items() if k[0] == "LeaderWorkerSet"} == serving
    assert cluster.deployment["status"]["phase"] == "Progressing"


def test_removed_pool_is_pruned_and_foreign_objects_are_kept() -> None:
    cluster = _staged(MemoryCluster(_pd(), NODES))
    reconcile(cluster, "ns", "k3")
    foreign = {"kind": "Service", "apiVersion": "v1", "metadata": {
        "name": "someone-elses", "namespace": "ns", "annotations": {},
        "ownerReferences": [{"uid": "other", "controller": True}]}}
    cluster.objects[("Service", "someone-elses")] = foreign
    body = _pd()
    body["spec"]["pools"] = [{"name": "gb300", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB300"},
                              "aggregated": {"replicas": 1, "parallelism": {"tensor": 8}}}]
    cluster.deployment["spec"] = body["spec"]
    outcome = reconcile(cluster, "ns", "k3")
    assert sorted(outcome.deleted) == ["ComputeDomain/k3-gb300-decode-cd", "LeaderWorkerSet/k3-b200-prefill",
                                       "LeaderWorkerSet/k3-gb300-decode", "Service/k3-b200-prefill-leader",
                                       "Service/k3-gb300-decode-leader"]
    assert ("Service", "someone-elses") in cluster.objects


def test_unplannable_spec_changes_nothing_that_runs() -> None:
    cluster = _staged(MemoryCluster(_pd(), NODES))
    reconcile(cluster, "ns", "k3")
    before = copy.deepcopy(cluster.objects)
    cluster.deployment["spec"]["pools"][0]["decode"]["parallelism"] = {"tensor": 4}  # 400 GB of weights per GPU
    outcome = reconcile(cluster, "ns", "k3")
    assert outcome.error is not None and outcome.error.reason == INSUFFICIENT_MEMORY
    assert outcome.applied == [] and outcome.deleted == [] and cluster.objects == before
    ready = next(c for c in cluster.deployment["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == INSUFFICIENT_MEMORY


def test_schema_invalid_body_gets_invalid_spec_status() -> None:
    cluster = MemoryCluster(_pd(), NODES)
    cluster.deployment["spec"]["pools"][0]["decode"]["parallelism"]["tensor"] = 5
    outcome = reconcile(cluster, "ns", "k3")
    assert outcome.error is not None and outcome.error.reason == INVALID_SPEC
    assert "96 KDA heads" in outcome.error.message
    assert cluster.objects == {}


def test_a_missing_kind_is_a_condition_not_a_crash() -> None:
    from kimik3_operator.k8s import MissingApiError

    class NoDra(MemoryCluster):
        def apply(self, desired: dict[str, Any], live: dict[str, Any] | None) -> ApplyResult:
            if desired["kind"] == "ComputeDomain":
                raise MissingApiError(desired["apiVersion"], desired["kind"])
            return super().apply(desired, live)

    cluster = _staged(NoDra(_pd(), NODES))
    outcome = reconcile(cluster, "ns", "k3")
    assert outcome.error is not None and outcome.error.reason == MISSING_DEPENDENCY
    ready = next(c for c in cluster.deployment["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == MISSING_DEPENDENCY and "NVIDIA's DRA driver" in ready["message"]


def _pod(pool: str, node: str | None) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "labels": {"serving.kimik3.dev/deployment": "k3",
                                                        "serving.kimik3.dev/pool": pool}},
            "spec": {"nodeName": node, "containers": []}, "status": {"phase": "Running" if node else "Pending"}}


def _b200_ahead_of_nodes() -> dict[str, Any]:
    body = base_deployment(name="k3", namespace="ns")
    body["spec"]["pools"] = [{"name": "b200", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-B200"},
                              "gpu": {"product": "B200"}, "aggregated": {"replicas": 1}}]
    return body


def test_a_pool_whose_nodes_went_away_keeps_its_serving_children() -> None:
    # gpu.product is set, so the pool could be planned without nodes; but its pods still run, and
    # a plan without the nodes' facts (RDMA device) would roll them onto nowhere.
    cluster = MemoryCluster(_b200_ahead_of_nodes(), b200_nodes())
    assert reconcile(cluster, "ns", "k3").error is None
    before = copy.deepcopy(cluster.objects)
    cluster.nodes = []  # relabelled, cordoned or deleted
    cluster.list_active_pods = lambda: [_pod("b200", "b200-0"), _pod("b200", "b200-1")]  # type: ignore[method-assign]
    outcome = reconcile(cluster, "ns", "k3")
    assert outcome.error is not None and outcome.error.reason == NO_MATCHING_NODES
    assert outcome.error.depends_on_nodes
    assert "its pods still run on b200-0, b200-1" in outcome.error.message
    assert outcome.applied == [] and outcome.deleted == [] and cluster.objects == before


def test_a_pool_without_running_pods_is_still_planned_ahead_of_its_nodes() -> None:
    cluster = MemoryCluster(_b200_ahead_of_nodes(), [])
    cluster.list_active_pods = lambda: [_pod("b200", None)]  # type: ignore[method-assign]
    outcome = reconcile(cluster, "ns", "k3")
    assert outcome.error is None and outcome.applied


def test_an_object_the_api_server_refuses_is_a_condition_not_a_retry_loop() -> None:
    from kimik3_operator.k8s import RejectedApiError

    class Immutable(MemoryCluster):
        def apply(self, desired: dict[str, Any], live: dict[str, Any] | None) -> ApplyResult:
            changed = live is not None and (live["metadata"]["annotations"][ANNOTATION_HASH]
                                            != desired["metadata"]["annotations"][ANNOTATION_HASH])
            if desired["kind"] == "PersistentVolumeClaim" and changed:
                raise RejectedApiError("PersistentVolumeClaim", desired["metadata"]["name"], 422,
                                       "spec is immutable after creation")
            return super().apply(desired, live)

    cluster = _staged(Immutable(_pd(), NODES))
    reconcile(cluster, "ns", "k3")
    cluster.deployment["spec"]["model"]["cache"] = {"storageClassName": "other"}
    outcome = reconcile(cluster, "ns", "k3")
    assert outcome.error is not None and outcome.error.reason == APPLY_REJECTED
    ready = next(c for c in cluster.deployment["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == APPLY_REJECTED and "spec is immutable" in ready["message"]
    assert ("LeaderWorkerSet", "k3-gb300-decode") in cluster.objects  # what serves is left alone
