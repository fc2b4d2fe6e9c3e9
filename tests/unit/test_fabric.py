"""The fabric rules (planner/fabric.py, render/rdma.py) over their inputs: which fabric carries P/D
KV, what `interconnect: NVLink | xGMI` pins, how many NICs a pod requests, and the fabric settings
its container gets."""

from __future__ import annotations

from typing import Any

import pytest

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.api.reasons import HARDWARE_UNSUPPORTED, INVALID_SPEC, RDMA_UNAVAILABLE
from kimik3_operator.planner import Layout, Plan, PlanningError, plan_deployment, pool_facts
from kimik3_operator.planner.catalog import CATALOG
from kimik3_operator.planner.fabric import MAX_NICS_PER_GPU, check_pinned_layout, rdma_plan
from kimik3_operator.planner.layout import Fabric, MemoryInputs, check_layout
from kimik3_operator.render import Owner, render_children
from tests.support.cases import base_deployment
from tests.support.nodes import b200_nodes, gb300_rack, mi355x_nodes, node

GB300 = {"nvidia.com/gpu.product": "NVIDIA-GB300"}
B200 = {"nvidia.com/gpu.product": "NVIDIA-B200"}
OWNER = Owner(name="k3", namespace="ns", uid="u")
DEP16_GB300 = {"replicas": 2, "parallelism": {"tensor": 8, "data": 2, "expert": True}}
TP8 = {"replicas": 2, "parallelism": {"tensor": 8}}


def _body(*pools: dict[str, Any]) -> dict[str, Any]:
    body = base_deployment("k3")
    body["spec"]["pools"] = list(pools)
    return body


def _plan(body: dict[str, Any], nodes: list[dict[str, Any]]) -> Plan:
    spec = KimiK3Deployment.model_validate(body).spec
    return plan_deployment(spec, {p.name: pool_facts(p.node_selector, nodes) for p in spec.pools})


def _containers(objs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for o in objs:
        if o["kind"] == "LeaderWorkerSet":
            group = o["spec"]["leaderWorkerTemplate"]
            out[o["metadata"]["name"]] = [group[t]["spec"] for t in ("leaderTemplate", "workerTemplate") if t in group]
    return out


def _env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["containers"][0]["env"]}


def test_pd_in_one_clique_shares_one_compute_domain_and_talks_nvlink() -> None:
    body = _body({"name": "rack", "nodeSelector": {**GB300, "nvidia.com/gpu.clique": "cluster.a"},
                  "prefill": DEP16_GB300, "decode": TP8})
    plan = _plan(body, gb300_rack("a"))
    roles = {r.role: r for _, r in plan.role_plans()}
    assert {r.kv_transport for r in roles.values()} == {"NVLink"}
    assert all(r.shared_compute_domain and r.compute_domain and r.rdma_nics == 0 for r in roles.values())
    objs = render_children(OWNER, plan)
    (domain,) = [o for o in objs if o["kind"] == "ComputeDomain"]
    template = domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
    for pods in _containers(objs).values():
        for pod in pods:
            assert pod["resourceClaims"][0]["resourceClaimTemplateName"] == template
            env = _env(pod)
            assert env["UCX_CUDA_IPC_ENABLE_MNNVL"] == "y" and "cuda_ipc" in env["UCX_TLS"]
            assert "IPC_LOCK" not in str(pod["containers"][0].get("securityContext"))


@pytest.mark.parametrize(("cliques", "expected"), [
    (("a", "a"), "NVLink"), (("a", "b"), "RDMA"), (("b", "a"), "RDMA")])
def test_pd_pools_pair_over_nvlink_only_inside_one_clique(cliques: tuple[str, str], expected: str) -> None:
    prefill, decode = ({"name": f"p{i}", "nodeSelector": {**GB300, "nvidia.com/gpu.clique": f"cluster.{c}"}}
                       for i, c in enumerate(cliques))
    plan = _plan(_body({**prefill, "prefill": DEP16_GB300}, {**decode, "decode": TP8}),
                 gb300_rack("a") + gb300_rack("b"))
    for _, role in plan.role_plans():
        assert role.kv_transport == expected
        assert role.rdma_nics == (4 if expected == "RDMA" else 0)  # one NIC per GB300 GPU
        assert role.compute_domain  # both replicas span two trays either way


def test_a_pool_spanning_two_cliques_moves_kv_over_rdma() -> None:
    plan = _plan(_body({"name": "p", "nodeSelector": GB300, "prefill": DEP16_GB300, "decode": TP8}),
                 gb300_rack("a") + gb300_rack("b"))
    assert {r.kv_transport for _, r in plan.role_plans()} == {"RDMA"}
    assert not any(r.shared_compute_domain for _, r in plan.role_plans())


