"""`vllm serve` options vLLM 0.33.0's Rust frontend refuses, so `engine.extraArgs` may not set
them while `engine.rustFrontend` is on.

With VLLM_USE_RUST_FRONTEND=1 the leader's `vllm serve` hands every argument whose value differs
from its default to the `vllm-rs frontend` binary as JSON (RustFrontendProcessManager,
v1/utils.py; jsonify_non_default_args, entrypoints/common/startup.py). vllm-rs knows these
options but does not implement them, and exits at start on any of them ("The following arguments
are not implemented in Rust frontend yet"): the engine would crash-loop. Options it does not know
at all it ignores, so they are not listed.

The list is every spelling vLLM's parser has for those settings, found by handing the wheel's
vllm-rs each setting alone (tests/contract/test_vllm_fuzz.py repeats that probe and fails when
the list drifts). Left out: the settings RustFrontendProcessManager never hands over
(--data-parallel-rank, --data-parallel-external-lb, --data-parallel-hybrid-lb, --api-server-count),
those vLLM never hands on (--log-config-file: its default is argparse.SUPPRESS, so it is never
"non-default") and those the operator owns anyway (--allowed-media-domains, --allowed-local-media-path).

A spelling that sets the default (`--no-enable-log-outputs`, `--uvicorn-log-level info`) is
refused too: vllm-rs would not see it, but it changes nothing there, and one plain rule (this
option is not for the Rust frontend) reads better than a table of defaults. `--config=file` is
refused as vllm-rs would (vLLM expands only the two-argument `--config file` into the file's
options, which are then checked one by one by vLLM, not here).

Two settings vllm-rs takes with some values only (RUST_FRONTEND_VALUES): a value outside them makes
it exit as well. Admission cannot read a value that is the next list item in CEL, so the planner
refuses those with a status condition (InvalidSpec) naming the values it takes.
"""

from __future__ import annotations

from .owned_flags import first_option_in, flag_name, option_in

RUST_FRONTEND_REFUSED: tuple[str, ...] = (
    "--aggregate-engine-logging", "--config", "--default-mm-loras",
    "--enable-elastic-ep", "--disable-elastic-ep", "--no-enable-elastic-ep",
    "--enable-fault-tolerance", "--disable-fault-tolerance", "--no-enable-fault-tolerance",
    "--enable-force-include-usage", "--disable-force-include-usage", "--no-enable-force-include-usage",
    "--enable-log-deltas", "--disable-log-deltas", "--no-enable-log-deltas",
    "--enable-log-outputs", "--disable-log-outputs", "--no-enable-log-outputs",
    "--enable-offline-docs", "--disable-offline-docs", "--no-enable-offline-docs",
    "--enable-prompt-embeds", "--disable-prompt-embeds", "--no-enable-prompt-embeds",
    "--enable-ssl-refresh", "--disable-ssl-refresh", "--no-enable-ssl-refresh",
    "--enable-tower-connector-lora", "--disable-tower-connector-lora", "--no-enable-tower-connector-lora",
    "--fingerprint-mode", "--fingerprint-value", "--grpc", "--h11-max-header-count",
    "--h11-max-incomplete-event-size", "--hf-token", "--io-processor-plugin",
    "--kv-sharing-fast-prefill", "--no-kv-sharing-fast-prefill",
    "--log-error-stack", "--no-log-error-stack", "--max-log-len", "--max-num-queued-reqs",
    "--max-num-queued-tokens", "--media-io-kwargs", "--middleware", "--mm-hasher-algorithm",
    "--mm-ipc-gpu-memory-gb", "--mm-processor-cache-gb", "--mm-processor-cache-type", "--mm-processor-device",
    "--mm-processor-kwargs", "--mm-tensor-ipc", "--override-generation-config",
    "--reasoning-parser-plugin", "--response-role", "--root-path", "--skip-tokenizer-init",
    "--no-skip-tokenizer-init", "--tokens-only", "--no-tokens-only", "--tool-parser-plugin", "--tool-server",
    "--trust-request-mm-kwargs", "--no-trust-request-mm-kwargs", "--uvicorn-log-level",
)


RUST_FRONTEND_VALUES: dict[str, tuple[str, ...]] = {
    "--generation-config": ("auto", "vllm"),
    "--tokenizer-mode": ("auto", "hf", "deepseek_v32", "deepseek_v4", "deepseek_v41", "harmony", "inkling",
                         "kimi_k3"),
}
"""Options vllm-rs exits on with other values: "generation config source ... is not implemented yet
(expected one of: auto, vllm)", "unknown renderer ... (expected one of: ...)" (its own messages).
A folder for --generation-config and vLLM's other tokenizer modes (mistral, cohere, ...) are such."""


def rust_frontend_refuses(args: list[str]) -> str | None:
    """The first argument (as its flag_name) the Rust frontend would exit on, or None."""
    return first_option_in(args, RUST_FRONTEND_REFUSED)


def rust_frontend_refused_value(args: list[str]) -> tuple[str, str] | None:
    """(option, value) of the first argument vllm-rs takes only some values of, given another one
    (`--option=value` or `--option value`), or None."""
    for i, arg in enumerate(args):
        option = option_in(flag_name(arg), RUST_FRONTEND_VALUES)
        if option is None:
            continue
        value = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
        if value not in RUST_FRONTEND_VALUES[option]:
            return option, value
    return None
