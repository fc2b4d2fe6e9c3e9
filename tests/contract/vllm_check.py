#!/usr/bin/env python3
"""Check rendered `vllm serve` command lines with vLLM's own parser, offline.

Run with the python of the venv made by scripts/vllm-venv.sh (never imported by
the project's own venv, which has no vllm):

    echo '[{"name": "a", "argv": ["vllm", "serve", "/m", "-tp", "8"], "env": {}}]' \
      | "$(scripts/vllm-venv.sh)/bin/python" tests/contract/vllm_check.py

Input (stdin): a JSON list of cases
    {"name": str, "argv": ["vllm", "serve", ...], "env": {NAME: value},
     "substitutions": {NAME: value},            # optional
     "operator_args": int}                      # optional
Output (stdout): a JSON list of {"name": str, "ok": bool, "errors": [str]}.
Exit status: 0 all cases ok, 1 some case failed, 2 the harness itself failed.

Per case:
  parse     the parser `vllm serve` builds (entrypoints/cli/main.py: a top-level
            FlexibleArgumentParser whose "serve" subparser is make_arg_parser's),
            given argv[1:] so FlexibleArgumentParser's `serve` handling runs too:
            names, types, choices, JSON/pydantic values (--kv-transfer-config).
  validate  what `vllm serve` does next: args.model = args.model_tag, then
            validate_parsed_serve_args (cli/serve.py, common/cli_args.py); and
            --tool-call-parser / --reasoning-parser must name registered parsers.
  env       every VLLM_* name must be in vllm.envs.environment_variables (the
            list vLLM's own --fail-on-environ-validation uses), and its value
            must pass vLLM's reader for it (choices, int/bool conversion).
  config    the scheduler settings (--max-num-seqs, --max-num-batched-tokens,
            --long-prefill-token-threshold, --max-model-len) build vLLM's own
            SchedulerConfig, whose validation refuses a token budget below the
            sequence count or a threshold past the context (config/scheduler.py).
  override  with "operator_args": n, argv[:n] is what the operator rendered and
            the rest are the user's extraArgs: every setting the operator's
            options set must parse to the same value with and without them
            (an alias, abbreviation or `--flag.key=` spelling would change it).
  rust      with VLLM_USE_RUST_FRONTEND=1 in env (a leader on vLLM's Rust frontend): the
            arguments `vllm serve` hands `vllm-rs frontend` (every non-default one, as
            RustFrontendProcessManager builds them: v1/utils.py) must be ones vllm-rs accepts;
            it refuses the rest at start ("not implemented in Rust frontend yet"). The wheel's
            vllm-rs parses them in a network namespace of its own (unshare --net: it can reach
            nothing), against a tiny local tokenizer folder standing in for the model.
Not checked: anything that needs the model's config.json or a GPU
(create_engine_config), nor ServeSubcommand.cmd's launch-mode checks.

Kubernetes `$(NAME)` references in argv and env values are replaced before
parsing (and `$$` read as `$`, as the kubelet does): by the case's "substitutions" if given, else by a plausible value
chosen from the last word of the variable's name (10.0.0.1 for *_ADDRESS,
*_ADDR, *_IP, *_HOST; 1 for *_INDEX, *_RANK, *_SIZE, *_COUNT, *_REPLICAS,
*_NODES; 5600 for *_PORT), e.g. $(LWS_LEADER_ADDRESS), $(LWS_WORKER_INDEX),
$(POD_IP). Any other name is reported as an error: pass it in "substitutions".
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import sys

from check_harness import serve  # this script's own folder

os.environ["VLLM_TARGET_DEVICE"] = "cpu"  # without it, building the parser fails on a host with no GPU

_REF = re.compile(r"\$(?:\$|\(([^)]*)\))")
"""What the kubelet rewrites, left to right: `$$` (a literal `$`) and `$(NAME)` (as the operator's
tests/support/kubelet.py, which this script, run in vLLM's venv, cannot import)."""
_GUESSES = {  # last "_"-separated word of the variable's name -> plausible value
    **dict.fromkeys(("ADDRESS", "ADDR", "IP", "HOST"), "10.0.0.1"),
    "PORT": "5600",
    **dict.fromkeys(("INDEX", "RANK", "SIZE", "COUNT", "REPLICAS", "NODES"), "1"),
}


def _substitute(text: str, subs: dict[str, str], errors: list[str]) -> str:
    def one(m: re.Match) -> str:
        name = m.group(1)
        if name is None:
            return "$"
        if name in subs:
            return subs[name]
        if (guess := _GUESSES.get(name.upper().rsplit("_", 1)[-1])) is not None:
            return guess
        errors.append(f"substitution: no value for $({name}); pass it in \"substitutions\"")
        return m.group(0)

    return _REF.sub(one, text)


@functools.lru_cache(maxsize=1)
def _serve_parser():
    """The parser `vllm serve` uses (entrypoints/cli/main.py + cli/serve.py subparser_init),
    without importing cli/serve.py itself, which pulls in the whole HTTP server. Built once:
    parsing does not change it, and building it costs more than parsing a batch."""
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    sub = top.add_subparsers(required=False, dest="subparser")
    make_arg_parser(sub.add_parser("serve", usage="vllm serve [model_tag] [options]"))
    return top


def _argparse_message(text: str) -> str:
    """argparse prints usage, then "<prog>: error: <message>" (pydantic adds more lines)."""
    _, _, message = text.partition(": error: ")
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    return " ".join(ln for ln in lines if not ln.startswith("For further information visit"))


def _unknown_parsers(args) -> list[str]:
    """Parser names are free strings to argparse; the API server resolves them only at start-up."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    errors = []
    for flag, value, manager in (
        ("--tool-call-parser", args.tool_call_parser, ToolParserManager),
        ("--reasoning-parser", getattr(args, "reasoning_parser", None), ReasoningParserManager),
    ):
        if value and value not in manager.list_registered():
            errors.append(f"validate: {flag} {value!r} is not a registered vLLM parser")
    return errors


def _comparable(value):
    """A parsed value without what differs between two parses of the same argv (the random
    engine_id vLLM gives each KVTransferConfig)."""
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: v for k, v in dataclasses.asdict(value).items() if k != "engine_id"}
    return value


def _overridden(parser, argv: list[str], operator_args: int, args) -> list[str]:
    """Settings of the operator's own options that the trailing user arguments change."""
    serve = next(a for a in parser._actions if isinstance(getattr(a, "choices", None), dict)).choices["serve"]
    dests = {serve._option_string_actions[t.split("=", 1)[0]].dest for t in argv[2:operator_args]
             if t.split("=", 1)[0] in serve._option_string_actions}
    with contextlib.redirect_stderr(io.StringIO()):
        alone = parser.parse_args(argv[1:operator_args])
    return [f"override: extra arguments change {d} from {getattr(alone, d)!r} to {getattr(args, d)!r}"
            for d in sorted(dests) if _comparable(getattr(alone, d)) != _comparable(getattr(args, d))]


def _scheduler_errors(args) -> list[str]:
    """What SchedulerConfig refuses of the parsed scheduler flags (chunked prefill on, as vLLM
    enables it by default; the checkpoint's 1M context when --max-model-len is absent)."""
    from vllm.config import SchedulerConfig

    if args.max_num_seqs is None or args.max_num_batched_tokens is None:
        return []
    try:
        SchedulerConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                        long_prefill_token_threshold=args.long_prefill_token_threshold,
                        max_model_len=args.max_model_len or (1 << 20), is_encoder_decoder=False,
                        enable_chunked_prefill=True)
    except Exception as e:  # noqa: BLE001 - pydantic's ValidationError, vLLM's ValueError
        return [f"config: SchedulerConfig: {e}"]
    return []


