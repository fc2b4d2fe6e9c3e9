"""How long a simulated engine step and a P/D hand-off take, from the planner's perf model.

Prefill and decode times are planner/perf.py's own functions and the memory figures
planner/memory.py's, so the simulator and the planner predict the same numbers:

- Prefill of prompt tokens [start, end) on one data-parallel rank is perf.prefill_latency_seconds
  with the first `start` tokens cached: the new tokens attend to the prefix already in the rank's
  KV, so chunked prefill telescopes to the same total as one pass.
- A decode step of B sequences at mean context C, with k DSpark tokens per verify step, is
  perf.decode_step_ms.

The one thing perf.py does not model lives here, a KV hand-off: each decode GPU pulls, over its own
NIC (or K3SIM_KV_FABRIC_GBPS), the prompt's MLA KV (replicated on every tensor-parallel rank, so
each pulls all of it for its pipeline stage) and its shard of the KDA state (only the state-bearing
slot crosses: vLLM clips the speculative scratch slots), plus a fixed post/notification latency.
Descriptors: one per KV block per MLA layer, plus one per KDA layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kimik3_operator.kimi_k3 import KDA_LAYERS, MLA_LAYERS, kda_state_bytes
from kimik3_operator.planner.catalog import GpuSpec
from kimik3_operator.planner.memory import kv_cache_bytes, memory_fit, sequence_bytes
from kimik3_operator.planner.perf import decode_step_ms, prefill_latency_seconds
from kimik3_operator.planner.plan import Layout

KV_POST_SECONDS = 0.0005
"""NIXL post plus completion notification per hand-off: a prior (RDMA round trips), not measured."""


@dataclass(frozen=True)
class Transfer:
    seconds: float
    bytes: float
    descriptors: int


@dataclass(frozen=True)
class PerfModel:
    gpu: GpuSpec
    layout: Layout
    crosses_rdma: bool
    kv_dtype: str
    """MLA KV family as the perf model names it: fp8 or bf16."""
    ssm_dtype: str
    spec_tokens: int
    block_size: int
    fabric_gb_s: float

    def prefill_s(self, end: int, start: int = 0) -> float:
        """One rank computing prompt tokens [start, end), tokens before `start` already in its KV."""
        return prefill_latency_seconds(self.gpu, self.layout, end, cached_tokens=start)

    def decode_step_s(self, batch: int, context: float) -> float:
        """One decode (or DSpark verify) step for `batch` sequences over the replica's ranks."""
        if batch <= 0:
            return 0.0
        return decode_step_ms(self.gpu, self.layout, self.crosses_rdma, batch, int(context), self.kv_dtype,
                              spec_tokens=self.spec_tokens) / 1e3

    def kv_transfer(self, tokens: int) -> Transfer:
        """Decode pulling `tokens` prompt tokens of KV and the sequence's KDA state from prefill."""
        layout = self.layout
        mla_per_gpu = kv_cache_bytes(tokens, self.kv_dtype, layout.pipeline)
        kda_per_gpu = kda_state_bytes(layout.tensor, 0, self.ssm_dtype) * KDA_LAYERS / layout.pipeline
        per_gpu = mla_per_gpu + kda_per_gpu
        gpus = layout.tensor * layout.pipeline
        blocks = math.ceil(tokens / self.block_size)
        return Transfer(seconds=KV_POST_SECONDS + per_gpu / (self.fabric_gb_s * 1e9),
                        bytes=per_gpu * gpus, descriptors=blocks * MLA_LAYERS + KDA_LAYERS)

    # KV cache occupancy of one data-parallel rank, per GPU (every GPU of a rank holds the same share).

    def kv_capacity_bytes(self, max_model_len: int | None) -> float:
        fit = memory_fit(self.gpu, self.layout.tensor, self.layout.pipeline, self.layout.data, self.layout.expert,
                         max_model_len=max_model_len, kv_dtype=self.kv_dtype, spec_tokens=self.spec_tokens,
                         ssm_dtype=self.ssm_dtype)
        return max(fit.free_for_cache, 0.0)

    def kv_token_bytes(self) -> float:
        return kv_cache_bytes(1, self.kv_dtype, self.layout.pipeline)

    def sequence_bytes(self, context: int) -> float:
        """KV of `context` tokens (whole blocks) plus the 1 + k KDA state slots vLLM keeps per request."""
        blocks = math.ceil(max(context, 1) / self.block_size)
        return sequence_bytes(self.layout.tensor, self.layout.pipeline, blocks * self.block_size, self.kv_dtype,
                              self.spec_tokens, self.ssm_dtype)
