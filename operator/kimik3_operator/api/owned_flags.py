"""vLLM flags the operator renders itself, so `engine.extraArgs` may not set them.

A second copy of a flag would silently win or lose depending on argparse order, and several of
these must agree between prefill and decode for NIXL to hand over KV and KDA state. Each flag
maps to the spec field that controls it (or why it is never rendered).

Every spelling vLLM 0.33.0's parser maps onto one of these settings is listed (aliases, the
--disable-/--no- negations; the contract test checks the list against vLLM's own parser), and
an argument is matched the way that parser reads it (`flag_name`, `owner_of`): `_` for `-`,
`--json-flag.key=v` sets part of `--json-flag`, any unique prefix of a long option abbreviates
it, and `-n4` is `-n 4`.
"""

from __future__ import annotations

from collections.abc import Collection

from .role_settings import owned_spellings

_PARALLELISM = "pools[].<role>.parallelism"
_OFFLOAD = ("not offered yet (a typed option is planned): vLLM 0.33.0 would silently replace a prefill/decode "
            "role's NIXL connector with the offloading one (config/vllm.py:1151-1185)")
_KERNEL_BLOCKS = ("the planner: the MLA attention backend fixes the kernel blocks a prefill/decode hand-off is cut "
                  "into, which vLLM's NIXL handshake compares (planner/handoff.py)")
_BLOCK = ("the planner: it moves K3's KV block, which the planner derives and paired roles must cut alike "
          "(planner/blocks.py, planner/handoff.py)")
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
    "--prefix-caching-hash-algo": "fixed: sha256_cbor, keys a router can recompute from token ids",
    "--enable-mamba-shared-prefix-checkpoint": "engine.prefixCaching.retention",
    "--speculative-config": "engine.speculative", "-sc": "engine.speculative",
    "--spec-method": "engine.speculative", "--spec-model": "engine.speculative", "--spec-tokens": "engine.speculative",
    "--kv-transfer-config": "the pool's prefill/decode roles",
    "--disable-hybrid-kv-cache-manager": "never: NIXL needs the hybrid KV cache manager",
    "--tool-call-parser": "engine.toolCalling", "--enable-auto-tool-choice": "engine.toolCalling",
    "--reasoning-parser": "engine.reasoning", "--limit-mm-per-prompt": "engine.multimodal",
    "--allowed-media-domains": "engine.multimodal.allowedMediaDomains",
    "--allowed-local-media-path": "never: a prompt must not read the node's files",
    "--gpu-memory-utilization": "fixed: the planner's memory model assumes it",
    "--shutdown-timeout": "engine.shutdownTimeoutSeconds",
    "--enable-scale-out": "router policies (CacheAware asks the engines for token ids)",
    "--no-enable-scale-out": "router policies (CacheAware asks the engines for token ids)",
    "--disable-scale-out": "router policies (CacheAware asks the engines for token ids)",
    "--quantization": "never: K3's MXFP4 experts are detected from the checkpoint",
    "-q": "never: K3's MXFP4 experts are detected from the checkpoint",
    "--mamba-cache-mode": "never: deprecated in vLLM 0.33.0, no effect",
    "--device-memory-utilization": "fixed: the planner's memory model assumes it",
    "--disable-expert-parallel": _PARALLELISM,
    "--mamba-ssm-cache-dtype": "engine.kdaStateDtype",
    "--enable-hybrid-kv-cache-manager": "always: NIXL needs the hybrid KV cache manager",
    "--no-disable-hybrid-kv-cache-manager": "always: NIXL needs the hybrid KV cache manager",
    "--disable-auto-tool-choice": "engine.toolCalling", "--no-enable-auto-tool-choice": "engine.toolCalling",
    "--disable-mamba-shared-prefix-checkpoint": "engine.prefixCaching.retention",
    "--no-enable-mamba-shared-prefix-checkpoint": "engine.prefixCaching.retention",
    "--fail-on-environ-validation": "always: a misspelt VLLM_* variable in engine.env stops the engine",
    "--no-fail-on-environ-validation": "always: a misspelt VLLM_* variable in engine.env stops the engine",
    **owned_spellings(),  # the per-role engine settings' (role_settings.py)
    "--chat-template": "engine.chatTemplate",
    "--otlp-traces-endpoint": "engine.tracing", "--collect-detailed-traces": "engine.tracing",
    "--load-format": "model.loading", "--enable-ep-weight-filter": "model.loading (with expert parallelism)",
    "--no-enable-ep-weight-filter": "model.loading (with expert parallelism)",
    "--disable-ep-weight-filter": "model.loading (with expert parallelism)",
    "--safetensors-load-strategy": "model.loading",
    "--model-loader-extra-config": "model.loading (its multithread load would ignore the expert filter)",
    "--language-model-only": "engine.multimodal.maxImagesPerPrompt (0 turns images off)",
    "--no-language-model-only": "engine.multimodal.maxImagesPerPrompt (0 turns images off)",
    "--mm-encoder-tp-mode": "the planner: data on tensor-parallel roles (planner/vision.py)",
    "--distributed-timeout-seconds": "the planner's load-time estimate (planner/timeouts.py)",
    "--cpu-distributed-timeout-seconds": "the planner's load-time estimate (planner/timeouts.py)",
    "--block-size": _BLOCK,
    "--kv-events-config": "router policy PrecisePrefix (each engine core publishes on its pod IP, an OS port)",
    "--kv-offloading-size": _OFFLOAD,
    "--kv-offloading-backend": _OFFLOAD,
    "--attention-backend": _KERNEL_BLOCKS, "--attention-config": _KERNEL_BLOCKS, "-ac": _KERNEL_BLOCKS,
    "--mamba-cache-dtype": _BLOCK, "--kv-cache-dtype-skip-layers": _BLOCK,
}