def test_cross_clique_kv_without_nics_is_refused_with_the_reason() -> None:
    racks = [node(f"t-{r}-{i}", "NVIDIA-GB300", 4, clique=f"cluster.{r}", arch="arm64") for r in "ab" for i in range(4)]
    body = _body({"name": "a", "nodeSelector": {**GB300, "nvidia.com/gpu.clique": "cluster.a"}, "prefill": DEP16_GB300},
                 {"name": "b", "nodeSelector": {**GB300, "nvidia.com/gpu.clique": "cluster.b"}, "decode": TP8})
    with pytest.raises(PlanningError) as info:
        _plan(body, racks)
    assert info.value.reason == RDMA_UNAVAILABLE and info.value.depends_on_nodes
    assert "KV cache goes to the paired role over RDMA" in info.value.message
    body["spec"]["pools"][0]["rdma"] = body["spec"]["pools"][1]["rdma"] = {"resource": "nvidia.com/hostdev"}
    plan = _plan(body, racks)  # a resource the user names is trusted
    assert {r.rdma_request for _, r in plan.role_plans()} == {"4 x nvidia.com/hostdev"}


@pytest.mark.parametrize(("pools", "expected"), [
    ([("p", ("prefill", "decode"))], "NVLink"),             # one pool, planned as one rack
    ([("p", ("prefill",)), ("d", ("decode",))], "RDMA"),    # nothing proves one clique
])
def test_pd_transport_ahead_of_the_nodes(pools: list[tuple[str, tuple[str, ...]]], expected: str) -> None:
    body = _body(*({"name": n, "gpu": {"product": "GB300", "perNode": 4},
                    **{r: DEP16_GB300 if r == "prefill" else TP8 for r in roles}} for n, roles in pools))
    plan = _plan(body, [])
    assert {r.kv_transport for _, r in plan.role_plans()} == {expected}


def test_hgx_pd_always_goes_over_rdma_with_a_nic_per_gpu() -> None:
    plan = _plan(_body({"name": "b", "nodeSelector": B200, "prefill": {"replicas": 2}, "decode": {"replicas": 2}}),
                 b200_nodes())
    for _, role in plan.role_plans():
        assert role.kv_transport == "RDMA" and role.rdma_nics == role.gpus_per_pod


@pytest.mark.parametrize("gpus", [4, 8])
@pytest.mark.parametrize("per_node", [None, 1, 2, 4, 8, 16, 63, 1000])
def test_nics_per_gpu_from_the_nodes(gpus: int, per_node: int | None) -> None:
    """1-2 units per GPU are NICs; anything else (a shared device's shares) one unit per pod."""
    nodes = [node(f"n{i}", "NVIDIA-B200", gpus, rdma="rdma/ib" if per_node else None, rdma_count=per_node)
             for i in range(2)]
    spec = KimiK3Deployment.model_validate(_body({"name": "p", "aggregated": {}})).spec
    rdma = rdma_plan(spec.pools[0], pool_facts({}, nodes), gpus)
    if per_node is None:
        assert rdma.nics(gpus) == 0
    elif per_node % gpus == 0 and per_node // gpus <= MAX_NICS_PER_GPU:
        assert (rdma.shared, rdma.nics(gpus)) == (False, per_node)
    else:
        assert (rdma.shared, rdma.nics(gpus)) == (True, 1)


def test_nics_per_gpu_from_the_spec_win() -> None:
    spec = KimiK3Deployment.model_validate(_body({"name": "p", "aggregated": {},
                                                  "rdma": {"nicsPerGpu": 2, "resource": "nvidia.com/rdma_vf"}})).spec
    rdma = rdma_plan(spec.pools[0], pool_facts({}, b200_nodes()), 8)
    assert (rdma.resource, rdma.nics(8)) == ("nvidia.com/rdma_vf", 16)


@pytest.mark.parametrize("domain", [4, 8, 16, 72])
@pytest.mark.parametrize(("tensor", "data"), [(1, 4), (1, 8), (4, 2), (8, 1), (8, 2), (4, 8), (16, 1), (1, 64)])
def test_nvlink_pins_tensor_and_expert_groups(domain: int, tensor: int, data: int) -> None:
    layout = Layout(tensor=tensor, data=data, expert=True)
    if tensor <= domain and tensor * data <= domain:
        check_pinned_layout(layout, domain, 4, multi_node=domain > 4)
    else:
        with pytest.raises(PlanningError, match="would cross RDMA"):
            check_pinned_layout(layout, domain, 4, multi_node=domain > 4)


