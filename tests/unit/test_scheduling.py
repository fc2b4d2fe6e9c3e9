"""Scheduling per role, for routers and for staging Jobs: the user's priority class, scheduler,
tolerations and node affinity reach the pod templates beside what the planner requires (the NVLink
clique affinity, the GPU taints' tolerations), and a required node affinity no node of the pool
satisfies is refused when planned."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.api.reasons import NO_MATCHING_NODES
from kimik3_operator.api.spec import NodeSelectorRequirement
from kimik3_operator.planner import PlanningError, plan_deployment, pool_facts
from kimik3_operator.planner.scheduling import _holds, tolerates
from kimik3_operator.render import Owner, render_serving, render_weights
from tests.support.cases import load_examples
from tests.support.nodes import all_pools

OWNER = Owner(name="k3", namespace="inference", uid="u")
PD = dict(load_examples())["pd-gb300-decode-b200-prefill.yaml"]
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
ZONE_A = {REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": [
    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]}]}]}}
BATCH = {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def _nodes(taint: dict[str, str] | None = None, zone: str = "zone-a") -> list[dict[str, Any]]:
    nodes = copy.deepcopy(all_pools())
    for n in nodes:
        n["metadata"]["labels"]["topology.kubernetes.io/zone"] = zone
        if taint:
            n["spec"]["taints"] = [taint]
    return nodes


def _render(edit: Any = None, nodes: list[dict[str, Any]] | None = None) -> dict[tuple[str, str], dict[str, Any]]:
    body = copy.deepcopy(PD)
    if edit:
        edit(body["spec"])
    spec = KimiK3Deployment.model_validate(body).spec
    plan = plan_deployment(spec, {p.name: pool_facts(p.node_selector, nodes or _nodes()) for p in spec.pools})
    return {(o["kind"], o["metadata"]["name"]): o for o in render_weights(OWNER, plan) + render_serving(OWNER, plan)}


def _pods(objects: dict[tuple[str, str], dict[str, Any]], kind: str, name: str) -> list[dict[str, Any]]:
    """The pod specs of a LeaderWorkerSet: its leader's and its workers'."""
    tpl = objects[(kind, name)]["spec"]["leaderWorkerTemplate"]
    return [t["spec"] for t in (tpl.get("leaderTemplate"), tpl["workerTemplate"]) if t]


def _router(objects: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    return next(o for (kind, _), o in objects.items() if kind == "Deployment")["spec"]["template"]["spec"]


def _job(objects: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    return next(o for (kind, _), o in objects.items() if kind == "Job")["spec"]["template"]["spec"]


def test_a_roles_scheduling_reaches_its_pods_beside_the_clique_affinity() -> None:
    def edit(spec: dict[str, Any]) -> None:
        spec["pools"][1]["decode"]["scheduling"] = {
            "priorityClassName": "inference-high", "schedulerName": "kai-scheduler", "tolerations": [BATCH],
            "nodeAffinity": {**ZONE_A, PREFERRED: [{"weight": 50, "preference": {"matchExpressions": [
                {"key": "rack", "operator": "In", "values": ["r1"]}]}}]}}
    objects = _render(edit)
    for pod in _pods(objects, "LeaderWorkerSet", "k3-gb300-decode-decode"):
        assert pod["priorityClassName"] == "inference-high" and pod["schedulerName"] == "kai-scheduler"
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-GB300"}
        assert pod["tolerations"] == [BATCH]
        assert pod["affinity"]["nodeAffinity"][REQUIRED] == ZONE_A[REQUIRED]
        assert pod["affinity"]["nodeAffinity"][PREFERRED][0]["weight"] == 50
        assert pod["affinity"]["podAffinity"][REQUIRED]  # the tray group stays in one NVLink clique
    for pod in _pods(objects, "LeaderWorkerSet", "k3-b200-prefill-prefill"):  # the other role: untouched
        assert not {"priorityClassName", "schedulerName", "tolerations", "affinity"} & set(pod)


def test_routers_and_staging_jobs_have_their_own_scheduling() -> None:
    def edit(spec: dict[str, Any]) -> None:
        spec["router"] = {"nodeSelector": {"node-role": "cpu"}, "tolerations": [BATCH],
                          "scheduling": {"priorityClassName": "router-critical", "nodeAffinity": ZONE_A,
                                         "tolerations": [BATCH, {"key": "cpu-only", "operator": "Exists"}]}}
        spec["model"]["staging"] = {"scheduling": {"priorityClassName": "batch-low", "schedulerName": "volcano",
                                                   "tolerations": [{"key": "storage", "operator": "Exists"}]}}
    objects = _render(edit)
    router = _router(objects)
    assert router["priorityClassName"] == "router-critical" and router["nodeSelector"] == {"node-role": "cpu"}
    assert router["tolerations"] == [BATCH, {"key": "cpu-only", "operator": "Exists"}]  # the duplicate once
    assert router["affinity"]["nodeAffinity"] == ZONE_A and router["affinity"]["podAntiAffinity"]
    job = _job(objects)
    assert (job["priorityClassName"], job["schedulerName"]) == ("batch-low", "volcano")
    assert job["tolerations"] == [{"key": "storage", "operator": "Exists"}] and "nodeSelector" not in job


def test_engines_tolerate_the_gpu_taint_their_nodes_carry_and_nothing_else_does() -> None:
    tainted = _render(nodes=_nodes(GPU_TAINT))
    for name in ("k3-gb300-decode-decode", "k3-b200-prefill-prefill"):
        for pod in _pods(tainted, "LeaderWorkerSet", name):
            assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    router = _router(tainted)
    assert "tolerations" not in router and "tolerations" not in _job(tainted)  # they stay off GPU nodes

    # Untainted nodes, or a taint the spec already tolerates: the template it rendered before.
    plain = _render()
    assert all("tolerations" not in pod for pod in _pods(plain, "LeaderWorkerSet", "k3-gb300-decode-decode"))
    everything = {"operator": "Exists"}
    tolerated = _render(lambda spec: spec["pools"][1].update(tolerations=[everything]), nodes=_nodes(GPU_TAINT))
    assert all(pod["tolerations"] == [everything]
               for pod in _pods(tolerated, "LeaderWorkerSet", "k3-gb300-decode-decode"))


def test_a_required_node_affinity_no_node_of_the_pool_satisfies_is_refused() -> None:
    def edit(spec: dict[str, Any]) -> None:
        spec["pools"][0]["prefill"]["scheduling"] = {"nodeAffinity": ZONE_A}
    with pytest.raises(PlanningError) as refused:
        _render(edit, nodes=_nodes(zone="zone-b"))
    assert refused.value.reason == NO_MATCHING_NODES and refused.value.depends_on_nodes
    assert refused.value.message.startswith("pool b200-prefill role prefill: scheduling.nodeAffinity")
    assert "of the pool's 4 schedulable nodes" in refused.value.message
    _render(edit)  # zone-a nodes: planned
    # Planning ahead of the nodes (their GPU given) checks nothing.
    body = copy.deepcopy(PD)
    edit(body["spec"])
    for pool, product, per_node in zip(body["spec"]["pools"], ("B200", "GB300"), (8, 4), strict=True):
        pool["gpu"] = {"product": product, "perNode": per_node}
    plan_deployment(KimiK3Deployment.model_validate(body).spec, {})


@pytest.mark.parametrize(("toleration", "taint", "tolerated"), [
    ({"operator": "Exists"}, GPU_TAINT, True),
    ({"key": "nvidia.com/gpu", "operator": "Exists"}, GPU_TAINT, True),
    ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, GPU_TAINT, False),
    ({"key": "nvidia.com/gpu", "value": "present"}, GPU_TAINT, True),  # Equal is the default
    ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "other"}, GPU_TAINT, False),
    ({"key": "amd.com/gpu", "operator": "Exists"}, GPU_TAINT, False),
    ({"key": "nvidia.com/gpu"}, {"key": "nvidia.com/gpu", "effect": "NoSchedule"}, True),  # empty value
])
def test_tolerations_match_taints_as_the_scheduler_does(
        toleration: dict[str, str], taint: dict[str, str], tolerated: bool) -> None:
    assert tolerates(toleration, taint) is tolerated


@pytest.mark.parametrize(("operator", "values", "labels", "holds"), [
    ("In", ["a", "b"], {"k": "b"}, True), ("In", ["a"], {}, False),
    ("NotIn", ["a"], {}, True), ("NotIn", ["a"], {"k": "a"}, False),
    ("Exists", [], {"k": ""}, True), ("DoesNotExist", [], {"k": "x"}, False),
    ("Gt", ["4"], {"k": "8"}, True), ("Gt", ["4"], {"k": "4"}, False), ("Lt", ["4"], {"k": "x"}, False),
])
def test_node_selector_requirements_hold_as_the_scheduler_reads_them(
        operator: str, values: list[str], labels: dict[str, str], holds: bool) -> None:
    requirement = NodeSelectorRequirement.model_validate({"key": "k", "operator": operator, "values": values})
    assert _holds(requirement, labels) is holds
