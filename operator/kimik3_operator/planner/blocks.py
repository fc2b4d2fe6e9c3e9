"""The KV block size vLLM 0.33.0 really uses for Kimi K3, and retention intervals that fit it.

Kimi K3 is hybrid: one KV cache manager holds MLA pages and KDA state pages in the same page
size, so vLLM raises the block size until an MLA page of B tokens holds a KDA state
(`_align_hybrid_block_size`, vllm/platforms/interface.py):
    B = A * ceil(M / (A * P))
with P the MLA bytes per token of one layer in the KV cache dtype, M the KDA state bytes of one
sequence in one layer per GPU with S speculative tokens (both from kimi_k3.py), and A the
alignment unit: 128 for MLA, or --block-size when the user gives a larger one. Checked against
vLLM's own function for TP 1/4/8/16, both KV dtypes, both SSM dtypes and S in {0, 7}.

A positive --prefix-cache-retention-interval must be a multiple of the scheduler block size
(v1/core/kv_cache_coordinator.py), which in this mode is B. Prefill and decode with different
tensor parallel sizes have different B, so one interval must be a multiple of all of them.
"""

from __future__ import annotations

import math

from ..kimi_k3 import MLA_BYTES_PER_TOKEN_LAYER, kda_state_bytes

MLA_ALIGN = 128


def block_size(tensor: int, kv_dtype_family: str, ssm_dtype: str, spec_tokens: int) -> int:
    mla_bytes = MLA_BYTES_PER_TOKEN_LAYER[kv_dtype_family]
    state = kda_state_bytes(tensor, spec_tokens, ssm_dtype)
    return MLA_ALIGN * math.ceil(state / (MLA_ALIGN * mla_bytes))


def retention_granularity(block_sizes: list[int]) -> int:
    return math.lcm(*block_sizes) if block_sizes else MLA_ALIGN


def round_interval(requested: int, granularity: int) -> int:
    """The multiple of `granularity` nearest to `requested` (at least one block; ties go up)."""
    return max(granularity, granularity * math.floor(requested / granularity + 0.5))
