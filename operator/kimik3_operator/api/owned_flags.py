"""vLLM flags the operator renders itself, so `engine.extraArgs` may not set them.

A second copy of a flag would silently win or lose depending on argparse order, and several of
these must agree between prefill and decode for NIXL to hand over KV and KDA state. Each flag
maps to the spec field that controls it (or why it is never rendered).
"""

from __future__ import annotations

_PARALLELISM = "pools[].<role>.parallelism"
OWNED_FLAGS: dict[str, str] = {
    "--model": "model.uri", "--served-model-name": "model.servedName", "--host": "fixed: 0.0.0.0",
    "--port": "fixed: 8000", "--tensor-parallel-size": _PARALLELISM, "-tp": _PARALLELISM,
    "--pipeline-parallel-size": _PARALLELISM, "-pp": _PARALLELISM, "--data-parallel-size": _PARALLELISM,
    "-dp": _PARALLELISM, "--data-parallel-size-local": _PARALLELISM, "-dpl": _PARALLELISM,
    "--data-parallel-address": "the LeaderWorkerSet leader", "-dpa": "the LeaderWorkerSet leader",
    "--data-parallel-rpc-port": "fixed", "-dpp": "fixed", "--data-parallel-start-rank": "the LWS worker index",
    "-dpr": "the LWS worker index", "--enable-expert-parallel": _PARALLELISM, "-ep": _PARALLELISM,
    "--no-enable-expert-parallel": _PARALLELISM, "--nnodes": _PARALLELISM, "-n": _PARALLELISM,
    "--node-rank": "the LWS worker index", "-r": "the LWS worker index", "--master-addr": "the LeaderWorkerSet leader",
    "--master-port": "fixed", "--headless": "worker pods", "--all2all-backend": "pools[].backends.all2all",
    "--moe-backend": "pools[].backends.moe", "--max-model-len": "engine.maxModelLen",
    "--kv-cache-dtype": "engine.kvCacheDtype", "--enable-prefix-caching": "engine.prefixCaching.enabled",
    "--no-enable-prefix-caching": "engine.prefixCaching.enabled",
    "--disable-prefix-caching": "engine.prefixCaching.enabled",
    "--prefix-cache-retention-interval": "engine.prefixCaching.retention",
    "--enable-mamba-shared-prefix-checkpoint": "engine.prefixCaching.retention",
    "--speculative-config": "engine.speculative", "-sc": "engine.speculative",
    "--spec-method": "engine.speculative", "--spec-model": "engine.speculative", "--spec-tokens": "engine.speculative",
    "--kv-transfer-config": "the pool's prefill/decode roles",
    "--disable-hybrid-kv-cache-manager": "never: NIXL needs the hybrid KV cache manager",
    "--tool-call-parser": "engine.toolCalling", "--enable-auto-tool-choice": "engine.toolCalling",
    "--reasoning-parser": "engine.reasoning", "--limit-mm-per-prompt": "engine.multimodal",
    "--gpu-memory-utilization": "fixed: the planner's memory model assumes it",
    "--shutdown-timeout": "engine.shutdownTimeoutSeconds",
    "--quantization": "never: K3's MXFP4 experts are detected from the checkpoint",
    "-q": "never: K3's MXFP4 experts are detected from the checkpoint",
    "--mamba-cache-mode": "never: deprecated in vLLM 0.33.0, no effect",
}


def flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def owned_flag(args: list[str]) -> str | None:
    """The first argument that sets an owned flag, or None."""
    return next((flag_name(a) for a in args if flag_name(a) in OWNED_FLAGS), None)


def cel_list() -> str:
    return "[" + ", ".join(f"'{f}'" for f in OWNED_FLAGS) + "]"
