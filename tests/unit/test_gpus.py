"""The GPU table (gpus.py) is the one place a product is spelled: the API enum, the CRD, the CEL
rules, the catalog and the usual node derive from it, and node labels name a product exactly."""

from __future__ import annotations

import pathlib
from typing import Any, get_args

import pytest
import yaml

from kimik3_operator.api.crd import custom_resource_definition
from kimik3_operator.api.reasons import HARDWARE_UNSUPPORTED
from kimik3_operator.api.spec import GpuProduct
from kimik3_operator.api.v1alpha1 import KimiK3Deployment
from kimik3_operator.gpus import GPUS, LABELS, PRODUCTS, closest_labels, product_from_label, products_with
from kimik3_operator.planner import PlanningError, plan_deployment, pool_facts
from kimik3_operator.planner.catalog import CATALOG
from kimik3_operator.planner.facts import PRODUCT_LABELS
from kimik3_operator.planner.pod_resources import NODE_SHAPES, node_shape
from tests.support.cases import base_deployment
from tests.support.nodes import node

ROOT = pathlib.Path(__file__).resolve().parents[2]
E2E_NODES: dict[str, str | None] = {
    "b200-hgx.yaml": "B200", "gb300-nvl72-rack0.yaml": "GB300", "gb300-nvl72-rack1.yaml": "GB300",
    "h200-hgx.yaml": "H200", "cpu.yaml": None}
"""Each e2e node file's GPU product; None: CPU nodes (routers, staging), which no pool plans on."""


def test_api_enum_is_the_table_in_its_order() -> None:
    assert get_args(GpuProduct) == ("Auto", *PRODUCTS)
    gpu = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "properties"]["spec"]["properties"]["pools"]["items"]["properties"]["gpu"]["properties"]["product"]
    assert gpu["enum"] == ["Auto", *PRODUCTS]
    assert gpu["description"] == " | ".join(("Auto", *PRODUCTS)) + "."


def test_everything_keyed_by_product_has_one_entry_per_row() -> None:
    assert list(CATALOG) == list(PRODUCTS) == [g.product for g in GPUS]
    assert list(NODE_SHAPES) == list(PRODUCTS)
    for g in GPUS:
        shape = node_shape(g.product, None)
        assert (shape.cpu_millis, shape.memory_bytes) == (g.node_cores * 1000, g.node_memory_gib << 30)


def test_labels_are_unique_ignoring_case_and_every_row_has_one() -> None:
    spellings = [label.casefold() for g in GPUS for label in g.labels]
    assert len(spellings) == len(set(spellings))
    assert all(g.labels for g in GPUS)


def test_xgmi_rules_follow_the_table() -> None:
    amd = products_with("xGMI")
    assert amd == tuple(g.product for g in GPUS if g.vendor == "amd")
    body = base_deployment()
    body["spec"]["pools"][0].update(interconnect="xGMI", gpu={"product": amd[0]})
    KimiK3Deployment.model_validate(body)
    body["spec"]["pools"][0].update(interconnect="NVLink")
    with pytest.raises(ValueError, match="boards use xGMI"):
        KimiK3Deployment.model_validate(body)
    nvidia = products_with("NVLink")[0]
    body["spec"]["pools"][0].update(interconnect="xGMI", gpu={"product": nvidia})
    with pytest.raises(ValueError, match="needs gpu.product"):
        KimiK3Deployment.model_validate(body)


@pytest.mark.parametrize("label", sorted(LABELS))
def test_every_label_of_the_table_names_its_product_ignoring_case(label: str) -> None:
    assert product_from_label(label) == LABELS[label]
    assert product_from_label(label.lower()) == LABELS[label]
    assert product_from_label(label.upper()) == LABELS[label]


@pytest.mark.parametrize(("label", "near"), [
    ("NVIDIA-B200A", "NVIDIA-B200"), ("NVIDIA-B3000", "NVIDIA-B300"), ("NVIDIA-H200X-NVL", "NVIDIA-H200"),
    ("NVIDIA-H200-NVL", "NVIDIA-H200"), ("NVIDIA-H100-NVL", "NVIDIA-H100"), ("NVIDIA-H100-PCIe", "NVIDIA-H100"),
    ("NVIDIA-GB300X", "NVIDIA-GB300"), ("NVIDIA-B200-extra", "NVIDIA-B200"),
    ("AMD-Instinct-MI355X", "AMD_Instinct_MI355X"), ("AMD_Instinct_MI355X_VF", "AMD_Instinct_MI355X"),
])
def test_a_near_miss_names_no_product_but_is_told_the_nearest_spelling(label: str, near: str) -> None:
    assert product_from_label(label) is None
    assert near in closest_labels(label)


@pytest.mark.parametrize("label", ["B200", "GB300", "H200", "NVIDIA", "", "Tesla-T4"])
def test_bare_products_and_unrelated_labels_name_nothing(label: str) -> None:
    assert product_from_label(label) is None


