"""Walking-skeleton planning rules, one table row per rule."""

from __future__ import annotations

from typing import Any

import pytest

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.api.reasons import (
    HARDWARE_UNSUPPORTED,
    INSUFFICIENT_MEMORY,
    INVALID_SPEC,
    KNOWN_ISSUE,
    NO_MATCHING_NODES,
    PD_INCOMPATIBLE,
)
from kimik3_operator.planner import PlanningError, plan_deployment, pool_facts
from kimik3_operator.planner.catalog import product_from_label
from tests.support.cases import base_deployment
from tests.support.nodes import b200_nodes, gb300_rack, node


@pytest.mark.parametrize(("label", "product"), [
    ("NVIDIA-GB300", "GB300"), ("NVIDIA-B300-SXM6-AC", "B300"), ("NVIDIA-GB200", "GB200"),
    ("NVIDIA-B200", "B200"), ("NVIDIA-H200", "H200"), ("NVIDIA-H100-80GB-HBM3", "H100"),
    ("AMD_Instinct_MI355X", "MI355X"), ("AMD_Instinct_MI355X_OAM", "MI355X"), ("nvidia-gb300", "GB300"),
    ("NVIDIA-A100-SXM4-80GB", None), ("Tesla-T4", None),
    # exact, never a prefix: these were read as B200, B300 and H200 before the GPU table
    ("NVIDIA-B200A", None), ("NVIDIA-B3000", None), ("NVIDIA-H200X-NVL", None), ("NVIDIA-H200-NVL", None),
])
def test_product_from_label(label: str, product: str | None) -> None:
    assert product_from_label(label) == product


def test_pool_facts_read_labels_and_capacity() -> None:
    nodes = gb300_rack("a", 3) + gb300_rack("b", 2) + b200_nodes(2)
    facts = pool_facts({"nvidia.com/gpu.product": "NVIDIA-GB300"}, nodes)
    assert (facts.product, facts.gpus_per_node, facts.gpu_resource) == ("GB300", 4, "nvidia.com/gpu")
    assert facts.cliques == {"cluster.a": 3, "cluster.b": 2}
    assert (facts.rdma_resource, facts.rdma_per_node) == ("rdma/ib", 4)
    b200 = pool_facts({"nvidia.com/gpu.product": "NVIDIA-B200"}, nodes)
    assert (b200.product, b200.gpus_per_node, b200.rdma_resource, b200.cliques) == ("B200", 8, "rdma/ib", {})


def test_pool_facts_skip_unschedulable_and_gpu_less_nodes() -> None:
    nodes = [node("cpu", "none", 0), node("cordoned", "NVIDIA-H200", 8, unschedulable=True),
             node("h200", "NVIDIA-H200", 8)]
    facts = pool_facts({}, nodes)
    assert [n.name for n in facts.nodes] == ["h200"]


def test_pool_facts_gpus_per_node_is_the_smallest() -> None:
    facts = pool_facts({}, [node("a", "NVIDIA-H200", 8), node("b", "NVIDIA-H200", 4)])
    assert facts.gpus_per_node == 4


def _plan(body: dict[str, Any], nodes: list[dict[str, Any]]):
    spec = KimiK3Deployment.model_validate(body).spec
    return plan_deployment(spec, {p.name: pool_facts(p.node_selector, nodes) for p in spec.pools})


def _with_pool(**pool: Any) -> dict[str, Any]:
    body = base_deployment()
    body["spec"]["pools"] = [{"name": "p", **pool}]
    return body


