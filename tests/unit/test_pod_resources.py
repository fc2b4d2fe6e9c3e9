"""Serving pods get their GPU share of the node's CPU, memory and ephemeral storage, as Guaranteed
pods; the nodes' allocatable when known, the product's usual node otherwise; the spec overrides."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.api.quantity import quantity
from kimik3_operator.planner import plan_deployment, pool_facts
from kimik3_operator.planner.catalog import CATALOG
from kimik3_operator.planner.facts import node_allocatable
from kimik3_operator.planner.pod_resources import (
    GIB,
    NODE_SHAPES,
    RESERVE_MIN_CPU_MILLIS,
    RESERVE_MIN_MEMORY_BYTES,
    NodeShape,
    node_shape,
    serving_resources,
)
from kimik3_operator.render import Owner, render_children
from tests.fuzz.checks import pod_specs
from tests.support.cases import base_deployment
from tests.support.nodes import gb300_rack, node


def _reserved(total: int, minimum: int) -> Decimal:
    return Decimal(max(minimum, int(total * Decimal("0.08"))))


@settings(max_examples=200, deadline=None, database=None)
@given(cores=st.integers(8, 512), memory_gib=st.integers(64, 8192), per_node=st.sampled_from((1, 2, 4, 8)),
       disk_gib=st.one_of(st.none(), st.integers(1, 60_000)), data=st.data())
def test_the_pods_a_node_holds_fit_its_allocatable_beside_the_reserve(cores: int, memory_gib: int, per_node: int,
                                                                      disk_gib: int | None, data: Any) -> None:
    gpus = data.draw(st.sampled_from([g for g in (1, 2, 4, 8) if g <= per_node]))
    shape = NodeShape(cores * 1000, memory_gib * GIB, disk_gib * GIB if disk_gib else None)
    pod = serving_resources(shape, per_node, gpus)
    pods = per_node // gpus
    # beside the reserve, unless the node is so small that each pod only gets the floor of 1 core / 1 GiB
    cpu_left = shape.cpu_millis - _reserved(shape.cpu_millis, RESERVE_MIN_CPU_MILLIS)
    memory_left = shape.memory_bytes - _reserved(shape.memory_bytes, RESERVE_MIN_MEMORY_BYTES)
    assert pods * quantity(pod.cpu) * 1000 <= max(cpu_left, pods * 1000)
    assert pods * quantity(pod.memory) <= max(memory_left, pods * GIB)
    if disk_gib:
        assert pods * quantity(pod.ephemeral_storage) <= max(disk_gib * GIB, pods * GIB)
    # the share is the GPU share: a pod holding twice the GPUs gets about twice as much
    if gpus * 2 <= per_node:
        double = serving_resources(shape, per_node, gpus * 2)
        assert abs(quantity(double.memory) - 2 * quantity(pod.memory)) <= 2 * GIB
    assert pod.source == "nodes"


def test_without_nodes_the_products_usual_node_is_used() -> None:
    assert set(NODE_SHAPES) == set(CATALOG)  # one figure per product the planner knows
    gb300 = serving_resources(node_shape("GB300", None), 4, 4)
    assert (gb300.cpu, gb300.memory, gb300.source) == ("132", "822Gi", "catalog")  # 144 cores, 894 GiB less 8%
    half_b200 = serving_resources(node_shape("B200", None), 8, 4)
    assert (half_b200.cpu, half_b200.memory) == ("51", "856Gi")  # half of 112 cores and 1,862 GiB less 8%
    assert node_shape(None, None).source == "catalog"


def test_a_node_reporting_no_cpu_or_memory_falls_back_to_the_catalog() -> None:
    assert node_allocatable({"nvidia.com/gpu": "8"}) is None
    assert node_allocatable({"cpu": "0", "memory": "2Ti"}) is None
    assert node_allocatable({"cpu": "500m", "memory": "1Gi"}) == NodeShape(500, GIB, None)
    assert node_allocatable({"cpu": "224", "memory": "2Ti", "ephemeral-storage": "3Ti"}) == NodeShape(
        224_000, 2 << 40, 3 << 40)


def test_the_smallest_node_of_the_pool_sets_the_size() -> None:
    small, big = node("h-small", "NVIDIA-H200", 8), node("h-big", "NVIDIA-H200", 8)
    small["status"]["allocatable"].update(cpu="64", memory="512Gi")
    big["status"]["allocatable"].update(cpu="256", memory="4Ti")
    facts = pool_facts({}, [small, big])
    assert facts.allocatable is not None
    assert (facts.allocatable.cpu_millis, facts.allocatable.memory_bytes) == (64_000, 512 * GIB)


def _plan(resources: dict[str, str] | None, nodes: list[dict[str, Any]]) -> Any:
    body = base_deployment()
    pool = body["spec"]["pools"][0]
    if resources is not None:
        pool["resources"] = resources
    spec = KimiK3Deployment.model_validate(body).spec
    return plan_deployment(spec, {p.name: pool_facts(p.node_selector, nodes) for p in spec.pools})


def test_the_spec_overrides_each_amount_and_the_pods_are_guaranteed() -> None:
    trays = gb300_rack()
    derived = _plan(None, trays)
    given = _plan({"cpu": "40", "memory": "900Gi"}, trays)
    for plan in (derived, given):
        for _, role in plan.role_plans():
            assert role.pod_resources is not None
        objs = render_children(Owner(name="k3", namespace="ns", uid="u"), plan)
        for child in objs:
            if child["kind"] != "LeaderWorkerSet":
                continue
            for _, pod in pod_specs(child):
                for c in [*pod["initContainers"], *pod["containers"]]:
                    assert c["resources"]["requests"] == c["resources"]["limits"]  # Guaranteed
    (_, role), = given.role_plans()[:1]
    assert (role.pod_resources.cpu, role.pod_resources.memory, role.pod_resources.source) == (
        "40", "900Gi", "nodes+spec")
    assert role.pod_resources.ephemeral_storage == "200Gi"  # capped; the nodes report no disk here
