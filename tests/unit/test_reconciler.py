"""The reconcile pass against an in-memory cluster: what it applies, prunes and writes."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kimik3_operator.api.reasons import (
    APPLY_REJECTED,
    CHAT_TEMPLATE_INVALID,
    INSUFFICIENT_CAPACITY,
    INSUFFICIENT_MEMORY,
    INVALID_SPEC,
    MISSING_DEPENDENCY,
    NO_MATCHING_NODES,
    WEIGHTS_STAGING,
)
from kimik3_operator.contract.names import ANNOTATION_HASH, FIELD_MANAGER
from kimik3_operator.k8s import ApplyResult
from kimik3_operator.reconcile.reconciler import Pass, reconcile
from tests.support.cases import base_deployment
from tests.support.memory_cluster import NODES, MemoryCluster, NoDra, pd_body, staged
from tests.support.nodes import b200_nodes


def test_weights_are_staged_before_anything_serves_then_steady_state_writes_nothing() -> None:
    cluster = MemoryCluster(pd_body(), NODES)
    first = reconcile(Pass(cluster, "ns", "k3", now=lambda: "2026-11-30T00:00:00Z"))
    # the staging Job's identity, and the routers' (they may run while a new revision stages)
    assert sorted(k.split("/")[0] for k in first.applied) == [
        "ConfigMap", "Job", "PersistentVolumeClaim", "Role", "Role", "RoleBinding", "RoleBinding",
        "ServiceAccount", "ServiceAccount"]
    status = cluster.deployment["status"]
    assert status["phase"] == "Progressing"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", WEIGHTS_STAGING)
    assert [w["phase"] for w in status["weights"]] == ["Pending"]
    cluster.finish_staging()
    second = reconcile(Pass(cluster, "ns", "k3", now=lambda: "2026-11-30T00:01:00Z"))
    # 2 leader Services, 1 ComputeDomain, 2 LWS, the router's Service and Deployment, the
    # disruption budgets of both roles and of the router, and the engines' and routers' NetworkPolicies
    assert len(second.applied) == 12 and second.status_written
    (weights,) = cluster.deployment["status"]["weights"]
    assert weights["phase"] == "Staged" and weights["commit"] == "c0ffee" * 6 + "c0ff"
    lws = cluster.objects[("LeaderWorkerSet", "k3-gb300-decode")]
    (wait,) = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["initContainers"]
    assert wait["command"][4] == weights["commit"]  # python3 -c SCRIPT DEST COMMIT TIMEOUT
    cluster.writes.clear()
    third = reconcile(Pass(cluster, "ns", "k3", now=lambda: "2026-11-30T00:02:00Z"))
    assert (third.applied, third.deleted, third.status_written) == ([], [], False)
    assert cluster.writes == []


def test_a_new_revision_stages_beside_what_serves() -> None:
    cluster = staged(MemoryCluster(pd_body(), NODES))
    reconcile(Pass(cluster, "ns", "k3"))
    serving = {k: v for k, v in cluster.objects.items() if k[0] == "LeaderWorkerSet"}
    cluster.deployment["spec"]["model"]["revision"] = "v2"
    outcome = reconcile(Pass(cluster, "ns", "k3"))
    assert [k for k in outcome.applied if not k.startswith(("ConfigMap/", "Job/", "Role/"))] == []
    assert sorted(k.split("/")[0] for k in outcome.deleted) == ["ConfigMap", "Job"]  # the old revision's
    assert {k: v for k, v in cluster.objects.items() if k[0] == "LeaderWorkerSet"} == serving
    assert cluster.deployment["status"]["phase"] == "Progressing"


def test_removed_pool_is_pruned_and_foreign_objects_are_kept() -> None:
    cluster = staged(MemoryCluster(pd_body(), NODES))
    reconcile(Pass(cluster, "ns", "k3"))
    foreign = {"kind": "Service", "apiVersion": "v1", "metadata": {
        "name": "someone-elses", "namespace": "ns", "annotations": {},
        "ownerReferences": [{"uid": "other", "controller": True}]}}
    cluster.objects[("Service", "someone-elses")] = foreign
    body = pd_body()
    body["spec"]["pools"] = [{"name": "gb300", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB300"},
                              "aggregated": {"replicas": 1, "parallelism": {"tensor": 8}}}]
    h = cluster.deployment["status"]["engine"]["compatibilityHash"]
    cluster.deployment["spec"] = body["spec"]
    outcome = reconcile(Pass(cluster, "ns", "k3"))
    # the P/D router goes with the P/D roles; the aggregated one takes its Service's name
    assert sorted(outcome.deleted) == ["ComputeDomain/k3-gb300-decode-cd", f"Deployment/k3-router-{h[:10]}",
                                       "LeaderWorkerSet/k3-b200-prefill",
                                       "LeaderWorkerSet/k3-gb300-decode", "PodDisruptionBudget/k3-b200-prefill",
                                       "PodDisruptionBudget/k3-gb300-decode", "Service/k3-b200-prefill-leader",
                                       "Service/k3-gb300-decode-leader"]
    assert ("Service", "someone-elses") in cluster.objects


def test_unplannable_spec_changes_nothing_that_runs() -> None:
    cluster = staged(MemoryCluster(pd_body(), NODES))
    reconcile(Pass(cluster, "ns", "k3"))
    before = copy.deepcopy(cluster.objects)
    cluster.deployment["spec"]["pools"][0]["decode"]["parallelism"] = {"tensor": 4}  # 400 GB of weights per GPU
    outcome = reconcile(Pass(cluster, "ns", "k3"))
    assert outcome.error is not None and outcome.error.reason == INSUFFICIENT_MEMORY
    assert outcome.applied == [] and outcome.deleted == [] and cluster.objects == before
    ready = next(c for c in cluster.deployment["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == INSUFFICIENT_MEMORY


def test_schema_invalid_body_gets_invalid_spec_status() -> None:
    cluster = MemoryCluster(pd_body(), NODES)
    cluster.deployment["spec"]["pools"][0]["decode"]["parallelism"]["tensor"] = 5
    outcome = reconcile(Pass(cluster, "ns", "k3"))
    assert outcome.error is not None and outcome.error.reason == INVALID_SPEC
    assert "96 KDA heads" in outcome.error.message
    assert cluster.objects == {}


def test_a_missing_kind_is_a_condition_not_a_crash() -> None:
    cluster = staged(NoDra(pd_body(), NODES))
    outcome = reconcile(Pass(cluster, "ns", "k3"))
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
    assert reconcile(Pass(cluster, "ns", "k3")).error is None
    before = copy.deepcopy(cluster.objects)
    cluster.nodes = []  # relabelled, cordoned or deleted
    cluster.active = [_pod("b200", "b200-0"), _pod("b200", "b200-1")]
    outcome = reconcile(Pass(cluster, "ns", "k3"))
    assert outcome.error is not None and outcome.error.reason == NO_MATCHING_NODES
    assert outcome.error.depends_on_nodes
    assert "its pods still run on b200-0, b200-1" in outcome.error.message
    assert outcome.applied == [] and outcome.deleted == [] and cluster.objects == before


def test_a_pool_without_running_pods_is_still_planned_ahead_of_its_nodes() -> None:
    cluster = MemoryCluster(_b200_ahead_of_nodes(), [])
    cluster.active = [_pod("b200", None)]
    outcome = reconcile(Pass(cluster, "ns", "k3"))
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

    cluster = staged(Immutable(pd_body(), NODES))
    reconcile(Pass(cluster, "ns", "k3"))
    cluster.deployment["spec"]["model"]["cache"] = {"storageClassName": "other"}
    outcome = reconcile(Pass(cluster, "ns", "k3"))
    assert outcome.error is not None and outcome.error.reason == APPLY_REJECTED
    ready = next(c for c in cluster.deployment["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == APPLY_REJECTED and "spec is immutable" in ready["message"]
    assert ("LeaderWorkerSet", "k3-gb300-decode") in cluster.objects  # what serves is left alone


# ---- the routers and the rollout of a new P/D revision -------------------------------------------

def _leader(pool: str, role: str, ip: str, compat: str, ready: bool = True, index: str = "0",
            **meta: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": f"{pool}-{role}-{ip}", **meta, "labels": {
                "serving.kimik3.dev/deployment": "k3", "serving.kimik3.dev/pool": pool,
                "serving.kimik3.dev/role": role, "serving.kimik3.dev/compat-hash": compat,
                "leaderworkerset.sigs.k8s.io/worker-index": index}},
            "spec": {"nodeName": "node", "containers": []},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _compat(cluster: MemoryCluster) -> str:
    return cluster.deployment["status"]["engine"]["compatibilityHash"]  # type: ignore[no-any-return]


def _routers(cluster: MemoryCluster) -> dict[str, int]:
    """Router Deployment -> replicas."""
    return {n: o["spec"]["replicas"] for (k, n), o in cluster.objects.items() if k == "Deployment"}


def _partition(cluster: MemoryCluster, lws: str) -> int:
    spec = cluster.objects[("LeaderWorkerSet", lws)]["spec"]
    return int(spec["rolloutStrategy"]["rollingUpdateConfiguration"].get("partition", 0))


def _serving_pd(pods: list[dict[str, Any]]) -> MemoryCluster:
    cluster = staged(MemoryCluster(pd_body(), NODES))
    cluster.active = pods
    return cluster


def test_the_router_runs_before_any_engine_is_ready_and_engines_coming_and_going_never_touch_it() -> None:
    pods: list[dict[str, Any]] = []
    cluster = _serving_pd(pods)
    reconcile(Pass(cluster, "ns", "k3"))
    h = _compat(cluster)
    router = f"k3-router-{h[:10]}"
    assert _routers(cluster) == {router: 2}  # not paused, not 0: it finds the engines itself
    pods += [_leader("b200", "prefill", "10.0.0.5", h), _leader("gb300", "decode", "10.0.1.70", h),
             _leader("gb300", "decode", "10.0.1.8", h),
             _leader("gb300", "decode", "10.0.1.9", h, ready=False),  # starting
             _leader("gb300", "decode", "10.0.1.10", h, index="1"),  # a worker serves no HTTP
             _leader("gb300", "decode", "10.0.1.11", h, deletionTimestamp="2026-11-30T00:00:00Z"),
             _leader("gb300", "decode", "10.0.1.12", h, namespace="other")]  # another deployment's
    outcome = reconcile(Pass(cluster, "ns", "k3"))
    assert not [k for k in outcome.applied if k.startswith("Deployment/")]
    (status,) = cluster.deployment["status"]["routers"]
    assert (status["prefillWorkers"], status["decodeWorkers"], status["compatibilityHash"]) == (1, 2, h)
    assert cluster.deployment["status"]["endpoint"] == "http://k3-router.ns.svc:8000"
    assert cluster.deployment["status"]["routableCapacityPercent"] == 100

    pods[1] = _leader("gb300", "decode", "10.0.1.71", h)  # replaced: same leader, new IP
    assert not [k for k in reconcile(Pass(cluster, "ns", "k3")).applied if k.startswith("Deployment/")]
    cluster.writes.clear()
    assert reconcile(Pass(cluster, "ns", "k3")).applied == []
    assert not [w for w in cluster.writes if w.startswith("apply")]


def _routing_pd() -> tuple[MemoryCluster, list[dict[str, Any]], str]:
    """A P/D deployment with one routable prefill (10.0.0.5) and two decodes (10.0.1.5, .6)."""
    pods: list[dict[str, Any]] = []
    cluster = _serving_pd(pods)
    reconcile(Pass(cluster, "ns", "k3"))
    compat = _compat(cluster)
    pods += [_leader("b200", "prefill", "10.0.0.5", compat), _leader("gb300", "decode", "10.0.1.5", compat),
             _leader("gb300", "decode", "10.0.1.6", compat)]
    reconcile(Pass(cluster, "ns", "k3"))
    return cluster, pods, compat


def _router_pod(revision: str, ip: str, ready: bool = True, **meta: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": f"router-{ip}", **meta, "labels": {
                "serving.kimik3.dev/deployment": "k3", "app.kubernetes.io/component": "router",
                "serving.kimik3.dev/router": "k3-router", "serving.kimik3.dev/router-revision": revision}},
            "spec": {"nodeName": "node", "containers": []},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_a_pd_rollout_serves_both_revisions_and_holds_the_old_groups_until_the_new_ones_fill() -> None:
    cluster, pods, old = _routing_pd()
    pods += [_router_pod(old, "10.0.9.1"), _router_pod(old, "10.0.9.2")]
    # enters the compatibility hash (fp8 is the default on these Blackwell pools)
    cluster.deployment["spec"]["engine"] = {"kvCacheDtype": "auto"}
    reconcile(Pass(cluster, "ns", "k3"))
    new = _compat(cluster)
    assert new != old
    # nothing new is Ready: every old group is held; only the surge groups start on the new template
    assert (_partition(cluster, "k3-b200-prefill"), _partition(cluster, "k3-gb300-decode")) == (1, 2)
    assert _routers(cluster) == {f"k3-router-{old[:10]}": 2, f"k3-router-{new[:10]}": 1}
    pods.append(_router_pod(new, "10.0.9.3", ready=False))  # no engine of its revision yet
    pods.append(_leader("b200", "prefill", "10.0.0.6", new))  # the new prefill is up, no new decode yet
    reconcile(Pass(cluster, "ns", "k3"))
    assert (_partition(cluster, "k3-b200-prefill"), _partition(cluster, "k3-gb300-decode")) == (1, 2)
    assert cluster.deployment["status"]["routableCapacityPercent"] == 100  # the old revision whole
    pods.append(_leader("gb300", "decode", "10.0.1.7", new))  # a new pair: both revisions serve
    pods[-3] = _router_pod(new, "10.0.9.3")
    reconcile(Pass(cluster, "ns", "k3"))
    assert _routers(cluster) == {f"k3-router-{old[:10]}": 1, f"k3-router-{new[:10]}": 1}
    # every role keeps its old group 0 (the old router keeps a whole pair) and rolls the others
    assert (_partition(cluster, "k3-b200-prefill"), _partition(cluster, "k3-gb300-decode")) == (1, 1)
    assert cluster.deployment["status"]["routableCapacityPercent"] == 150  # 3 decodes routed of 2
    del pods[2]  # the old decode group 1 ...
    pods.append(_leader("gb300", "decode", "10.0.1.8", new))  # ... replaced by a new one: every role full
    outcome = reconcile(Pass(cluster, "ns", "k3"))
    # the old router goes first, its pairs held until its pods are gone; a pass looks again soon
    assert _routers(cluster) == {f"k3-router-{new[:10]}": 2}
    assert (_partition(cluster, "k3-b200-prefill"), _partition(cluster, "k3-gb300-decode")) == (1, 1)
    assert outcome.due is not None and outcome.due <= 2
    pods[2] = _router_pod(old, "10.0.9.1", deletionTimestamp="2999-01-01T00:00:00Z")  # draining
    del pods[3]  # the other one gone
    assert reconcile(Pass(cluster, "ns", "k3")).due is not None
    assert (_partition(cluster, "k3-b200-prefill"), _partition(cluster, "k3-gb300-decode")) == (1, 1)
    del pods[2]  # the old router's pods are gone: the last old groups go
    assert reconcile(Pass(cluster, "ns", "k3")).due is None
    assert (_partition(cluster, "k3-b200-prefill"), _partition(cluster, "k3-gb300-decode")) == (0, 0)
    assert [p["metadata"]["labels"].get("serving.kimik3.dev/compat-hash") for p in pods[:2]] == [old, old]
    del pods[:2]
    reconcile(Pass(cluster, "ns", "k3"))
    assert _routers(cluster) == {f"k3-router-{new[:10]}": 2}
    assert cluster.deployment["status"]["routers"][0]["compatibilityHash"] == new
    assert cluster.deployment["status"]["routableCapacityPercent"] == 100


def test_routers_follow_the_serving_leaders_while_a_new_revision_stages() -> None:
    cluster, pods, h = _routing_pd()
    workloads = {k: v for k, v in cluster.objects.items() if k[0] == "LeaderWorkerSet"}
    routers = _routers(cluster)
    cluster.deployment["spec"]["model"]["revision"] = "v2"
    reconcile(Pass(cluster, "ns", "k3"))
    pods[1] = _leader("gb300", "decode", "10.0.1.9", h)
    reconcile(Pass(cluster, "ns", "k3"))
    assert _routers(cluster) == routers
    (serving,) = [r for r in cluster.deployment["status"]["routers"] if r["compatibilityHash"] == h]
    assert serving["decodeWorkers"] == 2
    assert {k: v for k, v in cluster.objects.items() if k[0] == "LeaderWorkerSet"} == workloads


def test_no_router_replicas_is_no_router_and_the_endpoint_falls_back() -> None:
    cluster = staged(MemoryCluster(pd_body(), NODES))
    reconcile(Pass(cluster, "ns", "k3"))
    h = _compat(cluster)
    cluster.deployment["spec"]["router"] = {"replicas": 0}
    outcome = reconcile(Pass(cluster, "ns", "k3"))
    assert sorted(outcome.deleted) == [f"Deployment/k3-router-{h[:10]}", "NetworkPolicy/k3-routers",
                                       "PodDisruptionBudget/k3-router", "Service/k3-router"]
    status = cluster.deployment["status"]
    assert status["endpoint"] == "http://k3-gb300-decode-leader.ns.svc:8000" and status["routers"] == []
    assert "do not disaggregate" in status["routing"]


# ---- replicas changed through /scale ---------------------------------------------------------------

DECODE, PREFILL = ("LeaderWorkerSet", "k3-gb300-decode"), ("LeaderWorkerSet", "k3-b200-prefill")


def _ready_pd() -> MemoryCluster:
    """The P/D deployment Ready: both roles' groups (2 decode, 1 prefill) and the router's pods
    reported ready and updated by their controllers; nothing left to write."""
    cluster, _, h = _routing_pd()
    for key, replicas in ((DECODE, 2), (PREFILL, 1), (("Deployment", f"k3-router-{h[:10]}"), 2)):
        cluster.report(*key, replicas)
    reconcile(Pass(cluster, "ns", "k3"))
    assert cluster.deployment["status"]["phase"] == "Ready"
    cluster.writes.clear()
    return cluster


def _role(cluster: MemoryCluster, role: str) -> dict[str, Any]:
    return next(r for p in cluster.deployment["status"]["pools"] for r in p["roles"] if r["role"] == role)


def _ready_condition(cluster: MemoryCluster) -> dict[str, Any]:
    return next(c for c in cluster.deployment["status"]["conditions"] if c["type"] == "Ready")


@pytest.mark.parametrize("restarted", [False, True], ids=["same-process", "restarted"])
def test_a_write_through_scale_is_taken_back_and_the_status_counts_what_runs(restarted: bool) -> None:
    cluster = _ready_pd()
    if restarted:
        cluster.applied.clear()  # the operator restarted, or another replica took over: no record
    cluster.scale("k3-gb300-decode", 3)
    cluster.report(*DECODE, 3)  # the LWS controller acted first: a third group runs
    outcome = reconcile(Pass(cluster, "ns", "k3"))
    assert outcome.applied == ["LeaderWorkerSet/k3-gb300-decode"]
    lws = cluster.objects[DECODE]
    assert lws["spec"]["replicas"] == 2
    (ours,) = [e for e in lws["metadata"]["managedFields"] if e["manager"] == FIELD_MANAGER]
    assert "f:replicas" in ours["fieldsV1"]["f:spec"]  # ours again
    # Until the LWS controller has scaled back down, the status says what runs, and not Ready.
    status = cluster.deployment["status"]
    assert (status["phase"], status["readySummary"]) == ("Progressing", "4/3")
    assert (_role(cluster, "decode")["replicas"], _role(cluster, "decode")["readyReplicas"]) == (2, 3)
    assert _ready_condition(cluster)["status"] == "False"
    assert (f"pool gb300 role decode: 3/2 ready, 3 updated, 3 groups running, generation "
            f"{lws['metadata']['generation']} not observed yet") in _ready_condition(cluster)["message"]

    cluster.report(*DECODE, 2)  # the third group is gone
    outcome = reconcile(Pass(cluster, "ns", "k3"))
    assert outcome.applied == [] and outcome.status_written
    assert (cluster.deployment["status"]["phase"], cluster.deployment["status"]["readySummary"]) == ("Ready", "3/3")
    cluster.writes.clear()
    reconcile(Pass(cluster, "ns", "k3"))
    assert cluster.writes == []


def test_a_scale_the_lws_controller_has_not_acted_on_is_not_ready_either() -> None:
    """Taken back before any group moved: the counts are of the generation /scale made, so the
    status waits for the LWS controller to report on the one the operator restored."""
    cluster = _ready_pd()
    cluster.applied.clear()
    cluster.scale("k3-gb300-decode", 1)
    assert reconcile(Pass(cluster, "ns", "k3")).applied == ["LeaderWorkerSet/k3-gb300-decode"]
    assert cluster.objects[DECODE]["spec"]["replicas"] == 2
    assert cluster.deployment["status"]["phase"] == "Progressing"
    generation = cluster.objects[DECODE]["metadata"]["generation"]
    assert f"role decode: 2/2 ready, 2 updated, generation {generation} not observed yet" \
        in _ready_condition(cluster)["message"]
    cluster.report(*DECODE, 2)
    assert reconcile(Pass(cluster, "ns", "k3")).applied == []
    assert cluster.deployment["status"]["phase"] == "Ready"


def test_the_lws_controllers_status_writes_are_not_drift() -> None:
    cluster = _ready_pd()
    cluster.report(*DECODE, 2, ready=1)  # a pod of one group is not ready any more
    outcome = reconcile(Pass(cluster, "ns", "k3"))
    assert outcome.applied == [] and outcome.status_written
    assert _role(cluster, "decode")["readyReplicas"] == 1 and cluster.deployment["status"]["phase"] == "Progressing"
    cluster.report(*DECODE, 2)
    cluster.report(*DECODE, 2)  # the same counts written again
    reconcile(Pass(cluster, "ns", "k3"))
    cluster.writes.clear()
    reconcile(Pass(cluster, "ns", "k3"))
    assert cluster.writes == [] and cluster.deployment["status"]["phase"] == "Ready"


def test_a_broken_chat_template_keeps_engines_from_rolling_onto_it_until_it_is_fixed() -> None:
    """engine.chatTemplate is compiled (jinja's sandbox, as vLLM does) before a LeaderWorkerSet is
    created or changed; while it is missing or broken nothing serving is applied and the status
    says why; between rolls the ConfigMap is not read at all."""
    body = pd_body()
    body["spec"]["engine"] = {"chatTemplate": {"name": "tmpl", "key": "chat.jinja"}}
    cluster = staged(MemoryCluster(body, NODES))
    cluster.writes.clear()
    outcome = reconcile(Pass(cluster, "ns", "k3"))
    ready = next(c for c in cluster.deployment["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == CHAT_TEMPLATE_INVALID and "ConfigMap tmpl" in ready["message"]
    assert not any(k == "LeaderWorkerSet" for k, _ in cluster.objects) and not outcome.applied
    cluster.config_maps["tmpl"] = {"chat.jinja": "{% for m in messages %}{{ m.content }"}
    reconcile(Pass(cluster, "ns", "k3"))
    ready = next(c for c in cluster.deployment["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == CHAT_TEMPLATE_INVALID and "does not compile" in ready["message"]
    cluster.config_maps["tmpl"] = {"chat.jinja": "{% for m in messages %}{{ m.content }}{% endfor %}"}
    reconcile(Pass(cluster, "ns", "k3"))
    assert sum(1 for k, _ in cluster.objects if k == "LeaderWorkerSet") == 2
    cluster.writes.clear()
    reconcile(Pass(cluster, "ns", "k3"))
    assert cluster.writes == []  # steady state: no apply, and no read of the ConfigMap either
def test_in_the_reconciler_adding_a_decode_pool_with_a_hash_change_keeps_the_old_router() -> None:
    cluster, pods, old = _routing_pd()
    pods += [_router_pod(old, "10.0.9.1"), _router_pod(old, "10.0.9.2")]
    cluster.deployment["spec"]["engine"] = {"kvCacheDtype": "auto"}  # enters the compatibility hash
    cluster.deployment["spec"]["pools"].append(
        {"name": "gb300b", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB300"},
         "decode": {"replicas": 1, "parallelism": {"tensor": 8}}})
    reconcile(Pass(cluster, "ns", "k3"))
    assert _compat(cluster) != old
    assert f"k3-router-{old[:10]}" in _routers(cluster)  # main: deleted, only the unready new router is left




def test_a_rollout_with_no_room_for_its_surge_group_says_why_and_keeps_the_old_revision_whole() -> None:
    """Two B200 nodes hold the one DEP16 prefill replica and nothing beside it: the held rollout's
    surge group cannot be placed, so the rollout cannot move. The status says so, with the way out,
    and the old revision keeps all its groups."""
    pods: list[dict[str, Any]] = []
    cluster = staged(MemoryCluster(pd_body(), [n for n in NODES if "b200" not in n["metadata"]["name"]]
                                   + b200_nodes(2)))
    cluster.active = pods
    reconcile(Pass(cluster, "ns", "k3"))
    old = _compat(cluster)
    pods += [_leader("b200", "prefill", "10.0.0.5", old), _leader("gb300", "decode", "10.0.1.5", old),
             _leader("gb300", "decode", "10.0.1.6", old), _router_pod(old, "10.0.9.1")]
    reconcile(Pass(cluster, "ns", "k3"))
    assert not any("rollout" in c["message"] for c in cluster.deployment["status"]["conditions"])
    cluster.deployment["spec"]["engine"] = {"kvCacheDtype": "auto"}
    reconcile(Pass(cluster, "ns", "k3"))
    assert (_partition(cluster, "k3-b200-prefill"), _partition(cluster, "k3-gb300-decode")) == (1, 2)
    degraded = next(c for c in cluster.deployment["status"]["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == INSUFFICIENT_CAPACITY
    assert degraded["message"].startswith("pool b200 role prefill: the rollout needs room for 1 new group(s) "
                                          "beside its 1 serving and the nodes hold 0")
    assert "gb300" not in degraded["message"]  # the decode's surge group fits
    assert cluster.deployment["status"]["routableCapacityPercent"] == 100
