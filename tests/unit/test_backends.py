"""Backend rules: all-to-all only when expert parallelism spans DP ranks, NVLink vs RDMA kernels,
MoE kernel by layout and GPU generation, overrides checked against vendor and generation."""

from __future__ import annotations

import pytest

from kimik3_operator.api.reasons import INVALID_SPEC
from kimik3_operator.planner import Layout, PlanningError
from kimik3_operator.planner.backends import choose_backends
from kimik3_operator.planner.catalog import CATALOG

TP8 = Layout(tensor=8)
DEP16 = Layout(tensor=8, data=2, expert=True)
TP8_EP = Layout(tensor=8, expert=True)


@pytest.mark.parametrize(("product", "layout", "rdma", "expected"), [
    ("GB300", TP8, False, (None, "flashinfer_trtllm")),
    ("GB300", Layout(tensor=1, data=16, expert=True), False, ("flashinfer_nvlink_one_sided", "deep_gemm_mega_moe")),
    ("B200", DEP16, True, ("deepep_v2", "deep_gemm_mega_moe")),
    ("B200", Layout(tensor=8, pipeline=2), True, (None, "flashinfer_trtllm")),
    ("GB300", TP8_EP, False, (None, "deep_gemm_mega_moe")),   # EP without DP: no all-to-all
    ("H200", Layout(tensor=8, pipeline=2), True, (None, "marlin")),
    ("H200", DEP16, True, ("deepep_v2", "marlin")),
    ("MI355X", TP8, False, (None, "aiter")),
    ("MI355X", Layout(tensor=4, data=2, expert=True), False, ("mori_low_latency", "aiter")),
])
def test_default_backends(product: str, layout: Layout, rdma: bool, expected: tuple[str | None, str]) -> None:
    assert choose_backends(CATALOG[product], layout, rdma, None, None) == expected


def test_overrides_win_when_valid() -> None:
    assert choose_backends(CATALOG["B200"], DEP16, True, "deepep_low_latency", "deep_gemm") == \
        ("deepep_low_latency", "deep_gemm")


@pytest.mark.parametrize(("product", "layout", "all2all", "moe", "needle"), [
    ("MI355X", TP8, None, "flashinfer_trtllm", "NVIDIA-only"),
    ("MI355X", DEP16, "deepep_v2", None, "NVIDIA-only"),
    ("H200", TP8_EP, None, "deep_gemm_mega_moe", "needs blackwell GPUs"),
    ("H100", TP8, None, "flashinfer_trtllm", "needs blackwell GPUs"),
    ("GB300", TP8, None, "deep_gemm_mega_moe", "needs expert parallelism"),
    ("GB300", TP8, "flashinfer_nvlink_one_sided", None, "has no effect"),
    ("B200", DEP16, "mori_low_latency", None, "AMD-only"),
    ("GB300", TP8, None, "flashinfer_moe_ep_mega_deep_gemm", "DeepSeek-V4 only"),
    ("H200", TP8, None, "triton", "SiTU experts"),
    ("H200", TP8, None, "deep_gemm", "needs blackwell GPUs"),
    ("MI355X", TP8, None, "aiter_triton_mxfp4_bf16", "SiTU experts"),
])
def test_invalid_overrides_are_rejected(product: str, layout: Layout, all2all: str | None, moe: str | None,
                                        needle: str) -> None:
    with pytest.raises(PlanningError) as info:
        choose_backends(CATALOG[product], layout, True, all2all, moe)
    assert info.value.reason == INVALID_SPEC and needle in info.value.message
