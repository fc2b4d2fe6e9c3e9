"""Kernel backends per role: the all-to-all for expert parallelism and the MoE kernel.

All-to-all (only meaningful when expert parallelism spans data-parallel ranks; vLLM uses it only
then, config/parallel.py): `flashinfer_nvlink_one_sided` while the expert-parallel group stays in
one NVLink domain, `deepep_v2` when it crosses RDMA (the recipe's choice; it needs GPU-initiated
RDMA on the NICs, which is why the override exists). On AMD the MORI kernels play these parts.
MoE kernel: `deep_gemm_mega_moe` for expert parallel layouts whose expert group stays inside one
NVLink domain (it requires --enable-expert-parallel, SM100-family Blackwell and CUDA peer access to
every rank of the group), `deep_gemm` behind DeepEP v2 when the group crosses RDMA (fabric.py says
why both), `flashinfer_trtllm` for tensor parallel Blackwell, Marlin W4A16 on Hopper (no FP4
tensor cores; triton cannot run K3's SiTU experts), AITER on MI355X (with VLLM_ROCM_USE_AITER=1,
without which vLLM falls back to emulation).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.reasons import INVALID_SPEC
from .catalog import GpuSpec
from .fabric import MEGA_MOE, RDMA_MOE, check_megamoe, check_nvlink_all2all, expert_group_crosses
from .plan import Layout, PlanningError


@dataclass(frozen=True)
class BackendRule:
    vendor: str
    generations: frozenset[str] | None = None
    """None: every generation of the vendor."""
    needs_expert_parallel: bool = False


_NV = "nvidia"
_BLACKWELL = frozenset({"blackwell"})
ALL2ALL_RULES: dict[str, BackendRule] = {
    "flashinfer_nvlink_one_sided": BackendRule(_NV),
    "flashinfer_nvlink_two_sided": BackendRule(_NV),
    "flashinfer_all2allv": BackendRule(_NV),
    "deepep_v2": BackendRule(_NV),
    "deepep_high_throughput": BackendRule(_NV),
    "deepep_low_latency": BackendRule(_NV),
    "moonep": BackendRule(_NV),
    "nixl_ep": BackendRule(_NV),
    "mori_high_throughput": BackendRule("amd"),
    "mori_low_latency": BackendRule("amd"),
}
"""Vendor-specific all-to-all kernels; the generic ones (allgather_reducescatter, naive, pplx)
run anywhere."""

MOE_RULES: dict[str, BackendRule] = {
    "deep_gemm_mega_moe": BackendRule(_NV, _BLACKWELL, needs_expert_parallel=True),
    "flashinfer_trtllm": BackendRule(_NV, _BLACKWELL),

    "flashinfer_cutedsl": BackendRule(_NV, _BLACKWELL),
    "flashinfer_moe_ep_cutedsl": BackendRule(_NV, _BLACKWELL, needs_expert_parallel=True),
    "flashinfer_b12x": BackendRule(_NV, _BLACKWELL),
    "b12x": BackendRule(_NV, _BLACKWELL),
    "deep_gemm": BackendRule(_NV, _BLACKWELL),
    "humming": BackendRule(_NV),
    "cutlass": BackendRule(_NV),
    "marlin": BackendRule(_NV),
    "aiter": BackendRule("amd"),
    "rdna3": BackendRule("amd"),
}
"""Vendor- and generation-specific MoE kernels; triton and emulation run anywhere."""

_NO_SITU = "does not run Kimi K3's SiTU experts in vLLM 0.33.0"
UNSUPPORTED_MOE = {
    "flashinfer_moe_ep_mega_deep_gemm": "is DeepSeek-V4 only in vLLM 0.33.0",
    "aiter_mega_moe": "is DeepSeek-V4 only in vLLM 0.33.0",
    "triton": _NO_SITU,
    "flashinfer_cutlass": _NO_SITU,
    "aiter_triton_mxfp4_bf16": _NO_SITU,
    "aiter_triton_mxfp4_mxfp4": _NO_SITU,
}
"""MoE kernels vLLM offers that cannot serve K3 (fused_moe checks, docs/vllm-facts.md §2)."""


def uses_all2all(layout: Layout) -> bool:
    """vLLM runs an all-to-all only when expert parallelism spans data-parallel ranks."""
    return layout.expert and layout.data > 1


def default_all2all(gpu: GpuSpec, layout: Layout, nvlink_gpus: int) -> str | None:
    if not uses_all2all(layout):
        return None
    crosses_rdma = expert_group_crosses(layout, nvlink_gpus)
    if gpu.vendor == "amd":
        return "mori_high_throughput" if crosses_rdma else "mori_low_latency"
    return "deepep_v2" if crosses_rdma else "flashinfer_nvlink_one_sided"


def default_moe(gpu: GpuSpec, layout: Layout, nvlink_gpus: int) -> str:
    if gpu.vendor == "amd":
        return "aiter"
    if gpu.generation == "hopper":
        return "marlin"
    if not layout.expert:
        return "flashinfer_trtllm"
    return RDMA_MOE if expert_group_crosses(layout, nvlink_gpus) else MEGA_MOE


def _check(kind: str, name: str, rule: BackendRule | None, gpu: GpuSpec, layout: Layout) -> None:
    if rule is None:
        return
    if rule.vendor != gpu.vendor:
        raise PlanningError(INVALID_SPEC, f"{kind} backend {name} is {rule.vendor.upper()}-only; "
                                           f"this pool runs {gpu.product}")
    if rule.generations is not None and gpu.generation not in rule.generations:
        allowed = "/".join(sorted(rule.generations))
        raise PlanningError(INVALID_SPEC, f"{kind} backend {name} needs {allowed} GPUs; "
                                           f"{gpu.product} is {gpu.generation}")
    if rule.needs_expert_parallel and not layout.expert:
        raise PlanningError(INVALID_SPEC, f"{kind} backend {name} needs expert parallelism "
                                           "(parallelism.expert: true)")


def choose_backends(gpu: GpuSpec, layout: Layout, nvlink_gpus: int,
                    all2all: str | None, moe: str | None) -> tuple[str | None, str]:
    """(all2all, moe) for one role: overrides validated against the hardware and the NVLink domain
    (`nvlink_gpus` GPUs), else defaults."""
    if all2all is not None:
        if not uses_all2all(layout):
            raise PlanningError(
                INVALID_SPEC,
                f"all2all backend {all2all} has no effect: expert parallelism does not span data-parallel "
                f"ranks in this layout (tensor {layout.tensor}, data {layout.data}, expert {layout.expert})")
        _check("all2all", all2all, ALL2ALL_RULES.get(all2all), gpu, layout)
        check_nvlink_all2all(all2all, layout, nvlink_gpus)
    if moe is not None:
        if moe in UNSUPPORTED_MOE:
            raise PlanningError(INVALID_SPEC, f"moe backend {moe} {UNSUPPORTED_MOE[moe]}")
        _check("moe", moe, MOE_RULES.get(moe), gpu, layout)
        check_megamoe(moe, layout, nvlink_gpus)
    chosen_moe = moe if moe is not None else default_moe(gpu, layout, nvlink_gpus)
    chosen_all2all = all2all if all2all is not None else default_all2all(gpu, layout, nvlink_gpus)
    if all2all is None and chosen_moe == RDMA_MOE and chosen_all2all in NVLINK_A2A_REFUSED_BY_DEEP_GEMM:
        chosen_all2all = "deepep_v2"  # DeepEP v2 also runs inside one NVLink domain
    if chosen_moe == RDMA_MOE and chosen_all2all in NVLINK_A2A_REFUSED_BY_DEEP_GEMM:
        raise PlanningError(INVALID_SPEC, f"moe backend {RDMA_MOE} does not run behind all2all {chosen_all2all} "
                                          "(vLLM 0.33.0 fused_moe/experts/deep_gemm_moe.py:508-512)")
    return chosen_all2all, chosen_moe


NVLINK_A2A_REFUSED_BY_DEEP_GEMM = frozenset({"flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided",
                                             "flashinfer_all2allv"})
"""DeepGemmFP4Experts._supports_parallel_config refuses FlashInfer's NVLink all-to-all kernels."""
