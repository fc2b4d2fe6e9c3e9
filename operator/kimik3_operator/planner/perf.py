"""A first-principles performance model of Kimi K3 on vLLM, calibrated on the published figures.

Decode step time = fixed latency + bytes read per GPU / (efficiency x HBM bandwidth), taken as
the larger of that and the step's FLOPs at the MoE/BF16 tensor rates (docs/perf-model.md
§2.5-2.9). Bytes per GPU per step: the active BF16 weights (attention, shared experts, latent
projections) split over tensor parallelism, the distinct routed experts a batch touches split
over the expert group, KDA state read and written per sequence, and MLA KV per context token.
A speculative verify step runs 1 + k tokens, so it touches more experts; tokens per second is
the acceptance length divided by the step time.

Calibration: the only published measurements are GB300 TP8 at batch 1, 111 tok/s standard and
331 tok/s with DSpark (docs/model.md). With the bandwidth efficiency fixed at the usual 0.8
prior, the standard point fixes the per-step fixed latency; the DSpark point, whose acceptance
length was not published, then implies one, which must lie inside the published 2.61-4.73 range.
Other GPUs and layouts reuse the fitted fixed latency scaled by a fabric factor for collectives
over RDMA: extrapolations, marked as such through their inputs. A tensor group wider than the
calibrated TP8 pays, on top, the extra all-reduce time its width costs (tensor_allreduce_ms): the
published point fixes only TP8's collectives, and a TP16 group spanning four GB300 trays runs more
hops per all-reduce than one spanning two.

Pure functions for anything that times requests per role and GPU (the planner's rate matching, an
engine simulator), all taking the pool's GpuSpec and the role's Layout:
- prefill_latency_seconds: one prompt of N tokens, H of them a prefix-cache hit, on one DP rank;
- prefill_seconds: the replica time one such prompt costs (1 / prompts per second per replica);
- decode_step_ms: one decode step at batch B and context C, with k speculative tokens per step;
- decode_batch1: tokens per second for a lone user;
- max_decode_batch: the largest batch the KV/KDA pool holds under an ITL target.
The model's figures come from kimi_k3.py; the priors below are the model's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..kimi_k3 import (
    BF16_ACTIVE_BYTES,
    BF16_GFLOP_PER_TOKEN,
    BYTES_PER_EXPERT,
    DECODE_REPLICATED_BYTES,
    EXPERT_GFLOP_PER_TOKEN,
    GB,
    HIDDEN_SIZE,
    KDA_STATE_BYTES,
    LAYERS,
    MLA_BYTES_PER_TOKEN_LAYER,
    MLA_HEADS,
    MLA_LAYERS,
    MLA_QK_HEAD_DIM,
    MLA_V_HEAD_DIM,
    MOE_LAYERS,
    NUM_EXPERTS,
    PUBLISHED,
    TOP_K,
)
from .catalog import CATALOG, GpuSpec
from .memory import kv_cache_bytes, memory_fit
from .plan import Layout

MLA_ATTN_FLOP_COEFF = MLA_LAYERS * 2 * MLA_HEADS * (MLA_QK_HEAD_DIM + MLA_V_HEAD_DIM) / 2  # x S^2, causal

EFFICIENCY = 0.8                         # achieved / peak HBM bandwidth (AIConfigurator's prior)
PREFILL_MFU = 0.45                       # planning prior until vLLM prefill is measured
RDMA_FIXED_FACTOR = 1.5                  # collectives over RDMA instead of NVLink (prior)
CALIBRATION_CONTEXT = 8192               # context the batch-1 bytes are counted at


def distinct_experts(tokens: float) -> float:
    """Expected distinct experts one MoE layer touches for `tokens` independently routed tokens."""
    return float(NUM_EXPERTS * (1 - (1 - TOP_K / NUM_EXPERTS) ** tokens))


def step_bytes(layout: Layout, tokens: float, context: int, kv_dtype: str = "fp8",
               sequences: float = 1.0) -> float:
    """Bytes on a decode step's critical path per GPU for `tokens` tokens in the step (1, 1 + k for
    a speculative verify, or the batch) and `sequences` sequences per data-parallel rank at `context`
    tokens of context. Pipeline stages run one after another, so a pipeline splits the bytes per
    GPU but not the bytes on the path."""
    tp, ep = layout.tensor, layout.tensor * layout.data if layout.expert else layout.tensor
    bf16 = (BF16_ACTIVE_BYTES - DECODE_REPLICATED_BYTES) / tp + DECODE_REPLICATED_BYTES
    experts = MOE_LAYERS * distinct_experts(tokens) * BYTES_PER_EXPERT / ep
    per_sequence = context * MLA_BYTES_PER_TOKEN_LAYER[kv_dtype] * MLA_LAYERS + 2 * KDA_STATE_BYTES / tp
    return bf16 + experts + sequences * per_sequence


@dataclass(frozen=True)
class Calibration:
    fixed_ms: float
    """Per-step fixed latency at TP8 over NVLink (collectives, launch chains, small GEMVs)."""
    efficiency: float
    standard_residual_tok_s: float
    """Published minus predicted at the calibration point (0 by construction: 1 parameter, 1 point)."""
    implied_acceptance: float
    """Acceptance length that reproduces the published DSpark point."""

    def as_dict(self) -> dict[str, float]:
        return {"fixedMs": round(self.fixed_ms, 3), "efficiency": self.efficiency,
                "standardResidualTokensPerSecond": round(self.standard_residual_tok_s, 3),
                "impliedDSparkAcceptance": round(self.implied_acceptance, 3)}


def _bandwidth_ms(gpu: GpuSpec, nbytes: float) -> float:
    return nbytes / (EFFICIENCY * gpu.hbm_tb_s * 1e12) * 1e3


def calibrate() -> Calibration:
    gpu = CATALOG[PUBLISHED.gpu]
    layout = Layout(tensor=PUBLISHED.tensor)
    measured_ms = 1e3 / PUBLISHED.standard_tok_s
    fixed = measured_ms - _bandwidth_ms(gpu, step_bytes(layout, 1, CALIBRATION_CONTEXT))
    predicted = 1e3 / (fixed + _bandwidth_ms(gpu, step_bytes(layout, 1, CALIBRATION_CONTEXT)))
    verify_ms = fixed + _bandwidth_ms(gpu, step_bytes(layout, 1 + PUBLISHED.dspark_tokens, CALIBRATION_CONTEXT))
    return Calibration(fixed_ms=fixed, efficiency=EFFICIENCY,
                       standard_residual_tok_s=PUBLISHED.standard_tok_s - predicted,
                       implied_acceptance=PUBLISHED.dspark_tok_s * verify_ms / 1e3)


CALIBRATION = calibrate()


LINK_GB_S = {"blackwell": 900.0, "hopper": 450.0, "cdna4": 448.0}
"""Scale-up bandwidth per GPU and direction, GB/s: NVLink 5 (1.8 TB/s bidirectional), NVLink 4,
Infinity Fabric on MI355X (docs/perf-model.md §1)."""
HOP_US = {False: 1.0, True: 5.0}
"""Latency of one step of an all-reduce, µs: over NVLink (NCCL's low-latency protocol; an
assumption of this model, not a measurement) and over RDMA (a verbs round trip through PCIe)."""
ALLREDUCES_PER_LAYER = 2
"""After attention and after the MLP: row-parallel outputs are summed over the tensor group."""


def allreduce_us(ranks: int, nbytes: float, link_gb_s: float, hop_us: float) -> float:
    """One all-reduce of `nbytes` over `ranks` ranks, NCCL-style: the faster of a ring, 2 (p - 1)
    latency steps moving 2 (p - 1) / p of the message, and a double binary tree, 2 log2 p latency
    steps moving the message twice (pipelined)."""
    if ranks <= 1:
        return 0.0
    per_byte_us = 1e6 / (link_gb_s * 1e9)
    ring = 2 * (ranks - 1) * hop_us + 2 * (ranks - 1) / ranks * nbytes * per_byte_us
    tree = 2 * math.ceil(math.log2(ranks)) * hop_us + 2 * nbytes * per_byte_us
    return min(ring, tree)


def tensor_allreduce_ms(gpu: GpuSpec, tensor: int, tokens: float, crosses_rdma: bool) -> float:
    """All-reduce time of one decode step over a tensor group of `tensor` ranks with `tokens` tokens
    in the step on that group: every layer sums HIDDEN_SIZE BF16 values per token twice. Over RDMA
    the link is the pool's NIC (nic_gb_s), else the GPU generation's scale-up link."""
    link = gpu.nic_gb_s if crosses_rdma else LINK_GB_S[gpu.generation]
    one = allreduce_us(tensor, HIDDEN_SIZE * 2 * tokens, link, HOP_US[crosses_rdma])
    return LAYERS * ALLREDUCES_PER_LAYER * one / 1e3


def fixed_ms(crosses_rdma: bool, gpu: GpuSpec | None = None, tensor: int = PUBLISHED.tensor,
             tokens: float = 1.0) -> float:
    """Per-step fixed latency: the calibrated figure (which holds TP8's collectives), scaled when
    collectives cross RDMA, plus what a tensor group wider than TP8 spends on all-reduces beyond
    TP8's at the same tokens. Narrower groups keep the calibrated figure: their all-reduce savings
    go to the all-to-all and launch chains no measurement separates."""
    base = CALIBRATION.fixed_ms * (RDMA_FIXED_FACTOR if crosses_rdma else 1.0)
    if gpu is None or tensor <= PUBLISHED.tensor:
        return base
    extra = (tensor_allreduce_ms(gpu, tensor, tokens, crosses_rdma)
             - tensor_allreduce_ms(gpu, PUBLISHED.tensor, tokens, crosses_rdma))
    return base + max(0.0, extra)


@dataclass(frozen=True)
class Prediction:
    value: float
    unit: str
    inputs: dict[str, float]

    def as_dict(self) -> dict[str, object]:
        return {"value": round(self.value, 2), "unit": self.unit,
                "inputs": {k: round(v, 4) for k, v in self.inputs.items()}}


def decode_batch1(gpu: GpuSpec, layout: Layout, crosses_rdma: bool, *, context: int = CALIBRATION_CONTEXT,
                  spec_tokens: int = 0, acceptance: float = 1.0, kv_dtype: str = "fp8") -> Prediction:
    """Tokens per second for one user: 1 token per step, or `acceptance` per verify step."""
    tokens = 1 + spec_tokens
    nbytes = step_bytes(layout, tokens, context, kv_dtype)
    fixed = fixed_ms(crosses_rdma, gpu, layout.tensor, tokens)
    step = fixed + _bandwidth_ms(gpu, nbytes)
    return Prediction(acceptance * 1e3 / step, "tokens/s", {
        "bytesPerGpuGB": nbytes / GB, "fixedMs": fixed, "efficiency": EFFICIENCY,
        "acceptanceLength": acceptance, "stepMs": step, "contextTokens": context})


def decode_step_ms(gpu: GpuSpec, layout: Layout, crosses_rdma: bool, batch: int, context: int,
                   kv_dtype: str, *, spec_tokens: int = 0) -> float:
    """Time of one decode step, in ms, with `batch` sequences in flight per replica (spread over its
    DP ranks) at `context` tokens each. With `spec_tokens` drafts (DSpark, MTP) every sequence runs a
    verify step of 1 + spec_tokens tokens, which touches more experts and costs more FLOPs; each
    sequence then emits its acceptance length of tokens per step (PUBLISHED.acceptance_range), not 1."""
    tokens = batch * (1 + spec_tokens)
    nbytes = step_bytes(layout, tokens, context, kv_dtype, sequences=batch / layout.data)
    rate = (gpu.fp8_tflops if gpu.blackwell else gpu.bf16_tflops) * 1e12
    flops = tokens / layout.gpus * (EXPERT_GFLOP_PER_TOKEN * 1e9 / rate + BF16_GFLOP_PER_TOKEN * 1e9
                                    / (gpu.bf16_tflops * 1e12)) / PREFILL_MFU * 1e3
    return fixed_ms(crosses_rdma, gpu, layout.tensor, tokens / layout.data) + max(_bandwidth_ms(gpu, nbytes), flops)


def prefill_seconds(gpu: GpuSpec, layout: Layout, input_tokens: int, *, cached_tokens: int = 0) -> float:
    """Compute-bound replica time one prompt of `input_tokens` costs, the first `cached_tokens` of
    them a prefix-cache hit (MLA KV and a KDA state checkpoint at that point): the linear layers run
    the new tokens only, causal attention runs them against the whole prompt. Every GPU of the
    replica counts, so this is 1 / prompts per second per replica, not one prompt's latency."""
    if not 0 <= cached_tokens <= input_tokens:
        raise ValueError(f"cached_tokens {cached_tokens} outside [0, {input_tokens}]")
    expert_rate = (gpu.fp8_tflops if gpu.blackwell else gpu.bf16_tflops) * 1e12
    flops_linear = (input_tokens - cached_tokens) * (EXPERT_GFLOP_PER_TOKEN * 1e9 / expert_rate
                                                     + BF16_GFLOP_PER_TOKEN * 1e9 / (gpu.bf16_tflops * 1e12))
    attention = MLA_ATTN_FLOP_COEFF * (input_tokens**2 - cached_tokens**2) / (gpu.bf16_tflops * 1e12)
    return (flops_linear + attention) / (layout.gpus * PREFILL_MFU)


def prefill_latency_seconds(gpu: GpuSpec, layout: Layout, input_tokens: int, *, cached_tokens: int = 0) -> float:
    """Time from a prompt's start to its first token on an idle replica (TTFT before queueing): a
    prompt runs on one data-parallel rank, so it gets the replica's time x DP."""
    return prefill_seconds(gpu, layout, input_tokens, cached_tokens=cached_tokens) * layout.data


def max_decode_batch(gpu: GpuSpec, layout: Layout, crosses_rdma: bool, context: int, kv_dtype: str,
                     spec_tokens: int, itl_ms: float | None, max_model_len: int | None, *,
                     acceptance: float = 1.0) -> int:
    """Largest batch per replica that fits the KV/KDA pool and keeps the inter-token latency under
    the ITL SLO: with `spec_tokens` drafts a verify step of 1 + k tokens per sequence emits
    `acceptance` tokens, so the ITL is the step time over the acceptance length."""
    fit = memory_fit(gpu, layout.tensor, layout.pipeline, layout.data, layout.expert,
                     max_model_len=max_model_len, kv_dtype=kv_dtype, spec_tokens=spec_tokens)
    per_seq = (kv_cache_bytes(context, kv_dtype, layout.pipeline)
               + KDA_STATE_BYTES * (1 + spec_tokens) / (layout.tensor * layout.pipeline))
    capacity = max(1, int(fit.free_for_cache / per_seq) * layout.data)
    if itl_ms is None:
        return capacity
    low, high = 0, capacity
    while low < high:  # step time grows with batch: binary search the SLO boundary
        mid = (low + high + 1) // 2
        if decode_step_ms(gpu, layout, crosses_rdma, mid, context, kv_dtype, spec_tokens=spec_tokens) \
                <= itl_ms * acceptance:
            low = mid
        else:
            high = mid - 1
    return low


PREFILL_UTILISATION = 0.9    # pipeline bubbles between prompts (AIConfigurator's factor)
DECODE_UTILISATION = 0.92    # decode slots rarely all full (AIConfigurator's factor)
TTFT_QUEUEING = 1.8          # TTFT under load vs a lone prompt (AIConfigurator's correction)


def replicas_for(rate: float, per_replica: float, utilisation: float) -> int:
    return max(1, math.ceil(rate / (per_replica * utilisation))) if per_replica > 0 else 0