def _node_files() -> list[pathlib.Path]:
    return sorted((ROOT / "e2e" / "cluster" / "nodes").glob("*.yaml"))


def _e2e_nodes(path: pathlib.Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == "Node"]


def test_the_e2e_node_files_are_the_ones_listed_here() -> None:
    assert [p.name for p in _node_files()] == sorted(E2E_NODES)


@pytest.mark.parametrize("path", _node_files(), ids=lambda p: p.name)
def test_every_e2e_node_label_names_its_product(path: pathlib.Path) -> None:
    nodes = _e2e_nodes(path)
    assert nodes
    for n in nodes:
        labels = n["metadata"]["labels"]
        value = next((labels[k] for k in PRODUCT_LABELS if k in labels), None)
        assert (value and product_from_label(value)) == E2E_NODES[path.name], n["metadata"]["name"]
    facts = pool_facts({}, nodes)
    assert (facts.product, dict(facts.unknown_labels)) == (E2E_NODES[path.name], {})
    assert bool(facts.nodes) == (E2E_NODES[path.name] is not None)


def _selector_labels() -> set[str]:
    """Product labels the shipped examples and golden CRs select on."""
    found = set()
    for path in [*(ROOT / "manifests" / "examples").glob("*.yaml"), *(ROOT / "tests" / "golden").glob("*/cr.yaml")]:
        for doc in yaml.safe_load_all(path.read_text()):
            for pool in ((doc or {}).get("spec") or {}).get("pools") or []:
                found |= {v for k, v in (pool.get("nodeSelector") or {}).items() if k in PRODUCT_LABELS}
    return found


def test_every_product_label_the_examples_select_on_names_a_product() -> None:
    labels = _selector_labels()
    assert labels
    assert {label: product_from_label(label) for label in labels if product_from_label(label) is None} == {}


def _plan(pool: dict[str, Any], nodes: list[dict[str, Any]]):
    body = base_deployment()
    body["spec"]["pools"] = [{"name": "p", "aggregated": {"replicas": 1}, **pool}]
    spec = KimiK3Deployment.model_validate(body).spec
    return plan_deployment(spec, {p.name: pool_facts(p.node_selector, nodes) for p in spec.pools})


def _h200(name: str, label: str = "NVIDIA-H200") -> dict[str, Any]:
    n = node(name, label, 8, rdma="rdma/ib")
    n["metadata"]["labels"]["pool"] = "h"
    return n


def test_an_unknown_label_is_refused_with_the_labels_it_could_have_meant() -> None:
    nodes = [_h200(f"nvl-{i}", "NVIDIA-H200-NVL") for i in range(2)]
    with pytest.raises(PlanningError) as info:
        _plan({"nodeSelector": {"pool": "h"}}, nodes)
    assert info.value.reason == HARDWARE_UNSUPPORTED
    assert info.value.depends_on_nodes is True
    message = info.value.message
    assert "'NVIDIA-H200-NVL' (2 of 2 nodes; closest known labels: NVIDIA-H200" in message
    assert "is not one Kimi K3 supports" in message and "never read as a neighbour" in message


def test_an_unknown_label_beside_known_nodes_refuses_the_pool() -> None:
    # Before the table, the majority product won and the NVL nodes got H200 SXM-sized pods.
    nodes = [_h200(f"sxm-{i}") for i in range(4)] + [_h200("nvl-0", "NVIDIA-H200-NVL"), _h200("b-0", "NVIDIA-B200A")]
    with pytest.raises(PlanningError) as info:
        _plan({"nodeSelector": {"pool": "h"}}, nodes)
    assert info.value.reason == HARDWARE_UNSUPPORTED
    assert "GPUs 'NVIDIA-B200A' (1 of 6 nodes; closest known labels: NVIDIA-B200" in info.value.message
    assert "'NVIDIA-H200-NVL' (1 of 6 nodes; closest known labels: NVIDIA-H200" in info.value.message
    # a selector that leaves them out plans the known nodes
    for n in nodes[:4]:
        n["metadata"]["labels"]["pool"] = "sxm"
    assert _plan({"nodeSelector": {"pool": "sxm"}}, nodes).pools[0].gpu_product == "H200"


def test_gpu_product_set_by_the_user_plans_nodes_with_an_unknown_label() -> None:
    nodes = [_h200(f"nvl-{i}", "NVIDIA-H200-NVL") for i in range(2)]
    plan = _plan({"nodeSelector": {"pool": "h"}, "gpu": {"product": "H200"}}, nodes)
    assert plan.pools[0].gpu_product == "H200"


def test_gpu_nodes_without_a_product_label_are_still_refused() -> None:
    bare = node("bare", "x", 8)
    del bare["metadata"]["labels"]["nvidia.com/gpu.product"]
    with pytest.raises(PlanningError) as info:
        _plan({}, [bare])
    assert info.value.reason == HARDWARE_UNSUPPORTED and "carry no GPU product label" in info.value.message
