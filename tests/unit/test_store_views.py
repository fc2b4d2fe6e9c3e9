"""What the node and capacity-pod informers keep (planner.facts.node_view,
planner.capacity.pod_gpu_view) is enough for their readers: planning over the views gives what it
gives over the whole objects, and a node heartbeat that changes nothing planning reads leaves the
store, its revision and the facts memo as they were."""

from __future__ import annotations

import copy
from typing import Any

from kimik3_operator.k8s.cache import active_pod_view
from kimik3_operator.k8s.informer import Informer, Watched
from kimik3_operator.planner.capacity import gpus_used
from kimik3_operator.planner.facts import node_facts, node_view
from kimik3_operator.reconcile.node_memo import FactsMemo
from tests.support.nodes import all_pools


def _as_served(node: dict[str, Any], version: int, beat: str = "2026-12-01T00:00:00Z") -> dict[str, Any]:
    """A fixture node as the API server sends it: identity, and the status a kubelet keeps writing."""
    node = copy.deepcopy(node)
    node["metadata"].update(uid=f"uid-{node['metadata']['name']}", resourceVersion=str(version),
                            managedFields=[{"manager": "kubelet", "operation": "Update"}],
                            annotations={"node.alpha.kubernetes.io/ttl": "0"})
    node["spec"]["taints"] = [{"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                              {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute",
                               "timeAdded": beat}]
    node["status"].update(
        conditions=[{"type": "Ready", "status": "True", "lastHeartbeatTime": beat}],
        addresses=[{"type": "InternalIP", "address": "10.0.0.1"}],
        images=[{"names": ["vllm/vllm-openai:v0.33.0"], "sizeBytes": 12_000_000_000}],
        nodeInfo={"kubeletVersion": "v1.36.5", "architecture": "arm64"})
    return node


def test_planning_reads_nothing_a_node_view_drops() -> None:
    nodes = [_as_served(n, i + 1) for i, n in enumerate(all_pools())]
    nodes[0]["spec"]["unschedulable"] = True
    for node in nodes:
        view = node_view(node)
        assert node_facts(view) == node_facts(node)
        assert "managedFields" not in view["metadata"] and "conditions" not in view["status"]


def test_the_capacity_check_reads_nothing_a_pod_view_drops() -> None:
    def pod(name: str, node: str, gpus: int, label: str | None, phase: str = "Running") -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": "7",
                             "labels": {"app": "x", **({"serving.kimik3.dev/deployment": label} if label else {})},
                             "managedFields": [{"manager": "kubelet"}]},
                "spec": {"nodeName": node, "containers": [
                    {"name": "main", "image": "i", "env": [{"name": "A", "value": "1"}],
                     "resources": {"requests": {"nvidia.com/gpu": str(gpus), "cpu": "8"}}},
                    {"name": "sidecar", "resources": {"requests": {"cpu": "1"}}}]},
                "status": {"phase": phase, "podIP": "10.1.1.1", "conditions": [{"type": "Ready", "status": "True"}]}}

    pods = [pod("mine", "n1", 4, "k3"), pod("theirs", "n1", 2, "other"), pod("plain", "n2", 8, None),
            pod("done", "n2", 8, None, phase="Succeeded")]
    views = [active_pod_view(p) for p in pods]

    def mine(p: Any) -> bool:
        return (p["metadata"].get("labels") or {}).get("serving.kimik3.dev/deployment") == "k3"
    assert gpus_used(views, mine) == gpus_used(pods, mine) == {"n1": 2, "n2": 8}
    assert views[0]["metadata"]["labels"] == {"serving.kimik3.dev/deployment": "k3"}
    assert [c["name"] for c in views[0]["spec"]["containers"]] == ["main"]


class _Stream(Informer):
    """An informer fed from a list of watch events instead of an API server."""

    events: list[tuple[str, dict[str, Any]]] = []

    def _get(self, path: str, query: list[tuple[str, Any]], read_timeout: float) -> Any:
        return None

    def _events(self, response: Any):  # type: ignore[override]
        yield from self.events


