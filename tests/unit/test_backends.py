"""Backend rules: all-to-all only when expert parallelism spans DP ranks, NVLink vs RDMA kernels (by
whether the expert group fits the NVLink domain),
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


@pytest.mark.parametrize(("product", "layout", "nvlink", "expected"), [
    ("GB300", TP8, 72, (None, "flashinfer_trtllm")),
    ("GB300", Layout(tensor=1, data=16, expert=True), 72, ("flashinfer_nvlink_one_sided", "deep_gemm_mega_moe")),
    ("GB300", Layout(tensor=1, data=16, expert=True), 4, ("deepep_v2", "deep_gemm")),  # no clique labels
    ("B200", DEP16, 8, ("deepep_v2", "deep_gemm")),  # MegaMoE cannot map peers on another board
    ("B200", Layout(tensor=4, data=2, expert=True), 8, ("flashinfer_nvlink_one_sided", "deep_gemm_mega_moe")),
    ("B200", Layout(tensor=8, pipeline=2), 8, (None, "flashinfer_trtllm")),
    ("B200", Layout(tensor=8, pipeline=2, expert=True), 8, (None, "deep_gemm_mega_moe")),  # EP8 per stage
    ("GB300", TP8_EP, 72, (None, "deep_gemm_mega_moe")),   # EP without DP: no all-to-all
    ("H200", Layout(tensor=8, pipeline=2), 8, (None, "marlin")),
    ("H200", DEP16, 8, ("deepep_v2", "marlin")),
    ("MI355X", TP8, 8, (None, "aiter")),
    ("MI355X", Layout(tensor=4, data=2, expert=True), 8, ("mori_low_latency", "aiter")),
])
def test_default_backends(product: str, layout: Layout, nvlink: int, expected: tuple[str | None, str]) -> None:
    assert choose_backends(CATALOG[product], layout, nvlink, None, None) == expected


@pytest.mark.parametrize("nvlink", [4, 8, 16, 32, 72])
@pytest.mark.parametrize(("tensor", "data"), [(1, 8), (1, 16), (2, 8), (4, 4), (8, 1), (8, 2), (8, 4), (4, 32)])
def test_megamoe_only_inside_one_nvlink_domain(nvlink: int, tensor: int, data: int) -> None:
    """Whatever the expert group and the NVLink domain: MegaMoE by default exactly when the group
    fits, and an explicit MegaMoE refused exactly when it does not."""
    layout = Layout(tensor=tensor, data=data, expert=True)
    fits = tensor * data <= nvlink
    _, moe = choose_backends(CATALOG["B200"], layout, nvlink, None, None)
    assert (moe == "deep_gemm_mega_moe") == fits
    if fits:
        assert choose_backends(CATALOG["B200"], layout, nvlink, None, "deep_gemm_mega_moe")[1] == "deep_gemm_mega_moe"
    else:
        with pytest.raises(PlanningError, match="symmetric buffer"):
            choose_backends(CATALOG["B200"], layout, nvlink, None, "deep_gemm_mega_moe")


def test_deep_gemm_inside_a_node_takes_deepep_v2() -> None:
    """DeepGEMM's FP4 experts refuse FlashInfer's NVLink all-to-all (deep_gemm_moe.py:508-512)."""
    layout = Layout(tensor=4, data=2, expert=True)
    assert choose_backends(CATALOG["B200"], layout, 8, None, "deep_gemm") == ("deepep_v2", "deep_gemm")
    with pytest.raises(PlanningError, match="does not run behind"):
        choose_backends(CATALOG["B200"], layout, 8, "flashinfer_nvlink_one_sided", "deep_gemm")


def test_overrides_win_when_valid() -> None:
    assert choose_backends(CATALOG["B200"], DEP16, 8, "deepep_low_latency", "deep_gemm") == \
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
    ("B200", DEP16, "flashinfer_nvlink_one_sided", None, "NVLink only"),
    ("B200", DEP16, None, "deep_gemm_mega_moe", "must stay inside one NVLink domain"),
    ("MI355X", TP8, None, "aiter_triton_mxfp4_bf16", "SiTU experts"),
])
def test_invalid_overrides_are_rejected(product: str, layout: Layout, all2all: str | None, moe: str | None,
                                        needle: str) -> None:
    with pytest.raises(PlanningError) as info:
        choose_backends(CATALOG[product], layout, 8, all2all, moe)
    assert info.value.reason == INVALID_SPEC and needle in info.value.message