RUST_FRONTEND_EXCLUDED = {"api_server_count", "data_parallel_rank", "data_parallel_external_lb",
                          "data_parallel_hybrid_lb"}
"""What RustFrontendProcessManager leaves out of the arguments it hands vllm-rs (v1/utils.py)."""


@functools.lru_cache(maxsize=1)
def _tiny_model() -> str:
    import json
    import tempfile

    from tokenizers import Tokenizer, models

    folder = tempfile.mkdtemp(prefix="vllm-rs-model-")
    Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]")).save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, f)
    return folder


def _rust_frontend_errors(args) -> list[str]:
    import json
    import subprocess

    import vllm
    from vllm.entrypoints.common.startup import jsonify_non_default_args

    handed = jsonify_non_default_args(args, exclude=RUST_FRONTEND_EXCLUDED)
    for key in ("model", "model_tag", "tokenizer"):  # the checkpoint is not here: a local stand-in
        if key in handed or key == "model_tag":
            handed[key] = _tiny_model()
    binary = os.path.join(os.path.dirname(vllm.__file__), "vllm-rs")
    run = subprocess.run(
        ["unshare", "--net", binary, "frontend", "--listen-fd", "1000", "--input-listener-fd", "1001",
         "--output-listener-fd", "1002", "--args-json", json.dumps(handed, sort_keys=True)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    text = run.stdout + run.stderr
    if "--args-json" in text and "invalid value" in text:
        lines = [ln.strip() for ln in text.splitlines()]
        start = next((i for i, ln in enumerate(lines) if "not implemented" in ln), None)
        why = " ".join(lines[start:start + 6]) if start is not None else lines[0]
        return [f"rust: vllm-rs frontend refuses what vllm serve hands it: {why}"]
    return []


def check_case(case: dict) -> dict:
    from vllm import envs
    from vllm.entrypoints.common.cli_args import validate_parsed_serve_args

    name = str(case.get("name", "?"))
    errors: list[str] = []
    subs = {k: str(v) for k, v in (case.get("substitutions") or {}).items()}
    argv = [_substitute(str(a), subs, errors) for a in case.get("argv", [])]
    env = {k: _substitute(str(v), subs, errors) for k, v in (case.get("env") or {}).items()}
    if argv[:2] != ["vllm", "serve"]:
        return {"name": name, "ok": False, "errors": ['argv must start with "vllm", "serve"']}

    saved = dict(os.environ)
    os.environ.update(env)
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    try:
        for var in sorted(k for k in env if k.startswith("VLLM_")):
            if var not in envs.environment_variables:
                errors.append(f"env: unknown vLLM environment variable {var}")
                continue
            try:
                envs.environment_variables[var]()
            except Exception as e:  # noqa: BLE001 - vLLM raises ValueError, int() too
                errors.append(f"env: {var}={env[var]!r}: {e}")

        captured = io.StringIO()
        parser = _serve_parser()
        try:
            with contextlib.redirect_stderr(captured):
                args = parser.parse_args(argv[1:])
        except SystemExit:
            errors.append("parse: " + (_argparse_message(captured.getvalue()) or "argparse exited"))
            return {"name": name, "ok": False, "errors": errors}
        except Exception as e:  # noqa: BLE001 - e.g. ValueError from FlexibleArgumentParser
            errors.append(f"parse: {type(e).__name__}: {e}")
            return {"name": name, "ok": False, "errors": errors}

        try:
            if getattr(args, "model_tag", None) is not None:  # as ServeSubcommand.cmd does
                args.model = args.model_tag
            validate_parsed_serve_args(args)
            errors.extend(_unknown_parsers(args))
            errors.extend(_scheduler_errors(args))
            if case.get("operator_args") is not None and case["operator_args"] < len(argv):
                errors.extend(_overridden(parser, argv, int(case["operator_args"]), args))
            if env.get("VLLM_USE_RUST_FRONTEND") == "1":
                errors.extend(_rust_frontend_errors(args))
        except SystemExit as e:
            errors.append(f"validate: exited {e.code}")
        except Exception as e:  # noqa: BLE001
            errors.append(f"validate: {type(e).__name__}: {e}")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {"name": name, "ok": not errors, "errors": errors}


def check_all(cases: list[dict]) -> list[dict]:
    return [check_case(c) for c in cases]


if __name__ == "__main__":
    sys.exit(serve(check_all))
