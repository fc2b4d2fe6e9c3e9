"""Layout rules: memory fit decides GPUs per replica; tensor parallelism stays in an NVLink
domain and divides the heads; disaggregated roles never pipeline; expert groups divide 896."""

from __future__ import annotations

import dataclasses

import pytest

from kimik3_operator.api.reasons import HARDWARE_UNSUPPORTED, INSUFFICIENT_MEMORY, INVALID_SPEC
from kimik3_operator.planner import Layout, PlanningError
from kimik3_operator.planner.catalog import CATALOG
from kimik3_operator.planner.layout import Fabric, MemoryInputs, check_layout, choose_layout, describe
from kimik3_operator.planner.memory import weights_per_gpu

FULL_CONTEXT = MemoryInputs(max_model_len=None, kv_dtype="bf16", spec_tokens=0)
SHORT_CONTEXT = MemoryInputs(max_model_len=8192, kv_dtype="bf16", spec_tokens=0)


def fabric(product: str, per_node: int | None = None, nvlink: int | None = None) -> Fabric:
    gpu = CATALOG[product]
    node = per_node or gpu.gpus_per_node
    return Fabric(gpu=gpu, gpus_per_node=node, nvlink_gpus=nvlink or gpu.nvlink_domain)


@pytest.mark.parametrize(("product", "gpus"), [
    ("GB300", 8), ("B300", 8), ("MI355X", 8), ("B200", 16), ("GB200", 16), ("H200", 16), ("H100", 32),
])
@pytest.mark.parametrize("mem", [FULL_CONTEXT, SHORT_CONTEXT], ids=["1M", "8K"])
def test_gpus_per_replica_from_memory_fit(product: str, gpus: int, mem: MemoryInputs) -> None:
    assert choose_layout("aggregated", fabric(product), mem).gpus == gpus


@pytest.mark.parametrize(("product", "role", "expected"), [
    ("GB300", "aggregated", Layout(tensor=8)),
    ("GB300", "decode", Layout(tensor=8)),
    ("GB300", "prefill", Layout(tensor=4, data=2, expert=True)),
    ("GB200", "aggregated", Layout(tensor=16)),             # 4 trays in one NVL72 clique
    ("B200", "aggregated", Layout(tensor=8, pipeline=2)),   # TP8 x PP2, the pipeline hop over RDMA
    ("B200", "decode", Layout(tensor=8, data=2, expert=True)),   # DEP16: no PP when disaggregated
    ("B200", "prefill", Layout(tensor=4, data=4, expert=True)),
    ("H200", "aggregated", Layout(tensor=8, pipeline=2)),
    ("H100", "aggregated", Layout(tensor=8, pipeline=4)),
    ("MI355X", "aggregated", Layout(tensor=8)),
])
def test_layout_shape_by_role(product: str, role: str, expected: Layout) -> None:
    assert choose_layout(role, fabric(product), FULL_CONTEXT) == expected


def test_disaggregated_h200_at_full_context_needs_dep32() -> None:
    # DEP16 (TP8 x DP2) leaves too little for one 1M-token sequence's replicated MLA KV.
    assert choose_layout("decode", fabric("H200"), FULL_CONTEXT) == Layout(tensor=8, data=4, expert=True)
    assert choose_layout("decode", fabric("H200"), SHORT_CONTEXT) == Layout(tensor=8, data=2, expert=True)


def test_tensor_parallel_never_leaves_the_nvlink_domain() -> None:
    for product in ("B200", "H200", "B300"):
        for role in ("aggregated", "decode", "prefill"):
            layout = choose_layout(role, fabric(product), FULL_CONTEXT)
            assert layout.tensor <= 8, (product, role, describe(layout))


def test_gb300_without_clique_facts_falls_back_to_node_domain() -> None:
    layout = choose_layout("aggregated", fabric("GB300", nvlink=4), FULL_CONTEXT)
    assert layout.tensor <= 4 and layout.pipeline == 2


def test_weights_per_gpu_match_the_reference_table() -> None:
    assert round(weights_per_gpu(8, 1, 1, False) / 1e9, 1) == 205.9
    assert round(weights_per_gpu(16, 1, 1, False) / 1e9, 1) == 109.1
    assert round(weights_per_gpu(8, 2, 1, False) / 1e9, 1) == 102.9
    assert round(weights_per_gpu(4, 1, 4, True) / 1e9, 1) == 128.3


@pytest.mark.parametrize(("product", "role", "disagg", "layout", "reason", "needle"), [
    ("B200", "aggregated", False, Layout(tensor=8), INSUFFICIENT_MEMORY,
     "8 x B200 (TP8) needs 205.9 GB of weights"),
    ("B200", "aggregated", False, Layout(tensor=16), INVALID_SPEC, "would span the RDMA boundary"),
    ("B200", "decode", True, Layout(tensor=8, pipeline=2), INVALID_SPEC, "NIXL cannot transfer KDA state"),
    ("GB300", "prefill", True, Layout(tensor=1, data=24, expert=True), INVALID_SPEC, "must divide the 896 experts"),
    ("GB300", "aggregated", False, Layout(tensor=6), INVALID_SPEC, "do not fill whole 4-GPU nodes"),
    ("H100", "aggregated", False, Layout(tensor=8, pipeline=3), INSUFFICIENT_MEMORY,
     "the smallest aggregated layout that fits is TP8 x PP4 (32 GPUs)"),
])
def test_explicit_layout_rejections(product: str, role: str, disagg: bool, layout: Layout, reason: str,
                                    needle: str) -> None:
    with pytest.raises(PlanningError) as info:
        check_layout(role, disagg, layout, fabric(product), FULL_CONTEXT)
    assert info.value.reason == reason
    assert needle in info.value.message


def test_explicit_layouts_that_fit_pass() -> None:
    check_layout("aggregated", False, Layout(tensor=8, pipeline=2), fabric("B200"), FULL_CONTEXT)
    check_layout("prefill", True, Layout(tensor=1, data=16, expert=True), fabric("GB300"), FULL_CONTEXT)
    check_layout("decode", True, Layout(tensor=8, data=2, expert=True), fabric("B200"), FULL_CONTEXT)


def test_no_fit_names_the_shortfall() -> None:
    small = dataclasses.replace(CATALOG["H100"], usable_mib=30_000)  # a 30 GiB part
    with pytest.raises(PlanningError) as info:
        choose_layout("decode", Fabric(gpu=small, gpus_per_node=8, nvlink_gpus=8), FULL_CONTEXT)
    assert info.value.reason == HARDWARE_UNSUPPORTED
    assert "8 x H100 (TP8) needs 205.9 GB of weights" in info.value.message and "GB short" in info.value.message
