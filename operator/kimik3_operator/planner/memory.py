"""Does a layout fit? Kimi K3's weights and state per GPU, from its real dimensions.

The model's figures (kimi_k3.py): routed experts are MXFP4, everything else BF16, of which a
part is kept whole on every tensor-parallel rank (latent projections, router, MLA q_a/kv_a, KDA f_a).
Experts shard over the expert-parallel group (or over TP when EP is off); the rest shards over
TP only, so data-parallel ranks each hold a full copy of it. Pipeline stages split everything.

A layout fits when weights plus a KV/KDA floor fit in the memory vLLM may use:
usable HBM x gpu_memory_utilization minus runtime overhead (CUDA context, NCCL, activations).
The floor is the larger of one max-length sequence (MLA KV for every token plus its KDA state
slots) and a tenth of usable memory: a pool smaller than that serves almost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..kimi_k3 import (
    BF16_WEIGHT_BYTES,
    GB,
    KDA_LAYERS,
    MAX_MODEL_LEN,
    MLA_BYTES_PER_TOKEN_LAYER,
    MLA_LAYERS,
    REPLICATED_BYTES,
    ROUTED_EXPERT_BYTES,
    kda_state_bytes,
)
from .catalog import GpuSpec

GPU_MEMORY_UTILIZATION = 0.90
RUNTIME_OVERHEAD_BYTES = 4.6 * GB
MIN_POOL_FRACTION = 0.10


@dataclass(frozen=True)
class MemoryFit:
    """The per-GPU memory budget of one layout; `shortfall` > 0 means it does not fit."""

    weights: float
    floor: float
    budget: float

    @property
    def shortfall(self) -> float:
        return self.weights + self.floor - self.budget

    @property
    def fits(self) -> bool:
        return self.shortfall <= 0

    @property
    def free_for_cache(self) -> float:
        return self.budget - self.weights


def weights_per_gpu(tensor: int, pipeline: int, data: int, expert: bool) -> float:
    expert_shards = tensor * data if expert else tensor
    experts = ROUTED_EXPERT_BYTES / (expert_shards * pipeline)
    dense = (BF16_WEIGHT_BYTES - REPLICATED_BYTES) / (tensor * pipeline) + REPLICATED_BYTES / pipeline
    return experts + dense


def kv_cache_bytes(tokens: float, kv_dtype: str, pipeline: int) -> float:
    """MLA KV of `tokens` tokens on one GPU: every tensor-parallel rank holds all of it for its stage."""
    return tokens * MLA_BYTES_PER_TOKEN_LAYER[kv_dtype] * MLA_LAYERS / pipeline


def sequence_bytes(tensor: int, pipeline: int, tokens: int, kv_dtype: str, spec_tokens: int,
                   ssm_dtype: str = "float32") -> float:
    """What one sequence of `tokens` tokens occupies on one GPU: its MLA KV plus its KDA state slots
    (vLLM keeps 1 + k of them per request under speculative decoding)."""
    kda = kda_state_bytes(tensor, spec_tokens, ssm_dtype) * KDA_LAYERS * (1 + spec_tokens) / pipeline
    return kv_cache_bytes(tokens, kv_dtype, pipeline) + kda


def state_floor(gpu: GpuSpec, tensor: int, pipeline: int, max_model_len: int | None,
                kv_dtype: str, spec_tokens: int, ssm_dtype: str = "float32") -> float:
    one_sequence = sequence_bytes(tensor, pipeline, max_model_len or MAX_MODEL_LEN, kv_dtype, spec_tokens, ssm_dtype)
    return max(one_sequence, MIN_POOL_FRACTION * gpu.usable_bytes)


def budget(gpu: GpuSpec) -> float:
    return gpu.usable_bytes * GPU_MEMORY_UTILIZATION - RUNTIME_OVERHEAD_BYTES


def memory_fit(gpu: GpuSpec, tensor: int, pipeline: int, data: int, expert: bool, *,
               max_model_len: int | None, kv_dtype: str = "bf16", spec_tokens: int = 0,
               ssm_dtype: str = "float32") -> MemoryFit:
    return MemoryFit(
        weights=weights_per_gpu(tensor, pipeline, data, expert),
        floor=state_floor(gpu, tensor, pipeline, max_model_len, kv_dtype, spec_tokens, ssm_dtype),
        budget=budget(gpu),
    )


def gb(value: float) -> str:
    return f"{value / GB:.1f} GB"
