"""The `vllm serve` command line a pod runs, read the way vLLM 0.33.0 reads the flags the simulator needs.

The simulator starts from the exact command the operator renders for a leader pod, so it accepts
`vllm serve MODEL --flag value ...`, the same behind `sh -c '... vllm serve ...'`, and
`--flag=value` / `--flag_name` spellings (vLLM's FlexibleArgumentParser takes both). Only the
settings that change serving behaviour are read; every other flag, known to vLLM or not, is left
alone, so a new rendered flag never stops the simulator. When a flag is given twice the last one
wins, as in argparse: a host-side runner appends `--host 127.0.0.1 --port N` to move a pod onto
loopback without editing the rendered command.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .kv_events import KVEventsConfig, KVEventsError
from .prefix_cache import HASH_ALGOS

SHELLS = {"sh", "bash", "dash", "ash"}


class CommandLineError(ValueError):
    """The command line is not a `vllm serve` command the simulator can stand in for."""


@dataclass(frozen=True)
class ServeArgs:
    model: str
    served_model_names: tuple[str, ...]
    host: str
    port: int
    tensor: int
    pipeline: int
    data: int
    expert: bool
    nnodes: int
    headless: bool
    kv_transfer: dict[str, Any] | None
    speculative: dict[str, Any] | None
    max_model_len: int | None
    prefix_caching: bool
    retention_interval: int | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    max_cudagraph_capture_size: int | None
    load_format: str
    ep_weight_filter: bool
    max_num_queued_reqs: int | None
    kv_cache_dtype: str
    mamba_ssm_cache_dtype: str
    gpu_memory_utilization: float
    shutdown_timeout: int
    block_size: int | None
    decode_context_parallel: int
    force_include_usage: bool
    tool_call_parser: str | None
    auto_tool_choice: bool
    reasoning_parser: str | None
    enable_scale_out: bool
    allowed_media_domains: tuple[str, ...] = ()
    limit_mm_per_prompt: dict[str, Any] | None = None
    otlp_traces_endpoint: str | None = None
    prefix_caching_hash_algo: str = "sha256"
    kv_events: KVEventsConfig | None = None
    num_gpu_blocks_override: int | None = None
    """vLLM's override of the profiled KV block count (config/cache.py): a small cache, for tests
    and benches that need evictions."""

    @property
    def served_model_name(self) -> str:
        return self.served_model_names[0] if self.served_model_names else self.model

    @property
    def speculative_tokens(self) -> int:
        return int((self.speculative or {}).get("num_speculative_tokens") or 0)

    @property
    def speculative_method(self) -> str | None:
        method = (self.speculative or {}).get("method")
        return str(method).lower() if method else None

    @property
    def kv_role(self) -> str | None:
        if not self.kv_transfer or not self.kv_transfer.get("kv_connector"):
            return None
        return str(self.kv_transfer.get("kv_role"))


def serve_tail(argv: Sequence[str]) -> list[str]:
    """The arguments after `vllm serve`, out of a plain or shell-wrapped command."""
    args = list(argv)
    if len(args) >= 3 and args[0].rsplit("/", 1)[-1] in SHELLS and "-c" in args[:3]:
        args = shlex.split(args[args.index("-c") + 1])
    for i in range(len(args) - 1):
        if args[i].rsplit("/", 1)[-1] == "vllm" and args[i + 1] == "serve":
            return args[i + 2:]
    raise CommandLineError(f"no `vllm serve` in the command line: {shlex.join(list(argv))[:200]}")


def human_int(text: str) -> int | None:
    """vLLM's human-readable sizes (`--max-model-len 1M`): k/m/g decimal, K/M/G binary; -1/auto: None."""
    text = text.strip()
    if text in ("-1", "auto"):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT]?)", text)
    if not m:
        raise CommandLineError(f"not a size: {text!r}")
    number, unit = float(m.group(1)), m.group(2)
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
             "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[unit]
    return int(number * scale)


def _optional_int(text: str) -> int | None:
    """vLLM's optional_type(int) (engine/arg_utils.py): "None" and "" are None."""
    if text in ("None", ""):
        return None
    try:
        return int(text)
    except ValueError:
        raise CommandLineError(f"not an integer: {text!r}") from None


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CommandLineError(f"not JSON: {text[:120]!r}: {exc}") from None
    if not isinstance(value, dict):
        raise CommandLineError(f"not a JSON object: {text[:120]!r}")
    return value


