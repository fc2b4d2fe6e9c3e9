"""Kimi K3's dimensions and sizes as vLLM 0.33.0 serves it: the one place a model number lives.

The API's validation, the planner's memory, block-size and performance models, and anything that
imitates an engine read these names, so a corrected figure changes everywhere at once. It sits below
the API layer (standard library only, nothing else of the project) because the API validates
against it too.

Sources, tagged on each figure:
  [cfg]     the checkpoint's config.json, as docs/perf-model.md §2.1 quotes it
            (cross-checked there against vLLM 0.33.0's code);
  [vllm]    vLLM 0.33.0 itself, file named (vllm/models/kimi_k3/, vllm/model_executor/...);
  [derived] arithmetic in docs/perf-model.md, section named;
  [brief]   vLLM's announcement, restated in docs/model.md.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 10**9

# --- Shape [cfg] (docs/perf-model.md §2.1); vllm models/kimi_k3/amd/specialized_decode/runtime/__init__.py
# checks K3_SHAPES = (hidden 7168, experts 896, KDA heads 96, head dim 128, conv 4).
LAYERS = 93
HIDDEN_SIZE = 7168
"""The residual stream: what a tensor-parallel all-reduce sums, per token, after attention and MLP."""
KDA_LAYERS = 69
"""Linear-attention layers: each keeps a fixed-size recurrent state per sequence."""
MLA_LAYERS = 24
"""Full-attention layers (1-based 4, 8, ..., 92 and 93): the only ones with a growing KV cache."""
MOE_LAYERS = 92
"""Every layer but the first, whose MLP is dense (first_k_dense_replace = 1)."""
NUM_EXPERTS = 896
"""Routed experts per MoE layer; expert parallel sizes must divide it."""
TOP_K = 16
"""Routed experts each token activates."""
MAX_MODEL_LEN = 1 << 20
"""max_position_embeddings: the context the checkpoint supports (1,048,576 tokens)."""

KDA_HEADS = 96
"""Tensor parallel sizes must divide it (vLLM asserts it at model init)."""
KDA_HEAD_DIM = 128
KDA_CONV_WIDTH = 3
"""Past positions the short convolution (kernel 4) keeps."""
KDA_CONV_CHANNELS = 3 * KDA_HEADS * KDA_HEAD_DIM
"""The q, k and v projections the convolution runs over (3 x 12,288)."""

VISION_HEADS = 12
"""Attention heads of K3's vision tower (MoonViT): vLLM 0.33.0's KimiK3 config default,
vt_num_attention_heads (transformers_utils/configs/kimi_k3.py:23). vLLM shards the tower's heads
over tensor parallel only when they divide evenly (model_executor/models/vision.py:141-156)."""

MLA_HEADS = 96
MLA_QK_HEAD_DIM = 192
"""qk_nope 128 + qk_rope 64."""
MLA_V_HEAD_DIM = 128
MLA_VALUES_PER_TOKEN = 512 + 64
"""What one MLA layer caches per token: kv_lora 512 + rope 64."""

# --- Cache and state sizes [vllm] (docs/perf-model.md §2.4)
MLA_BYTES_PER_TOKEN_LAYER = {"bf16": 2 * MLA_VALUES_PER_TOKEN, "fp8": MLA_VALUES_PER_TOKEN}
"""MLA KV bytes per token per MLA layer by KV cache dtype family; replicated on every TP rank
(vllm nvidia/ops/fused_mla_key_concat_kv_cache.py)."""
SSM_DTYPE_BYTES = {"bfloat16": 2, "float32": 4}
"""Bytes per value of the KDA recurrent state (--mamba-ssm-cache-dtype; auto is float32)."""


def kv_cache_family(kv_cache_dtype: str) -> str:
    """The MLA_BYTES_PER_TOKEN_LAYER key a --kv-cache-dtype stores in: every fp8 variant one byte
    a value, auto (the checkpoint's BF16) two."""
    return "fp8" if kv_cache_dtype.startswith("fp8") else "bf16"


def ssm_cache_dtype(mamba_ssm_cache_dtype: str) -> str:
    """The SSM_DTYPE_BYTES key a --mamba-ssm-cache-dtype stores in: bfloat16, else float32 (auto too)."""
    return "bfloat16" if mamba_ssm_cache_dtype == "bfloat16" else "float32"


def kda_state_bytes(tensor: int, spec_tokens: int, ssm_dtype: str) -> int:
    """KDA state of one sequence in one KDA layer on one GPU: the BF16 conv state (one row more
    per speculative token) plus the recurrent state of this rank's heads
    (vllm model_executor/layers/mamba/mamba_utils.py)."""
    conv = 2 * (KDA_CONV_WIDTH + spec_tokens) * KDA_CONV_CHANNELS // tensor
    recurrent = (KDA_HEADS // tensor) * KDA_HEAD_DIM * KDA_HEAD_DIM * SSM_DTYPE_BYTES[ssm_dtype]
    return conv + recurrent


KDA_STATE_BYTES = 449e6
"""KDA state of one sequence across all KDA layers (FP32 recurrent + BF16 conv), unsharded, as a
flat figure [derived §2.4]; kda_state_bytes(1, 0, "float32") x KDA_LAYERS is within 0.1% of it.
The performance model counts with it; the memory fit uses the exact per-layer function."""

# --- Weights [derived] (docs/perf-model.md §2.2-2.3, §2.5): routed experts MXFP4, everything else BF16
ROUTED_EXPERT_BYTES = 1446.5 * GB
"""All routed experts of all MoE layers (MXFP4 at 4.25 bit with E8M0 scales)."""
BF16_WEIGHT_BYTES = 114.5 * GB
"""Everything that is not a routed expert: attention, shared experts, latent projections,
router, dense MLP, embeddings, vision (only routed experts are MXFP4: vllm mxfp4.py:91-105)."""
REPLICATED_BYTES = 12.3 * GB
"""BF16 weights stock vLLM keeps whole on every TP rank: latent down/up, router, MLA q_a/kv_a, KDA f_a."""
DECODE_REPLICATED_BYTES = 0.85 * GB
"""What vLLM's specialized decode still reads on every rank (it shards router and latent projections)."""
BYTES_PER_EXPERT = 17.55e6
"""One MXFP4 routed expert: 3 x 3584 x 3072 at 4.25 bit."""
BF16_ACTIVE_BYTES = 111.2 * GB
"""BF16 weights one token reads: attention, shared experts, latent projections, lm_head."""

# --- Compute per token [derived] (docs/perf-model.md §2.9)
EXPERT_GFLOP_PER_TOKEN = 97.0
"""Routed experts: 2 x 48.6 B active parameters."""
BF16_GFLOP_PER_TOKEN = 111.0
"""Everything else: 2 x 55.6 B active parameters."""


@dataclass(frozen=True)
class PublishedDecode:
    """The only published measurement: one user, batch 1 [brief]."""

    gpu: str
    tensor: int
    standard_tok_s: float
    dspark_tok_s: float
    dspark_tokens: int
    """Draft tokens per DSpark verify step at that measurement."""
    acceptance_range: tuple[float, float]
    """Accepted tokens per DSpark step: creative writing (2.61) to coding (4.73)."""


PUBLISHED = PublishedDecode(gpu="GB300", tensor=8, standard_tok_s=111.0, dspark_tok_s=331.0,
                            dspark_tokens=7, acceptance_range=(2.61, 4.73))
