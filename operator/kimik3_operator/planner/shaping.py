"""Per-role engine shaping: the scheduler, CUDA-graph and expert-balancing settings of one role,
from the planner's own numbers instead of vLLM's generic defaults.

vLLM 0.33.0 sizes every engine alike when these flags are absent: max_num_seqs 1024 and
max_num_batched_tokens 16384 on GPUs of 160 GB or more (engine/arg_utils.py:2973-2982,
get_batch_defaults), a CUDA-graph ceiling of min(2 x max_num_seqs x decode query length, 1024 on
data-centre Blackwell else 512) (config/vllm.py:2452-2470), no long-prefill cap
(config/scheduler.py:79-84) and no expert load balancing. Peers size each role for its job:
llm-d's wide-EP decode renders max-num-seqs = max-num-batched-tokens = max-cudagraph-capture-size,
"multiplied by the number of speculated tokens" with MTP, and --kv-cache-dtype fp8
(llm-d guides/wide-ep-lws/modelserver/gpu/vllm-deepseek-v4/base/decode.yaml); Dynamo's Kimi K3
recipes set per-role --max-num-seqs / --max-num-batched-tokens (docs/vllm-facts.md,
"Pitfalls"). The rules, per data-parallel rank (each rank is its own vLLM scheduler):

- decode and aggregated: max_num_seqs is the perf model's batch at the ITL target (or at KV
  capacity without one) over the DP ranks, no larger than the CUDA-graph ceiling allows: a
  speculative verify runs 1 + k tokens per sequence, and a batch past the largest captured graph
  runs eagerly (config/vllm.py:2596-2601). The capture size covers max_num_seqs x (1 + k) rounded
  up to vLLM's capture grid (1, 2, 4, multiples of 8 below 256, of 16 from 256:
  config/vllm.py:2573-2590), so the widest decode batch has a graph;
- decode: max_num_batched_tokens = the capture size (a decode step schedules at most that many
  tokens; vLLM caps the capture at the token budget, config/vllm.py:2551-2552);
- prefill: a token budget that takes the typical prompt in one step (rounded up to 2048, at least
  vLLM's own 16384, at most 32768 to bound activation memory), a long-prefill threshold so one long
  prompt cannot take every step from the others (at least the typical prompt, at least a quarter
  of the budget; vLLM drops the cap when the prompt runs alone, config/scheduler.py:80-84), and
  sequences enough for a step full of prompts a quarter of the typical length;
- aggregated: the budget of decode (the capture size) but at least 8192, vLLM's own default for
  mixed batches on smaller GPUs, with the prefill threshold so long prompts share the step;
- EPLB with one redundant expert per EP rank per MoE layer (DeepSeek's serving system, SGLang's
  and TensorRT-LLM's wide-EP recipes: 256 experts on 288 slots) for data-parallel expert roles on
  NVIDIA, where the extra 92 x 17.55 MB per GPU still leaves the KV/KDA floor (memory.py). vLLM
  needs expert parallelism and the physical experts to divide evenly over the EP ranks
  (config/parallel.py:563-590, model_executor/layers/fused_moe/layer.py:270-279); Kimi K3's NVIDIA
  model implements MixtureOfExperts (models/kimi_k3/nvidia/model.py:1406). Not with
  deep_gemm_mega_moe, whose weight mapping knows only the logical experts
  (make_kimi_k3_mega_moe_expert_params_mapping, model.py:343), nor on AMD (its specialized decode
  refuses EPLB: models/kimi_k3/amd/specialized_decode/runtime/__init__.py:98).

Every value may be overridden per role (pools[].<role>.engine, one row per setting in
api/role_settings.py); an override wins as given, and the capture size follows an overridden
max_num_seqs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..api.role_settings import ROLE_SETTINGS, Eplb, given
from ..api.spec import RoleEngine
from ..kimi_k3 import BYTES_PER_EXPERT, MOE_LAYERS, NUM_EXPERTS
from .catalog import GpuSpec
from .memory import memory_fit
from .plan import EngineShape, Layout

SEQS_FLOOR = 1
PREFILL_TOKENS_FLOOR = 16384
"""vLLM's own max_num_batched_tokens on GPUs of 160 GB or more (engine/arg_utils.py:2975-2978)."""
PREFILL_TOKENS_CEILING = 32768
PREFILL_TOKENS_STEP = 2048
AGGREGATED_TOKENS_FLOOR = 8192
PREFILL_SEQS_CEILING = 256
REDUNDANT_EXPERTS_PER_RANK = 1


Overrides = Mapping[str, Any]
"""What a role's engine block sets, by setting name (api/role_settings.py); a name left out, or None:
the planner's value."""


def overrides_of(engine: RoleEngine | None) -> dict[str, Any]:
    """A role's engine block as Overrides."""
    return {s.name: value for s in ROLE_SETTINGS if (value := given(engine, s.name)) is not None}


def capture_ceiling(gpu: GpuSpec | None) -> int:
    """vLLM's default CUDA-graph ceiling: 1024 on data-centre Blackwell (capability family 100),
    512 elsewhere (config/vllm.py:2462-2464)."""
    return 1024 if gpu is not None and gpu.blackwell and gpu.vendor == "nvidia" else 512


def graph_ceiling(capture_size: int | None, token_budget: int | None, gpu: GpuSpec | None) -> int:
    """The largest batch an engine captures a CUDA graph for: its --max-cudagraph-capture-size, else
    vLLM's default ceiling, never above its token budget (config/vllm.py:2551-2552)."""
    ceiling = capture_size or capture_ceiling(gpu)
    return min(ceiling, token_budget) if token_budget else ceiling