def _kv_events(text: str) -> KVEventsConfig | None:
    try:
        return KVEventsConfig.parse(text)
    except KVEventsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm serve", add_help=False, allow_abbrev=False)
    p.add_argument("--model")
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--enable-expert-parallel", "-ep", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--nnodes", "-n", type=int, default=1)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--kv-transfer-config", type=_json)
    p.add_argument("--speculative-config", "-sc", type=_json)
    p.add_argument("--max-model-len", type=human_int)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    # vLLM's optional int: "None" is dense retention; 0 (its default) semantic checkpoints only.
    p.add_argument("--prefix-cache-retention-interval", type=_optional_int, default=0)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=human_int)
    p.add_argument("--max-cudagraph-capture-size", type=human_int)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--enable-ep-weight-filter", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--max-num-queued-reqs", type=int)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--mamba-ssm-cache-dtype", default="auto")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    p.add_argument("--shutdown-timeout", type=int, default=0)
    p.add_argument("--block-size", type=int)
    p.add_argument("--decode-context-parallel-size", "-dcp", type=int, default=1)
    p.add_argument("--enable-force-include-usage", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--tool-call-parser")
    p.add_argument("--enable-auto-tool-choice", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--reasoning-parser")
    p.add_argument("--enable-scale-out", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--disable-scale-out", dest="enable_scale_out", action="store_false")
    p.add_argument("--allowed-media-domains", nargs="+")
    p.add_argument("--limit-mm-per-prompt", type=_json)
    p.add_argument("--otlp-traces-endpoint")
    p.add_argument("--prefix-caching-hash-algo", default="sha256", choices=sorted(HASH_ALGOS))
    p.add_argument("--kv-events-config", type=_kv_events)
    p.add_argument("--num-gpu-blocks-override", type=int)
    return p


PARSER = _parser()
SIMULATOR_OPTIONS = {opt: action.dest for action in PARSER._actions for opt in action.option_strings}
"""Every option string the simulator reads, with its argparse dest (checked against vLLM's parser)."""


def _normalise(token: str) -> str:
    """`--max_model_len=1M` -> `--max-model-len=1M`, as FlexibleArgumentParser does."""
    if not token.startswith("--"):
        return token
    name, eq, value = token.partition("=")
    return name.replace("_", "-") + eq + value


def parse_serve(argv: Sequence[str]) -> ServeArgs:
    tail = serve_tail(argv)
    positional = tail[0] if tail and not tail[0].startswith("-") else None
    rest = [_normalise(t) for t in (tail[1:] if positional else tail)]
    # Values of flags the simulator does not read land in `unknown`, which is ignored on purpose.
    try:
        ns, _unknown = PARSER.parse_known_args(rest)
    except SystemExit:  # argparse's way of saying a value did not convert
        raise CommandLineError(f"cannot read the command line: {shlex.join(tail)[:300]}") from None
    model = ns.model or positional
    if not model:
        raise CommandLineError("`vllm serve` without a model")
    disable = "--disable-prefix-caching" in rest  # vLLM's older spelling of --no-enable-prefix-caching
    return ServeArgs(
        model=model,
        served_model_names=tuple(ns.served_model_name or ()),
        host=ns.host,
        port=ns.port,
        tensor=ns.tensor_parallel_size,
        pipeline=ns.pipeline_parallel_size,
        data=ns.data_parallel_size,
        expert=ns.enable_expert_parallel,
        nnodes=ns.nnodes,
        headless=ns.headless,
        kv_transfer=ns.kv_transfer_config,
        speculative=ns.speculative_config,
        max_model_len=ns.max_model_len,
        # On by default for a model that supports it, which Kimi K3 does.
        prefix_caching=not disable and ns.enable_prefix_caching is not False,
        retention_interval=ns.prefix_cache_retention_interval,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        max_cudagraph_capture_size=ns.max_cudagraph_capture_size,
        load_format=ns.load_format,
        ep_weight_filter=ns.enable_ep_weight_filter,
        max_num_queued_reqs=ns.max_num_queued_reqs,
        kv_cache_dtype=ns.kv_cache_dtype,
        mamba_ssm_cache_dtype=ns.mamba_ssm_cache_dtype,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        shutdown_timeout=ns.shutdown_timeout,
        block_size=ns.block_size,
        decode_context_parallel=ns.decode_context_parallel_size,
        force_include_usage=ns.enable_force_include_usage,
        tool_call_parser=ns.tool_call_parser,
        auto_tool_choice=ns.enable_auto_tool_choice,
        reasoning_parser=ns.reasoning_parser,
        enable_scale_out=ns.enable_scale_out,
        allowed_media_domains=tuple(ns.allowed_media_domains or ()),
        limit_mm_per_prompt=ns.limit_mm_per_prompt,
        otlp_traces_endpoint=ns.otlp_traces_endpoint,
        prefix_caching_hash_algo=ns.prefix_caching_hash_algo,
        kv_events=ns.kv_events_config,
        num_gpu_blocks_override=ns.num_gpu_blocks_override,
    )