def test_nvlink_on_hgx_refuses_dep_across_nodes_and_allows_pipeline_stages() -> None:
    fabric = Fabric(gpu=CATALOG["B200"], gpus_per_node=8, nvlink_gpus=8, pinned=True)
    mem = MemoryInputs(max_model_len=None, kv_dtype="bf16", spec_tokens=0)
    with pytest.raises(PlanningError) as info:
        check_layout("decode", True, Layout(tensor=8, data=2, expert=True), fabric, mem)
    assert info.value.reason == INVALID_SPEC and "one node (8 GPUs; HGX NVLink ends at the board)" in info.value.message
    plan = _plan(_body({"name": "b", "nodeSelector": B200, "interconnect": "NVLink",
                        "aggregated": {"replicas": 1, "parallelism": {"tensor": 8, "pipeline": 2}}}), b200_nodes())
    assert plan.pools[0].roles[0].layout.pipeline == 2
    with pytest.raises(PlanningError) as chosen:  # no DEP layout to choose for decode on one board
        _plan(_body({"name": "b", "nodeSelector": B200, "interconnect": "NVLink", "prefill": {"replicas": 1},
                     "decode": {"replicas": 1}}), b200_nodes())
    assert chosen.value.reason == HARDWARE_UNSUPPORTED and "inside one NVLink domain" in chosen.value.message


def test_nvlink_on_gb300_means_the_clique() -> None:
    plan = _plan(_body({"name": "g", "nodeSelector": GB300, "interconnect": "NVLink",
                        "aggregated": {"replicas": 1, "parallelism": {"tensor": 16}}}), gb300_rack("a"))
    role = plan.pools[0].roles[0]
    assert role.compute_domain and not role.crosses_rdma


@pytest.mark.parametrize(("selector", "nodes", "interconnect", "refused"), [
    (GB300, gb300_rack("a"), "xGMI", True),
    (B200, b200_nodes(), "xGMI", True),
    ({"amd.com/gpu.product-name": "AMD_Instinct_MI355X"}, mi355x_nodes(), "NVLink", True),
    ({"amd.com/gpu.product-name": "AMD_Instinct_MI355X"}, mi355x_nodes(), "xGMI", False),
    (B200, b200_nodes(), "NVLink", False),
])
def test_interconnect_matches_the_vendor_of_the_nodes(selector: dict[str, str], nodes: list[dict[str, Any]],
                                                      interconnect: str, refused: bool) -> None:
    body = _body({"name": "p", "nodeSelector": selector, "interconnect": interconnect,
                  "aggregated": {"replicas": 1, "parallelism": {"tensor": 8, "pipeline": 2}}})
    if refused:
        with pytest.raises(PlanningError, match=f"interconnect {interconnect} is"):
            _plan(body, nodes)
    else:
        _plan(body, nodes)


def test_rdma_settings_reach_rdma_pods_and_the_user_wins() -> None:
    body = _body({"name": "b", "nodeSelector": B200, "prefill": {"replicas": 2}, "decode": {"replicas": 2},
                  "rdma": {"hcas": ["mlx5_0", "mlx5_1:2"], "gidIndex": 3,
                           "env": [{"name": "UCX_TLS", "value": "rc,cuda_copy"},
                                   {"name": "NCCL_IB_TIMEOUT", "value": "22"}]}})
    body["spec"]["engine"] = {"env": [{"name": "NCCL_IB_GID_INDEX", "value": "5"}]}
    for pods in _containers(render_children(OWNER, _plan(body, b200_nodes()))).values():
        for pod in pods:
            names = [e["name"] for e in pod["containers"][0]["env"]]
            assert len(names) == len(set(names))
            env = _env(pod)
            assert env["UCX_TLS"] == "rc,cuda_copy"              # pools[].rdma.env over the default
            assert env["NCCL_IB_GID_INDEX"] == "5"               # engine.env over the default
            assert env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:2"
            assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1:2" and env["NCCL_IB_TIMEOUT"] == "22"
            assert not [n for n in names if n.startswith("NVSHMEM_")]  # deepep_v2 rides NCCL, not NVSHMEM


def test_nvshmem_deepep_gets_ibgda() -> None:
    body = _body({"name": "b", "nodeSelector": B200, "backends": {"all2all": "deepep_low_latency"},
                  "rdma": {"hcas": ["mlx5_0"]},
                  "aggregated": {"replicas": 2, "parallelism": {"tensor": 8, "data": 2, "expert": True}}})
    for pods in _containers(render_children(OWNER, _plan(body, b200_nodes()))).values():
        env = _env(pods[0])
        assert (env["NVSHMEM_IB_ENABLE_IBGDA"], env["NVSHMEM_HCA_LIST"]) == ("1", "mlx5_0")


def test_status_says_megamoe_dispatches_itself() -> None:
    plan = _plan(_body({"name": "g", "nodeSelector": GB300, "prefill": DEP16_GB300, "decode": TP8}), gb300_rack("a"))
    prefill = plan.pools[0].roles[0]
    assert (prefill.all2all_backend, prefill.moe_backend, prefill.expert_dispatch) == (
        "flashinfer_nvlink_one_sided", "deep_gemm_mega_moe", "deep_gemm_mega_moe")
