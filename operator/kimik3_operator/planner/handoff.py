"""What vLLM 0.33.0's NIXL handshake compares between a prefill and a decode of Kimi K3, as rules.

The rule that bites (docs/pd-handoff.md has the whole list of checks):
- K3's KV cache manager block B follows the tensor-parallel size (blocks.py): 1,536 tokens at TP8
  and 2,944 at TP4 with FP8 KV, for instance.
- Each worker cuts B into kernel blocks: B itself when every attention backend of the transfer
  layers runs it, else the largest explicit size of one that divides B (`select_common_block_size`,
  v1/worker/utils.py:515-560); the NIXL worker calls B / kernel block its
  `physical_blocks_per_logical` (`_sync_block_size_with_kernel`, nixl/base_worker.py:1063-1082).
- K3's transfer layers are its MLA layers (and the DSpark draft's, the same MLA class:
  models/kimi_k3/nvidia/mla.py:324-331) on the backend the platform picks (`MLA_PRIORITY`), and its
  KDA layers, whose backend runs any block (KimiK3KDAAttentionBackend is a GDNAttentionBackend,
  which keeps the default `MultipleOf(1)`).
- The decode (the local side in pull mode) checks that the tensor sizes divide one another, splits
  a remote block its own kernel block is no multiple of into common units (each split multiplies the
  remote's blocks per logical block), checks that its kernel block is a multiple of the remote's,
  and, with prefix caching on, refuses a peer with another `physical_blocks_per_logical`
  (nixl/base_worker.py:2766-2779). `handshake_problem` replays these in that order.

So on Blackwell (FLASHINFER_MLA, 64-token kernel blocks) and on Hopper with FP8 KV (FLASHMLA, 64)
a prefill and a decode must have the same B, which for K3 means the same tensor-parallel size
(every other input of B is deployment-wide). Where the kernel runs the whole block (Hopper with BF16
KV: FLASH_ATTN_MLA; MI355X: AITER MLA) both ratios are 1, and a pair passes only when the decode's B
is a multiple of the prefill's, so no split is needed: an H200 prefill at TP8 (768 tokens) with a
decode at TP4 (1,536) passes, the reverse does not. The router pairs every prefill with every decode
of a deployment, across pools, so the rule holds for all of them.

One `--block-size` for every role would equalise B too, but only at the largest B of any paired role,
padding every other role's KDA page to it (7.4x the KDA bytes per sequence on a TP8 decode beside a
TP1 prefill) and coarsening its prefix hits to that many tokens: the planner never picks that, and
`--block-size` is owned (the planner derives B), as are the flags that choose the attention backend
or move B otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..api.reasons import INVALID_SPEC, PD_INCOMPATIBLE
from .blocks import block_size
from .catalog import GpuSpec
from .layout import describe
from .plan import EngineSettings, Layout, PlanningError

_AUTO_FP8 = frozenset({"auto", "float16", "bfloat16", "fp8", "fp8_e4m3"})


@dataclass(frozen=True)
class MlaBackend:
    """One dense MLA attention backend of vLLM 0.33.0, as its class declares it."""

    source: str
    """Its class in vLLM 0.33.0 (v1/attention/backends/mla/)."""
    kv_dtypes: frozenset[str]
    """supported_kv_cache_dtypes."""
    capability_majors: frozenset[int] | None = None
    """supports_compute_capability: the CUDA majors it runs on; None: any."""
    kernel_blocks: tuple[int, ...] = ()
    """get_supported_kernel_block_sizes: the explicit sizes its kernels run..."""
    multiple_of: int | None = None
    """...or any multiple of this (MultipleOf)."""

    def runs(self, block: int) -> bool:
        return block in self.kernel_blocks or (self.multiple_of is not None and block % self.multiple_of == 0)


MLA_BACKENDS: dict[str, MlaBackend] = {
    "FLASHINFER_MLA": MlaBackend("flashinfer_mla.py:FlashInferMLABackend", _AUTO_FP8, frozenset({10}), (32, 64)),
    "TOKENSPEED_MLA": MlaBackend("tokenspeed_mla.py:TokenspeedMLABackend", frozenset({"fp8", "fp8_e4m3"}),
                                 frozenset({10}), (32, 64)),
    "CUTLASS_MLA": MlaBackend("cutlass_mla.py:CutlassMLABackend", _AUTO_FP8, frozenset({10}), (128,)),
    "FLASH_ATTN_MLA": MlaBackend("flashattn_mla.py:FlashAttnMLABackend", frozenset({"auto", "float16", "bfloat16"}),
                                 frozenset({9}), multiple_of=16),
    "FLASHMLA": MlaBackend("flashmla.py:FlashMLABackend", _AUTO_FP8, frozenset({9, 10}), (64,)),
    "TRITON_MLA": MlaBackend("triton_mla.py:TritonMLABackend", _AUTO_FP8, multiple_of=16),
    "ROCM_AITER_MLA": MlaBackend("rocm_aiter_mla.py:AiterMLABackend", _AUTO_FP8 | {"fp8_e5m2"}, multiple_of=1),
}
"""The dense MLA backends K3 can land on (K3 calls the selector with use_sparse=False:
models/kimi_k3/nvidia/mla.py:324-331, so the sparse ones never qualify)."""

MLA_PRIORITY: dict[tuple[str, int | None], tuple[str, ...]] = {
    ("nvidia", 10): ("FLASHINFER_MLA", "TOKENSPEED_MLA", "CUTLASS_MLA", "FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA"),
    ("nvidia", 9): ("FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA"),
    ("amd", None): ("ROCM_AITER_MLA", "TRITON_MLA"),
}
"""The dense part of vLLM's MLA priority per (vendor, CUDA major): platforms/cuda.py:83-155
`_get_backend_priorities`; platforms/rocm.py:531-552 with AITER's MLA on (the operator renders
VLLM_ROCM_USE_AITER=1 on AMD pools). The first backend that runs the GPU and the KV cache dtype wins."""

KDA_KERNEL_MULTIPLE = 1
"""KimiK3KDAAttentionBackend (models/kimi_k3/nvidia/kda_metadata.py:740) keeps AttentionBackend's
default get_supported_kernel_block_sizes, MultipleOf(1) (v1/attention/backend.py:76-79)."""


def mla_backend(gpu: GpuSpec, kv_cache_dtype: str) -> str:
    """The MLA backend vLLM 0.33.0 picks for K3 on `gpu` with this --kv-cache-dtype."""
    major = gpu.compute_capability[0] if gpu.compute_capability else None
    for name in MLA_PRIORITY.get((gpu.vendor, major), ()):
        backend = MLA_BACKENDS[name]
        if kv_cache_dtype in backend.kv_dtypes and (
                backend.capability_majors is None or major in backend.capability_majors):
            return name
    sparse = (" (fp8_ds_mla is the sparse-MLA format; Kimi K3's MLA is dense): use auto or fp8"
              if kv_cache_dtype == "fp8_ds_mla" else "")
    raise PlanningError(
        INVALID_SPEC,
        f"engine.kvCacheDtype {kv_cache_dtype}: no dense MLA attention backend of vLLM 0.33.0 stores it on "
        f"{gpu.product}, so the engines would not start{sparse}")


def kernel_block(block: int, backend: MlaBackend) -> int:
    """vLLM's select_common_block_size over the MLA backend and the KDA backend (which runs any size)."""
    if backend.runs(block) and block % KDA_KERNEL_MULTIPLE == 0:
        return block
    divisors = [s for s in backend.kernel_blocks if block % s == 0]
    if divisors:
        return max(divisors)
    raise PlanningError(INVALID_SPEC, f"no kernel block of {backend.source} divides the KV block of {block} tokens")