def flag_name(arg: str) -> str:
    """The option an argument names, as vLLM's FlexibleArgumentParser reads it."""
    return arg.split("=", 1)[0].split(".", 1)[0].replace("_", "-")


def option_in(name: str, flags: Collection[str]) -> str | None:
    """The flag of `flags` that option `name` sets (itself, the long flag it abbreviates, or the
    one-letter flag it starts with), or None for a value or a flag not in `flags`."""
    if not name.startswith("-"):
        return None
    if name in flags:
        return name
    if not name.startswith("--") and name[:2] in flags:
        return name[:2]
    return next((f for f in flags if f.startswith(name)), None)


def owner_of(name: str) -> str | None:
    """The owned flag that option `name` sets, or None for a value or a flag we do not own."""
    return option_in(name, OWNED_FLAGS)


def first_option_in(args: list[str], flags: Collection[str]) -> str | None:
    """The first argument that sets a flag of `flags` (as its flag_name), or None."""
    return next((flag_name(a) for a in args if option_in(flag_name(a), flags)), None)


def owned_flag(args: list[str]) -> str | None:
    """The first argument that sets an owned flag (as its flag_name), or None."""
    return first_option_in(args, OWNED_FLAGS)


def cel_list(flags: Collection[str] = OWNED_FLAGS) -> str:
    return "[" + ", ".join(f"'{f}'" for f in flags) + "]"


CEL_FLAG_NAME = "a.split('=')[0].split('.')[0].replace('_', '-')"
"""flag_name in CEL, of the list element `a`."""


def cel_option_in(n: str, flags: Collection[str]) -> str:
    """option_in(n, flags) is not None, in CEL."""
    listed = cel_list(flags)
    return (f"{n}.startsWith('-') && ((size({n}) > 2 && !{n}.startsWith('--') && {n}.substring(0, 2) in {listed}) "
            f"|| {listed}.exists(f, f.startsWith({n})))")


def cel_owned(n: str) -> str:
    """owner_of(n) is not None, in CEL."""
    return cel_option_in(n, OWNED_FLAGS)