@pytest.mark.parametrize(("pool", "nodes", "expect"), [
    # GB300 TP8: 2 trays of 4 GPUs, kept in one clique, with a ComputeDomain for multi-node NVLink
    ({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB300"},
      "aggregated": {"replicas": 2, "parallelism": {"tensor": 8}}},
     gb300_rack(), {"nodes": 2, "gpus_per_pod": 4, "key": "nvidia.com/gpu.clique", "cd": True,
                    "interconnect": "NVLink"}),
    # GB300 layout chosen by the planner: the same TP8
    ({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB300"}, "aggregated": {"replicas": 1}},
     gb300_rack(), {"nodes": 2, "gpus_per_pod": 4, "key": "nvidia.com/gpu.clique", "cd": True,
                    "interconnect": "NVLink"}),
    # B200 TP8 x PP2: 2 nodes over RDMA, no clique, no ComputeDomain
    ({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-B200"},
      "aggregated": {"replicas": 1, "parallelism": {"tensor": 8, "pipeline": 2}}},
     b200_nodes(), {"nodes": 2, "gpus_per_pod": 8, "key": None, "cd": False, "interconnect": "RDMA"}),
    # B200 DEP16 (TP8 x DP2, EP16): 2 nodes
    ({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-B200"},
      "aggregated": {"replicas": 1, "parallelism": {"tensor": 8, "data": 2, "expert": True}}},
     b200_nodes(), {"nodes": 2, "gpus_per_pod": 8, "key": None, "cd": False, "interconnect": "RDMA"}),
    # explicit product and perNode plan without nodes (scale-from-zero pools)
    ({"nodeSelector": {"pool": "later"}, "gpu": {"product": "B300", "perNode": 8},
      "aggregated": {"replicas": 1}},
     [], {"nodes": 1, "gpus_per_pod": 8, "key": None, "cd": False, "interconnect": "NVLink"}),
    # GB300 told its replicas cross RDMA: TP stays inside a tray, pipeline stages between trays
    ({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB300"}, "interconnect": "RDMA",
      "aggregated": {"replicas": 1}},
     gb300_rack(), {"nodes": 2, "gpus_per_pod": 4, "key": None, "cd": False, "interconnect": "RDMA"}),
])
def test_layout_to_groups(pool: dict[str, Any], nodes: list[dict[str, Any]], expect: dict[str, Any]) -> None:
    plan = _plan(_with_pool(**pool), nodes)
    (pool_plan,) = plan.pools
    (role,) = pool_plan.roles
    assert role.nodes_per_replica == expect["nodes"]
    assert role.gpus_per_pod == expect["gpus_per_pod"]
    assert role.group_topology_key == expect["key"]
    assert role.compute_domain is expect["cd"]
    assert pool_plan.interconnect == expect["interconnect"]
    assert role.nodes_per_replica * role.gpus_per_pod == role.gpus_per_replica


@pytest.mark.parametrize(("pool", "nodes", "reason", "needle", "node_dependent"), [
    ({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-B200"},
      "aggregated": {"replicas": 1, "parallelism": {"tensor": 12}}}, b200_nodes(), INVALID_SPEC,
     "tensor parallel size 12 would span the RDMA boundary", False),
    ({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-B200"},
      "aggregated": {"replicas": 1, "parallelism": {"tensor": 8}}}, b200_nodes(), INSUFFICIENT_MEMORY,
     "pool p role aggregated: 8 x B200 (TP8) needs 205.9 GB of weights", False),
    ({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100"},
      "aggregated": {"replicas": 1, "parallelism": {"tensor": 8}}}, b200_nodes(), NO_MATCHING_NODES,
     "no schedulable GPU node matches", True),
    ({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, "aggregated": {"replicas": 1}},
     [node("a100", "NVIDIA-A100-SXM4-80GB", 8)], HARDWARE_UNSUPPORTED,
     "GPU 'NVIDIA-A100-SXM4-80GB' (1 of 1 nodes; closest known labels: NVIDIA-H100-80GB-HBM3", True),
])
def test_planning_errors(pool: dict[str, Any], nodes: list[dict[str, Any]], reason: str, needle: str,
                         node_dependent: bool) -> None:
    with pytest.raises(PlanningError) as info:
        _plan(_with_pool(**pool), nodes)
    assert info.value.reason == reason
    assert needle in info.value.message
    assert info.value.depends_on_nodes is node_dependent


def test_retention_policy_maps_to_interval() -> None:
    # TP8 with BF16 KV and FP32 KDA state aligns blocks to 768 tokens: 32768 is not a multiple,
    # so the planner renders the nearest one, 43 x 768, and says so in status.
    for retention, interval, requested in (({"policy": "Interval", "intervalTokens": 32768}, 33024, 32768),
                                           ({"policy": "Interval", "intervalTokens": 1536}, 1536, 1536),
                                           ({"policy": "Interval", "intervalTokens": 100}, 768, 100),
                                           ({"policy": "Selective"}, 0, 0), ({"policy": "Dense"}, None, None)):
        body = base_deployment()
        body["spec"]["engine"] = {"kvCacheDtype": "auto", "prefixCaching": {"retention": retention}}
        engine = _plan(body, gb300_rack()).engine
        assert (engine.retention_interval, engine.retention_requested) == (interval, requested)
        assert engine.retention_granularity == 768


def test_retention_interval_is_a_multiple_of_every_roles_block() -> None:
    """Roles may have different blocks where vLLM pairs them: on Hopper with BF16 KV the MLA kernel
    runs the whole block, and a decode whose block is a multiple of the prefill's passes the handshake
    (handoff.py)."""
    body = base_deployment()
    body["spec"]["engine"] = {"kvCacheDtype": "auto", "maxModelLen": 131072,
                              "prefixCaching": {"retention": {"policy": "Interval", "intervalTokens": 32768}}}
    body["spec"]["pools"] = [{"name": "p", "gpu": {"product": "H200"},
                              "prefill": {"replicas": 1, "parallelism": {"tensor": 8, "data": 2, "expert": True}},
                              "decode": {"replicas": 2, "parallelism": {"tensor": 4, "data": 8, "expert": True}}}]
    plan = _plan(body, [])
    blocks = {r.role: r.block_size for _, r in plan.role_plans()}
    assert blocks == {"prefill": 768, "decode": 1536}
    assert plan.engine.retention_granularity == 1536  # lcm(768, 1536)
    assert plan.engine.retention_interval == 32256    # the multiple of 1536 nearest to 32768


def test_compat_hash_follows_shared_engine_settings() -> None:
    a = _plan(base_deployment(), gb300_rack())
    body = base_deployment()
    body["spec"]["engine"] = {"speculative": {"method": "MTP", "numSpeculativeTokens": 1}}
    b = _plan(body, gb300_rack())
    body["spec"]["model"]["servedName"] = "other"
    c = _plan(body, gb300_rack())
    assert a.compat_hash != b.compat_hash
    assert b.compat_hash == c.compat_hash  # the served name is not part of the KV handshake


def test_one_prefill_one_decode_is_a_known_trap() -> None:
    pools = [{"name": "p", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB300"},
              "prefill": {"replicas": 1}, "decode": {"replicas": 1}}]
    body = base_deployment()
    body["spec"]["pools"] = pools
    with pytest.raises(PlanningError) as info:
        _plan(body, gb300_rack())
    assert info.value.reason == KNOWN_ISSUE and "vllm#52627" in info.value.message
    body["spec"]["experimental"] = {"acceptKnownIssues": ["vllm#52627"]}
    assert _plan(body, gb300_rack()).gpus == 8 + 8
    body["spec"].pop("experimental")
    pools[0]["decode"]["replicas"] = 2
    assert _plan(body, gb300_rack()).gpus == 8 + 16


def test_pd_pairs_need_one_gpu_generation() -> None:
    body = base_deployment()
    body["spec"]["pools"] = [
        {"name": "h200", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}, "prefill": {"replicas": 1}},
        {"name": "b200", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-B200"}, "decode": {"replicas": 2}}]
    nodes = b200_nodes() + [node(f"h200-{i}", "NVIDIA-H200", 8, rdma="rdma/ib") for i in range(4)]
    with pytest.raises(PlanningError) as info:
        _plan(body, nodes)
    assert info.value.reason == PD_INCOMPATIBLE and "nvidia blackwell, nvidia hopper" in info.value.message
    body["spec"]["pools"][0]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-B200"}
    assert _plan(body, nodes).gpus == 16 + 2 * 16


def test_node_labels_report_memory_and_arch() -> None:
    nodes = gb300_rack("a", 2)
    for n in nodes:
        n["metadata"]["labels"]["nvidia.com/gpu.memory"] = "284208"
    amd = node("mi-0", "AMD_Instinct_MI355X_OAM", 8, resource="amd.com/gpu")
    amd["metadata"]["labels"]["amd.com/gpu.vram"] = "288G"
    facts = pool_facts({}, nodes)
    assert (facts.memory_mib, facts.arch) == (284208, "arm64")
    amd_facts = pool_facts({}, [amd])
    assert (amd_facts.product, amd_facts.memory_mib, amd_facts.gpu_resource) == ("MI355X", 288 * 1024, "amd.com/gpu")


def test_labelled_memory_decides_the_fit() -> None:
    # An H200 part labelled with only 80 GB per GPU plans like an H100: 32 GPUs.
    nodes = [node(f"h-{i}", "NVIDIA-H200", 8, rdma="rdma/ib") for i in range(4)]
    for n in nodes:
        n["metadata"]["labels"]["nvidia.com/gpu.memory"] = "81559"
    body = _with_pool(nodeSelector={"nvidia.com/gpu.product": "NVIDIA-H200"}, aggregated={"replicas": 1})
    (role,) = _plan(body, nodes).pools[0].roles
    assert role.gpus_per_replica == 32


def test_every_retention_policy_is_spelt_out_on_the_command_line() -> None:
    """vLLM 0.33.0 defaults --prefix-cache-retention-interval to 0 (semantic checkpoints only;
    config/cache.py): Dense must render the value None, not leave the flag out."""
    from kimik3_operator.render import Owner, render_serving

    owner = Owner(name="k3", namespace="ns", uid="u")
    for retention, rendered in (({"policy": "Interval", "intervalTokens": 1536}, "1536"),
                                ({"policy": "Selective"}, "0"), ({"policy": "Dense"}, "None")):
        body = base_deployment()
        body["spec"]["engine"] = {"kvCacheDtype": "auto", "prefixCaching": {"retention": retention}}
        plan = _plan(body, gb300_rack())
        commands = [" ".join([*c.get("command", []), *c.get("args", [])])
                    for o in render_serving(owner, plan) if o["kind"] == "LeaderWorkerSet"
                    for c in o["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"]]
        assert commands and all(f"--prefix-cache-retention-interval {rendered}" in c for c in commands), commands