MAX_HYBRID_BLOCK_SPLIT = 128
"""nixl/base_worker.py `_MAX_HYBRID_BLOCK_SPLIT`: the most transfers a remote block is split into."""


@dataclass(frozen=True)
class HandoffBlocks:
    """How one prefill or decode role's engines cut their KV block for NIXL."""

    where: str
    role: str
    layout: Layout
    gpu: str
    backend: str
    block: int
    """The KV cache manager's block, tokens (blocks.py)."""
    kernel: int
    """The attention kernel's block, tokens."""

    @property
    def per_logical(self) -> int:
        """physical_blocks_per_logical, which the handshake compares."""
        return self.block // self.kernel

    def describe(self) -> str:
        return (f"{self.where} ({describe(self.layout)} on {self.gpu}: KV block {self.block} tokens = "
                f"{self.per_logical} {self.backend} kernel blocks of {self.kernel})")


def handoff_blocks(where: str, role: str, gpu: GpuSpec, layout: Layout, engine: EngineSettings) -> HandoffBlocks:
    name = mla_backend(gpu, engine.kv_cache_dtype)
    block = block_size(layout.tensor, engine.kv_dtype_family, engine.ssm_dtype, engine.speculative_tokens)
    return HandoffBlocks(where=where, role=role, layout=layout, gpu=gpu.product, backend=name, block=block,
                         kernel=kernel_block(block, MLA_BACKENDS[name]))


