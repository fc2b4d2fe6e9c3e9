"""How long a simulated engine step and a P/D hand-off take, from the planner's perf model.

Everything here calls planner/perf.py (and the memory facts it uses) so the simulator and the
planner predict the same numbers; the few pure functions perf.py does not have live here:

- Prefill of prompt tokens [start, end) on one data-parallel rank: perf.prefill_seconds is
  linear plus quadratic (causal attention) in the prompt length, so the work for the new tokens,
  attending to the cached prefix, is prefill(end) - prefill(start); a rank has 1/data of the
  replica's GPUs, hence x data (the planner's own ttftSeconds). Chunked prefill telescopes to the
  same total.
- A decode step of B sequences at mean context C is perf.decode_step_ms. A speculative (DSpark)
  verify step runs 1 + k tokens per sequence: experts and FLOPs for B (1 + k) tokens, KV and KDA
  state read once per sequence. That is perf.decode_step_ms's formula with tokens and sequences
  told apart; at k = 0 it is decode_step_ms, at B = 1 perf.decode_batch1's stepMs (tests hold both).
- A KV hand-off: each decode GPU pulls, over its own NIC (or K3SIM_KV_FABRIC_GBPS), the prompt's
  MLA KV (replicated on every tensor-parallel rank, so each pulls all of it for its pipeline stage)
  and its shard of the KDA state (only the state-bearing slot crosses: vLLM clips the speculative
  scratch slots), plus a fixed post/notification latency. Descriptors: one per KV block per MLA
  layer, plus one per KDA layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..planner.blocks import kda_state_bytes
from ..planner.catalog import GpuSpec
from ..planner.memory import KDA_LAYERS, MLA_BYTES_PER_TOKEN_LAYER, MLA_LAYERS, memory_fit
from ..planner.perf import (BF16_GFLOP_PER_TOKEN, EFFICIENCY, EXPERT_GFLOP_PER_TOKEN, PREFILL_MFU,
                            decode_step_ms, fixed_ms, prefill_seconds, step_bytes)
from ..planner.plan import Layout

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

    def _rank_prefill(self, tokens: int) -> float:
        return prefill_seconds(self.gpu, self.layout, tokens) * self.layout.data if tokens > 0 else 0.0

    def prefill_s(self, end: int, start: int = 0) -> float:
        """One rank computing prompt tokens [start, end), tokens before `start` already in its KV."""
        return self._rank_prefill(end) - self._rank_prefill(start)

    def decode_step_s(self, batch: int, context: float) -> float:
        """One decode (or DSpark verify) step for `batch` sequences over the replica's ranks."""
        if batch <= 0:
            return 0.0
        if not self.spec_tokens:
            return decode_step_ms(self.gpu, self.layout, self.crosses_rdma, batch, int(context), self.kv_dtype) / 1e3
        return self._verify_step_ms(batch, context) / 1e3

    def _verify_step_ms(self, batch: int, context: float) -> float:
        tokens = batch * (1 + self.spec_tokens)
        nbytes = step_bytes(self.layout, tokens, int(context), self.kv_dtype, sequences=batch / self.layout.data)
        bandwidth = nbytes / (EFFICIENCY * self.gpu.hbm_tb_s * 1e12) * 1e3
        expert_rate = (self.gpu.fp8_tflops if self.gpu.blackwell else self.gpu.bf16_tflops) * 1e12
        flops = tokens / self.layout.gpus * (EXPERT_GFLOP_PER_TOKEN * 1e9 / expert_rate + BF16_GFLOP_PER_TOKEN
                                             * 1e9 / (self.gpu.bf16_tflops * 1e12)) / PREFILL_MFU * 1e3
        return fixed_ms(self.layout, self.crosses_rdma) + max(bandwidth, flops)

    def kv_transfer(self, tokens: int) -> Transfer:
        """Decode pulling `tokens` prompt tokens of KV and the sequence's KDA state from prefill."""
        layout = self.layout
        mla_per_gpu = tokens * MLA_BYTES_PER_TOKEN_LAYER[self.kv_dtype] * MLA_LAYERS / layout.pipeline
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
        return MLA_BYTES_PER_TOKEN_LAYER[self.kv_dtype] * MLA_LAYERS / self.layout.pipeline

    def sequence_bytes(self, context: int) -> float:
        """KV of `context` tokens (whole blocks) plus the 1 + k KDA state slots vLLM keeps per request."""
        blocks = math.ceil(max(context, 1) / self.block_size)
        state = kda_state_bytes(self.layout.tensor, self.spec_tokens, self.ssm_dtype) * KDA_LAYERS
        return blocks * self.block_size * self.kv_token_bytes() + state * (1 + self.spec_tokens) / self.layout.pipeline