def capture_grid(tokens: int) -> int:
    """The smallest size vLLM captures a graph for at or above `tokens` (config/vllm.py:2573-2590)."""
    if tokens <= 4:
        return next(s for s in (1, 2, 4) if s >= tokens)
    if tokens <= 256:
        return -(-tokens // 8) * 8
    return 256 + -(-(tokens - 256) // 16) * 16


def decode_seqs(batch_per_replica: float | None, data: int, spec_tokens: int, gpu: GpuSpec | None) -> int:
    """Sequences one DP rank runs: the replica's batch at SLO over its ranks, no more than the
    largest batch whose verify step still has a CUDA graph under vLLM's ceiling."""
    most = max(SEQS_FLOOR, capture_ceiling(gpu) // (1 + spec_tokens))
    if not batch_per_replica:
        return most
    return max(SEQS_FLOOR, min(most, math.ceil(batch_per_replica / data)))


def prefill_tokens(input_tokens: int) -> int:
    rounded = -(-input_tokens // PREFILL_TOKENS_STEP) * PREFILL_TOKENS_STEP
    return min(PREFILL_TOKENS_CEILING, max(PREFILL_TOKENS_FLOOR, rounded))


def long_prefill_threshold(input_tokens: int, budget: int, max_model_len: int | None) -> int:
    threshold = min(budget, max(input_tokens, budget // 4))
    return min(threshold, max_model_len) if max_model_len else threshold


def redundant_experts(gpu: GpuSpec | None, layout: Layout, moe_backend: str | None, *,
                      max_model_len: int | None, kv_dtype: str, spec_tokens: int, ssm_dtype: str) -> int | None:
    """One redundant expert per EP rank where EPLB applies and the extra weights fit, else None."""
    ep = layout.tensor * layout.data
    if (gpu is None or gpu.vendor != "nvidia" or not layout.expert or layout.data <= 1
            or moe_backend == "deep_gemm_mega_moe"):
        return None
    redundant = REDUNDANT_EXPERTS_PER_RANK * ep
    if (NUM_EXPERTS + redundant) % ep:
        return None
    fit = memory_fit(gpu, layout.tensor, layout.pipeline, layout.data, layout.expert, max_model_len=max_model_len,
                     kv_dtype=kv_dtype, spec_tokens=spec_tokens, ssm_dtype=ssm_dtype)
    extra = REDUNDANT_EXPERTS_PER_RANK * MOE_LAYERS * BYTES_PER_EXPERT / layout.pipeline
    return redundant if fit.shortfall + extra <= 0 else None


def shape(role: str, gpu: GpuSpec | None, layout: Layout, moe_backend: str | None, *,
          batch_at_slo: float | None, input_tokens: int, max_model_len: int | None, kv_dtype: str,
          spec_tokens: int, ssm_dtype: str, overrides: Overrides | None = None) -> EngineShape:
    """The shape of one role; `batch_at_slo` is the perf model's decode batch per replica."""
    o = overrides or {}
    seqs_given: int | None = o.get("max_num_seqs")
    tokens_given: int | None = o.get("max_num_batched_tokens")
    capture_given: int | None = o.get("max_cudagraph_capture_size")
    threshold_given: int | None = o.get("long_prefill_token_threshold")
    eplb = _eplb(o.get("eplb"), redundant_experts(gpu, layout, moe_backend, max_model_len=max_model_len,
                                                  kv_dtype=kv_dtype, spec_tokens=spec_tokens, ssm_dtype=ssm_dtype))
    if role == "prefill":
        budget = tokens_given or prefill_tokens(input_tokens)
        seqs = seqs_given or min(PREFILL_SEQS_CEILING, max(SEQS_FLOOR, math.ceil(4 * budget / input_tokens)))
        return EngineShape(
            max_num_seqs=seqs, max_num_batched_tokens=max(budget, seqs),
            max_cudagraph_capture_size=capture_given,
            long_prefill_token_threshold=_threshold(threshold_given, input_tokens, budget, max_model_len),
            eplb_redundant_experts=eplb)
    seqs = seqs_given or decode_seqs(batch_at_slo, layout.data, spec_tokens, gpu)
    capture = capture_given or capture_grid(seqs * (1 + spec_tokens))
    floor = AGGREGATED_TOKENS_FLOOR if role == "aggregated" else 0
    budget = tokens_given or max(capture, floor)
    return EngineShape(
        max_num_seqs=seqs, max_num_batched_tokens=budget, max_cudagraph_capture_size=capture,
        long_prefill_token_threshold=_threshold(threshold_given, input_tokens, budget, max_model_len)
        if role == "aggregated" else threshold_given,
        eplb_redundant_experts=eplb)


def _eplb(given_eplb: Eplb | None, planned: int | None) -> int | None:
    """The spec's EPLB block over the planner's choice: off, its redundant experts, or on with the
    planner's count (0 where the planner would leave EPLB off)."""
    if given_eplb is None:
        return planned
    if not given_eplb.enabled:
        return None
    return given_eplb.redundant_experts if given_eplb.redundant_experts is not None else (planned or 0)


def _threshold(given_threshold: int | None, input_tokens: int, budget: int, max_model_len: int | None) -> int:
    if given_threshold is not None:
        return given_threshold
    return long_prefill_threshold(input_tokens, budget, max_model_len)
