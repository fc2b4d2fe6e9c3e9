"""The walking skeleton end to end: a KimiK3Deployment becomes LeaderWorkerSets whose pods land on
the fake GPU nodes with the right shape, status follows readiness, deletion removes everything."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness.kube import apply, condition, delete_deployments, get_json, is_ready, kubectl, wait_for
from kimik3_operator.api.reasons import (
    ALL_REPLICAS_READY,
    INSUFFICIENT_CAPACITY,
    INSUFFICIENT_MEMORY,
    NO_MATCHING_NODES,
    PODS_NOT_READY,
    WEIGHTS_STAGING,
)
from tests.support.cases import base_deployment

pytestmark = pytest.mark.e2e

GB300 = {"nvidia.com/gpu.product": "NVIDIA-GB300"}
B200 = {"nvidia.com/gpu.product": "NVIDIA-B200"}
LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"


def pd_deployment(namespace: str, name: str = "k3") -> dict[str, Any]:
    body = base_deployment(name=name, namespace=namespace)
    body["spec"]["pools"] = [
        # TP8 on 4-GPU trays: 2 trays per replica, 3 replicas (6 trays across the two racks)
        {"name": "gb300", "nodeSelector": GB300, "decode": {"replicas": 3, "parallelism": {"tensor": 8}}},
        # DEP16 on 8-GPU HGX nodes: 2 nodes per replica
        {"name": "b200", "nodeSelector": B200,
         "prefill": {"replicas": 1, "parallelism": {"tensor": 8, "data": 2, "expert": True}}},
    ]
    return body


def _pods(namespace: str, name: str) -> list[dict[str, Any]]:
    """Serving pods (the staging Jobs' pods have no role)."""
    return get_json("pods", "-n", namespace, "-l",
                    f"serving.kimik3.dev/deployment={name},serving.kimik3.dev/role")["items"]


def test_deployment_becomes_leader_worker_sets(operator: Path, namespace: str) -> None:
    apply(pd_deployment(namespace))

    # Status: first the weights stage (nothing serves yet), then PodsNotReady (pods exist, kwok holds
    # readiness back for a moment), then Ready.
    seen: list[tuple[str, str]] = []
    pods_waiting_while_not_ready = False

    def observe() -> dict[str, Any] | None:
        nonlocal pods_waiting_while_not_ready
        cr = get_json("k3", "k3", "-n", namespace)
        ready = condition(cr, "Ready")
        if ready and (not seen or seen[-1] != (ready["status"], ready["reason"])):
            seen.append((ready["status"], ready["reason"]))
        if ready and ready["status"] == "False":
            pods = _pods(namespace, "k3")
            pods_waiting_while_not_ready |= bool(pods) and not all(map(is_ready, pods))
        return cr if ready and ready["status"] == "True" else None

    cr = wait_for("Ready=True", observe, timeout=180, interval=0.2)
    assert seen[0] == ("False", WEIGHTS_STAGING), seen
    assert ("False", PODS_NOT_READY) in seen, seen
    assert pods_waiting_while_not_ready, "never saw Ready=False while pods were still starting"
    assert seen[-1] == ("True", ALL_REPLICAS_READY)
    assert cr["status"]["observedGeneration"] == cr["metadata"]["generation"]
    assert cr["status"]["phase"] == "Ready"
    assert cr["status"]["readySummary"] == "4/4"
    assert cr["status"]["gpus"] == 3 * 8 + 16

    # Pods: replicas x nodes per replica per role, one pod per node, each takes the node's GPUs.
    pods = _pods(namespace, "k3")
    by_role: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for pod in pods:
        by_role[pod["metadata"]["labels"]["serving.kimik3.dev/role"]].append(pod)
    assert {r: len(p) for r, p in by_role.items()} == {"decode": 3 * 2, "prefill": 1 * 2}
    node_names = [p["spec"]["nodeName"] for p in pods]
    assert len(set(node_names)) == len(node_names), "two serving pods share a node"
    nodes = {n["metadata"]["name"]: n for n in get_json("nodes")["items"]}
    for pod in pods:
        node = nodes[pod["spec"]["nodeName"]]
        (container,) = pod["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == node["status"]["capacity"]["nvidia.com/gpu"]
        assert all(node["metadata"]["labels"].get(k) == v for k, v in pod["spec"]["nodeSelector"].items())

    # Every GB300 group sits in one NVLink clique.
    cliques: dict[str, set[str]] = defaultdict(set)
    for pod in by_role["decode"]:
        clique = nodes[pod["spec"]["nodeName"]]["metadata"]["labels"]["nvidia.com/gpu.clique"]
        cliques[pod["metadata"]["labels"][LWS_GROUP_KEY]].add(clique)
    assert len(cliques) == 3 and all(len(c) == 1 for c in cliques.values()), cliques

    # The endpoint is the P/D router, which finds every role's ready leader pods itself: one
    # Deployment for the serving revision, whose selectors name that revision.
    svc = get_json("service", "k3-gb300-decode-leader", "-n", namespace)
    assert svc["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    assert cr["status"]["endpoint"] == f"http://k3-router.{namespace}.svc:8000"
    (router,) = cr["status"]["routers"]
    assert (router["mode"], router["readyReplicas"], router["prefillWorkers"], router["decodeWorkers"]) == (
        "PrefillDecode", 2, 1, 3)
    compat = cr["status"]["engine"]["compatibilityHash"]
    assert router["name"] == f"k3-router-{compat[:10]}" and router["compatibilityHash"] == compat
    containers = get_json("deployment", router["name"], "-n", namespace)["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["front", "router"]  # clients reach the front only
    args = containers[1]["args"]
    assert "--prefill" not in args and "--decode" not in args  # no list to restart for
    for role in ("prefill", "decode"):
        selector = args[args.index(f"--{role}-selector") + 1].split(",")  # kimik3-router: one k=v,... value
        assert f"serving.kimik3.dev/role={role}" in selector and f"serving.kimik3.dev/compat-hash={compat}" in selector
    assert cr["status"]["routableCapacityPercent"] == 100
    printed = kubectl("get", "k3", "k3", "-n", namespace).stdout
    assert "Ready" in printed and "4/4" in printed and "40" in printed, printed

    # Deleting the deployment garbage-collects every child.
    kubectl("delete", "k3", "k3", "-n", namespace, "--wait=true", "--timeout=60s")

    def children_gone() -> bool:
        lws = get_json("leaderworkersets", "-n", namespace)["items"]
        owned = get_json("services,deployments", "-n", namespace, "-l", "serving.kimik3.dev/deployment=k3")["items"]
        return not lws and not owned and not _pods(namespace, "k3")

    wait_for("every child to be garbage-collected", children_gone, timeout=120)


def test_unservable_layout_is_reported_and_deploys_nothing(operator: Path, namespace: str) -> None:
    body = base_deployment(name="k3-small", namespace=namespace)
    body["spec"]["pools"] = [{"name": "b200", "nodeSelector": B200,
                              "aggregated": {"replicas": 1, "parallelism": {"tensor": 8}}}]
    apply(body)
    cr = wait_for("Ready condition", lambda: (c := get_json("k3", "k3-small", "-n", namespace)) and
                  condition(c, "Ready") and c, timeout=60)
    ready = condition(cr, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", INSUFFICIENT_MEMORY)
    assert "pool b200 role aggregated: 8 x B200 (TP8) needs 205.9 GB of weights" in ready["message"]
    assert "the smallest aggregated layout that fits is TP8 x PP2 (16 GPUs)" in ready["message"]
    assert cr["status"]["phase"] == "Failed"
    assert get_json("leaderworkersets", "-n", namespace)["items"] == []


def test_plan_reads_the_live_cluster(cluster: dict[str, str], tmp_path: Path) -> None:
    """`kimik3 plan` without --nodes plans against the nodes of the cluster in $KUBECONFIG."""
    cr = tmp_path / "cr.yaml"
    cr.write_text(yaml.safe_dump(pd_deployment("default")))
    kimik3 = Path(sys.executable).with_name("kimik3")
    run = subprocess.run([str(kimik3), "plan", "-f", str(cr), "-o", "json"], capture_output=True, text=True,
                         timeout=60)
    report = json.loads(run.stdout)
    # other tests' pods may hold the GPUs: exit 3 says so, with the same plan
    assert run.returncode == (0 if report["capacity"]["fits"] else 3), run.stderr
    assert {p["pool"] for p in report["capacity"]["pools"]} == {"gb300", "b200"}
    pools = {p["name"]: p for p in report["pools"]}
    assert pools["gb300"]["gpuProduct"] == "GB300" and pools["gb300"]["gpusPerNode"] == 4
    assert pools["b200"]["interconnect"] == "RDMA" and pools["b200"]["gpusPerNode"] == 8
    assert pools["b200"]["roles"][0]["all2allBackend"] == "deepep_v2"


def test_preflight_reads_the_live_cluster(cluster: dict[str, str]) -> None:
    """`kimik3 preflight` against the e2e cluster, which has every requirement a deployment needs:
    LeaderWorkerSet, GPU nodes with product labels (B200, B300, GB300, H200), NVL72 trays in cliques
    with ComputeDomains, RDMA on the HGX nodes, a default StorageClass. Exit 0, each found."""
    kimik3 = str(Path(sys.executable).with_name("kimik3"))
    run = subprocess.run([kimik3, "preflight", "-o", "json"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    found = {f["requirement"]: f for f in json.loads(run.stdout)}
    for needed in ("LeaderWorkerSet", "GPU nodes", "NVLink cliques", "ComputeDomain", "RDMA", "Storage",
                   "KEDA", "Kueue", "Gateway API"):
        assert found[needed]["verdict"] == "ok", found[needed]
    assert "GB300" in found["GPU nodes"]["found"] and "clique" in found["NVLink cliques"]["found"]


def test_plan_names_a_deployment_in_the_cluster(operator: Path, namespace: str, tmp_path: Path) -> None:
    """`kimik3 plan NAMESPACE/NAME` plans the deployment the API server holds, against the live
    nodes, as `-f` plans the same body; a name the cluster does not hold is one line, exit 1."""
    body = pd_deployment(namespace, name="k3-planned")
    apply(body)
    kimik3 = str(Path(sys.executable).with_name("kimik3"))
    try:
        named = subprocess.run([kimik3, "plan", f"{namespace}/k3-planned", "-o", "json"], capture_output=True,
                               text=True, timeout=60)
        cr = tmp_path / "cr.yaml"
        cr.write_text(yaml.safe_dump(body))
        filed = subprocess.run([kimik3, "plan", "-f", str(cr), "-o", "json"], capture_output=True, text=True,
                               timeout=60)
        assert named.returncode in (0, 3) and filed.returncode in (0, 3), named.stderr + filed.stderr
        assert json.loads(named.stdout)["pools"] == json.loads(filed.stdout)["pools"]
        missing = subprocess.run([kimik3, "plan", f"{namespace}/nothing-here"], capture_output=True, text=True,
                                 timeout=60)
        assert missing.returncode == 1
        assert missing.stderr == f"error: no KimiK3Deployment {namespace}/nothing-here in the cluster\n"
    finally:
        delete_deployments(namespace, "k3-planned")


def test_a_gateway_gets_a_route_the_api_server_accepts_and_loses_it_when_unset(operator: Path,
                                                                             namespace: str) -> None:
    """spec.router.gateway: the HTTPRoute the operator renders is accepted by the API server with
    Gateway API v1.7.0's own CRDs (their schema and CEL rules; e2e/cluster/build.sh), leads to the
    router's Service, and is pruned when the gateway is unset."""
    body = pd_deployment(namespace, name="k3-gw")
    body["spec"]["router"] = {"gateway": {"name": "public", "namespace": "gateways", "sectionName": "https",
                                          "hostnames": ["k3.example.com", "*.k3.example.com"]}}
    apply(body)
    try:
        route = wait_for("the HTTPRoute", lambda: next(iter(get_json(
            "httproutes.gateway.networking.k8s.io", "-n", namespace)["items"]), None), timeout=60)
        assert route["metadata"]["name"] == "k3-gw-router"
        assert route["metadata"]["ownerReferences"][0]["name"] == "k3-gw"
        assert route["spec"]["parentRefs"][0] == {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                                  "name": "public", "namespace": "gateways", "sectionName": "https"}
        assert route["spec"]["hostnames"] == ["k3.example.com", "*.k3.example.com"]
        (rule,) = route["spec"]["rules"]
        assert rule["backendRefs"][0]["name"] == "k3-gw-router" and rule["backendRefs"][0]["port"] == 8000
        get_json("service", "k3-gw-router", "-n", namespace)
        body["spec"]["router"] = {}
        apply(body)
        wait_for("the HTTPRoute pruned", lambda: not get_json(
            "httproutes.gateway.networking.k8s.io", "-n", namespace)["items"], timeout=60)
    finally:
        delete_deployments(namespace, "k3-gw")


def test_scheduling_per_role_router_and_staging_reaches_the_scheduler(operator: Path, namespace: str) -> None:
    """Role, router and staging `scheduling`: the API server resolves each priority class into its
    pods (the Priority admission plugin), the scheduler places the decode groups only on the rack
    the required node affinity names, beside the clique affinity the planner adds, and routers and
    staging pods off the tainted GPU nodes; then an affinity no GPU node satisfies is refused with
    NoMatchingNodes while what runs keeps running."""
    serving, staging = f"e2e-serving-{namespace}", f"e2e-staging-{namespace}"
    gb300 = get_json("nodes", "-l", ",".join(f"{k}={v}" for k, v in GB300.items()))["items"]
    racks: dict[str, set[str]] = defaultdict(set)
    for node in gb300:
        racks[node["metadata"]["labels"]["nvidia.com/gpu.clique"]].add(node["metadata"]["name"])
    rack = sorted(racks)[-1]
    batch = {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}
    body = pd_deployment(namespace, name="k3-sched")
    body["spec"]["pools"][0]["decode"]["scheduling"] = {
        "priorityClassName": serving, "tolerations": [batch],
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.clique", "operator": "In", "values": [rack]}]}]}}}
    body["spec"]["router"] = {"scheduling": {"priorityClassName": serving}}
    body["spec"]["model"]["staging"] = {"scheduling": {"priorityClassName": staging}}
    try:
        for name, value in ((serving, 100000), (staging, 10)):
            kubectl("create", "priorityclass", name, f"--value={value}")
        apply(body)
        wait_for("k3-sched Ready", lambda: (condition(get_json("k3", "k3-sched", "-n", namespace), "Ready")
                                             or {}).get("status") == "True", timeout=180)
        pods = get_json("pods", "-n", namespace)["items"]
        by_role: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for pod in pods:
            labels = pod["metadata"].get("labels") or {}
            by_role[labels.get("serving.kimik3.dev/role") or labels.get("app.kubernetes.io/component", "")].append(pod)
        decode = by_role["decode"]
        assert len(decode) == 6 and {p["spec"]["nodeName"] for p in decode} <= racks[rack], decode
        assert all(p["spec"]["priority"] == 100000 and batch in p["spec"]["tolerations"] for p in decode)
        assert all(p["spec"].get("priority", 0) == 0 for p in by_role["prefill"])  # the other role: untouched
        assert by_role["router"] and all(p["spec"]["priority"] == 100000 for p in by_role["router"])
        assert by_role["weights"] and all(p["spec"]["priority"] == 10 for p in by_role["weights"])
        # The GPU nodes carry the GPU taint (e2e/cluster/nodes/generate.py): the engines tolerate it
        # (the operator adds that toleration), routers and staging pods do not and run on CPU nodes.
        cpu = {n["metadata"]["name"] for n in get_json("nodes", "-l", "type=kwok")["items"]
               if "nvidia.com/gpu" not in n["status"]["capacity"]}
        assert cpu and {p["spec"]["nodeName"] for p in by_role["router"] + by_role["weights"]} <= cpu
        gpu_toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
        assert all(gpu_toleration in p["spec"]["tolerations"] for p in decode + by_role["prefill"])

        body["spec"]["pools"][0]["decode"]["scheduling"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"][0]["matchExpressions"][0]["values"] = ["no-such-clique"]
        apply(body)
        degraded = wait_for("Degraded NoMatchingNodes", lambda: next(
            (c for c in [condition(get_json("k3", "k3-sched", "-n", namespace), "Degraded") or {}]
             if c.get("reason") == NO_MATCHING_NODES), None), timeout=60)
        assert "pool gb300 role decode: scheduling.nodeAffinity" in degraded["message"], degraded
        assert len(_pods(namespace, "k3-sched")) == 8  # what runs keeps running
    finally:
        delete_deployments(namespace, "k3-sched")
        kubectl("delete", "priorityclass", serving, staging, "--ignore-not-found")


def test_removed_pool_is_pruned(operator: Path, namespace: str) -> None:
    body = pd_deployment(namespace, name="k3-prune")
    body["spec"]["pools"][0]["decode"]["replicas"] = 2
    body["spec"]["pools"].append({"name": "gb300-agg", "nodeSelector": GB300,
                                  "aggregated": {"replicas": 1, "parallelism": {"tensor": 8}}})
    apply(body)
    names = {"k3-prune-gb300-decode", "k3-prune-b200-prefill", "k3-prune-gb300-agg-aggregated"}
    wait_for("three workloads", lambda: {o["metadata"]["name"] for o in get_json(
        "leaderworkersets", "-n", namespace)["items"]} == names, timeout=60)

    def two_routers() -> str | None:
        """The P/D router's name once it and the aggregated one run (one router is P/D or
        aggregated, never both). The P/D one is named after the compatibility hash, which takes in
        the commit staging resolves: read it again each time."""
        compat = ((get_json("k3", "k3-prune", "-n", namespace).get("status") or {}).get("engine", {})
                  .get("compatibilityHash") or "")
        pd = f"k3-prune-router-{compat[:10]}"
        deployments = {o["metadata"]["name"] for o in get_json("deployments", "-n", namespace)["items"]}
        return pd if compat and deployments == {pd, "k3-prune-router-aggregated"} else None

    pd_router = wait_for("two routers", two_routers, timeout=60)
    body["spec"]["pools"].pop()
    apply(body)

    def pruned() -> bool:
        lws = {o["metadata"]["name"] for o in get_json("leaderworkersets", "-n", namespace)["items"]}
        svcs = {o["metadata"]["name"] for o in get_json("services", "-n", namespace)["items"]}
        cds = {o["metadata"]["name"] for o in get_json("computedomains", "-n", namespace)["items"]}
        deployments = {o["metadata"]["name"] for o in get_json("deployments", "-n", namespace)["items"]}
        budgets = {o["metadata"]["name"] for o in get_json("pdb", "-n", namespace)["items"]}
        return (lws == names - {"k3-prune-gb300-agg-aggregated"}
                and "k3-prune-gb300-agg-aggregated-leader" not in svcs
                and "k3-prune-gb300-agg-aggregated-cd" not in cds
                and deployments == {pd_router} and "k3-prune-router-aggregated" not in svcs
                and budgets == {"k3-prune-gb300-decode", "k3-prune-b200-prefill", "k3-prune-router"})

    wait_for("the removed pool's children to be pruned", pruned, timeout=60)


def test_too_few_free_gpus_is_insufficient_capacity(operator: Path, namespace: str) -> None:
    # 36 GB300 trays hold 18 TP8 replicas (2 trays each); ask for 20.
    body = base_deployment(name="k3-big", namespace=namespace)
    body["spec"]["pools"] = [{"name": "gb300", "nodeSelector": GB300,
                              "aggregated": {"replicas": 20, "parallelism": {"tensor": 8}}}]
    apply(body)

    def short() -> dict[str, Any] | None:
        ready = condition(get_json("k3", "k3-big", "-n", namespace), "Ready")
        return ready if ready and ready["reason"] == INSUFFICIENT_CAPACITY else None

    ready = wait_for("Ready=False with reason InsufficientCapacity", short, timeout=60)
    assert ready["status"] == "False"
    assert "pool gb300 role aggregated: " in ready["message"] and "replicas do not fit now" in ready["message"]
    assert "in one NVLink clique" in ready["message"]
    # the children are applied anyway: new nodes would let the pending pods schedule
    assert get_json("leaderworkerset", "k3-big-gb300-aggregated", "-n", namespace)["spec"]["replicas"] == 20
    kubectl("delete", "k3", "k3-big", "-n", namespace, "--wait=true", "--timeout=60s")