def handshake_problem(prefill: HandoffBlocks, decode: HandoffBlocks, prefix_caching: bool) -> str | None:
    """Why the decode's handshake with the prefill fails, or None: vLLM's checks replayed in their
    order, the decode being the local side in pull mode (docs/pd-handoff.md)."""
    p, d = prefill.layout.tensor, decode.layout.tensor
    if max(p, d) % min(p, d):
        return f"tensor sizes {p} and {d} do not divide one another (kv_connector/utils.py:522-539)"
    kernel, per_logical = prefill.kernel, prefill.per_logical
    if decode.kernel % kernel:  # _split_remote_blocks (nixl/base_worker.py:2338-2387)
        unit = math.gcd(decode.kernel, kernel)
        if max(kernel, decode.kernel) // unit <= MAX_HYBRID_BLOCK_SPLIT:
            per_logical *= kernel // unit
            kernel = unit
    if decode.kernel % kernel:
        return (f"the decode's {decode.kernel}-token kernel block is no multiple of the prefill's {kernel} "
                "(kv_connector/utils.py:541-547)")
    if prefix_caching and decode.per_logical != per_logical:
        return (f"with prefix caching a hybrid model's logical block must hold as many kernel blocks on both sides: "
                f"{decode.per_logical} on the decode, {per_logical} on the prefill (nixl/base_worker.py:2766-2779)")
    return None


Refused = tuple[HandoffBlocks, HandoffBlocks, str]
"""(prefill, decode, why vLLM refuses the pair)."""


def refused_pairs(roles: Sequence[HandoffBlocks], prefix_caching: bool) -> list[Refused]:
    """Every (prefill, decode) pair the router can form (all of them, across pools) that vLLM refuses."""
    return [(p, d, problem) for p in roles if p.role == "prefill" for d in roles if d.role == "decode"
            if (problem := handshake_problem(p, d, prefix_caching)) is not None]


def refusal(refused: Sequence[Refused], why: str = "", *, depends_on_nodes: bool = False) -> PlanningError:
    """PDIncompatible naming the refused pairs with their numbers; `why`: what the planner tried."""
    shown = "; ".join(f"{p.describe()} with {d.describe()}: {problem}" for p, d, problem in refused[:3])
    more = f" (and {len(refused) - 3} more pairs)" if len(refused) > 3 else ""
    return PlanningError(
        PD_INCOMPATIBLE,
        f"vLLM 0.33.0's NIXL handshake would refuse {shown}{more}{why}. The router pairs every prefill with "
        "every decode, across pools. K3's KV block follows the tensor-parallel size, so give every prefill and "
        "decode role one tensor size (e.g. prefill parallelism {tensor: 8, data: 2, expert: true} beside a TP8 "
        "decode), or leave the prefill's parallelism out and the planner gives it the decodes' size",
        depends_on_nodes=depends_on_nodes)