def test_a_heartbeat_leaves_the_node_store_and_the_facts_memo_as_they_were() -> None:
    (gb300, *_) = all_pools()
    informer = _Stream(None, Watched("v1", "Node"), view=node_view)  # type: ignore[arg-type]
    informer._replace({("", gb300["metadata"]["name"]): node_view(_as_served(gb300, 10))}, tell=False)
    memo = FactsMemo()
    selector = {"nvidia.com/gpu.product": gb300["metadata"]["labels"]["nvidia.com/gpu.product"]}
    nodes, revision = informer.items_at()
    first = memo.pool(selector, nodes, revision)

    informer.events = [("MODIFIED", _as_served(gb300, 11, beat="2026-12-01T00:00:40Z")),
                       ("MODIFIED", _as_served(gb300, 12, beat="2026-12-01T00:01:20Z"))]
    informer._watch("/api/v1/nodes")
    nodes, after = informer.items_at()
    assert after == revision and nodes[0]["metadata"]["resourceVersion"] == "10"
    assert memo.pool(selector, nodes, after) is first
    assert informer._version == "12"  # the watch still resumes from the newest event

    cordoned = _as_served(gb300, 13)
    cordoned["spec"]["unschedulable"] = True
    informer.events = [("MODIFIED", cordoned)]
    informer._watch("/api/v1/nodes")
    nodes, after = informer.items_at()
    # the GPU taint is kept (serving pods tolerate it), the node controller's come-and-go ones are not
    assert after > revision and nodes[0]["spec"] == {
        "unschedulable": True, "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}
    assert first.nodes and not memo.pool(selector, nodes, after).nodes  # a cordoned node is planned on no more


def test_a_child_is_kept_without_its_pod_template_and_judged_as_whole() -> None:
    """The drift check and the autoscaler's hand-over read the view as they read the object."""
    from kimik3_operator.contract.names import ANNOTATION_HASH, AUTOSCALER_FIELD_MANAGER, FIELD_MANAGER
    from kimik3_operator.k8s.cache import child_view
    from kimik3_operator.k8s.cluster import unchanged_since_our_apply, writes_digest
    from kimik3_operator.reconcile.autoscaler import owns_replicas

    template = {"spec": {"containers": [{"name": "vllm", "args": ["serve"] * 50}]}}
    ours = {"f:metadata": {"f:annotations": {f"f:{ANNOTATION_HASH}": {}}},
            "f:spec": {"f:leaderWorkerTemplate": {"f:leaderTemplate": {"f:spec": {}}}, "f:replicas": {}}}
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "metadata": {"name": "k3-a", "namespace": "ns", "uid": "u", "resourceVersion": "9",
                        "annotations": {ANNOTATION_HASH: "h1"}, "managedFields": [
                            {"manager": FIELD_MANAGER, "operation": "Apply", "time": "2026-12-01T00:00:00Z",
                             "fieldsType": "FieldsV1", "fieldsV1": ours},
                            {"manager": AUTOSCALER_FIELD_MANAGER, "operation": "Apply",
                             "time": "2026-12-01T00:00:01Z", "fieldsV1": {"f:spec": {"f:replicas": {}}}},
                            {"manager": "lws", "operation": "Update", "subresource": "status",
                             "time": "2026-12-01T00:00:02Z", "fieldsV1": {"f:status": {"f:replicas": {}}}}]},
           "spec": {"replicas": 2, "leaderWorkerTemplate": {"leaderTemplate": template, "size": 2}},
           "status": {"readyReplicas": 2}}
    view = child_view(copy.deepcopy(lws))
    assert view["spec"] == {"replicas": 2} and view["status"] == lws["status"]
    assert [e["manager"] for e in view["metadata"]["managedFields"]] == [FIELD_MANAGER, AUTOSCALER_FIELD_MANAGER]
    assert writes_digest(view) == writes_digest(lws)
    desired = {"metadata": {"annotations": {ANNOTATION_HASH: "h1"}}, "spec": {"replicas": 2}}
    for applied in (None, writes_digest(lws)):
        assert unchanged_since_our_apply(desired, view, applied) == unchanged_since_our_apply(desired, lws, applied)
    assert owns_replicas(view, AUTOSCALER_FIELD_MANAGER) and owns_replicas(lws, AUTOSCALER_FIELD_MANAGER)
    assert child_view(view) == view  # our own write's result goes through it again


def test_a_childs_status_is_kept_as_far_as_a_pass_reads_it() -> None:
    """A controller rewriting condition times or counts no pass reads changes nothing of the view,
    so it starts no pass; a count a pass reads does."""
    from kimik3_operator.k8s.cache import child_view

    def router(ready: int, stamp: str) -> dict[str, Any]:
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "r", "generation": 2},
                "spec": {"replicas": 1, "template": {"spec": {}}},
                "status": {"observedGeneration": 2, "replicas": 1, "readyReplicas": ready, "updatedReplicas": 1,
                           "availableReplicas": ready, "conditions": [
                               {"type": "Available", "status": "True", "lastUpdateTime": stamp,
                                "lastTransitionTime": stamp, "reason": "MinimumReplicasAvailable"}]}}

    assert child_view(router(0, "2026-12-01T00:00:00Z")) == child_view(router(0, "2026-12-01T00:00:07Z"))
    assert child_view(router(0, "2026-12-01T00:00:00Z")) != child_view(router(1, "2026-12-01T00:00:00Z"))
    assert child_view(router(1, "t"))["status"] == {"observedGeneration": 2, "replicas": 1, "readyReplicas": 1,
                                                    "updatedReplicas": 1}

    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
           "status": {"succeeded": 1, "ready": 0, "startTime": "t0", "completionTime": "t1", "conditions": [
               {"type": "Complete", "status": "True", "lastProbeTime": "t1", "lastTransitionTime": "t1",
                "message": "Reached expected number of succeeded pods"}]}}
    assert child_view(job)["status"] == {"succeeded": 1, "conditions": [
        {"type": "Complete", "status": "True", "message": "Reached expected number of succeeded pods"}]}
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "c"},
             "spec": {"volumeName": "pv"}, "status": {"phase": "Bound"}}
    assert "status" not in child_view(claim)
