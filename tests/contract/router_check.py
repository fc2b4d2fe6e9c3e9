#!/usr/bin/env python3
"""Check rendered vllm-router argument lists with vllm-router 0.1.17's own code, offline.

Run with the python of the venv made by scripts/router-venv.sh (the router image's exact lock;
never imported by the project's own venv, which has no vllm-router):

    echo '[{"name": "a", "args": ["--worker-urls", "http://10.0.0.1:8000"]}]' \
      | "$(scripts/router-venv.sh)/bin/python" tests/contract/router_check.py

Input (stdin): a JSON list of cases {"name": str, "args": [...]}, the container's args (the
image's ENTRYPOINT is vllm-router).
Output (stdout): a JSON list of {"name", "ok", "errors": [str], "parsed": {...}}, where parsed
holds what the router understood: mode, engine lists, policies, listeners.
Exit status: 0 all cases ok, 1 some case failed, 2 the harness itself failed.

Per case, what `vllm-router ARGS` does before it contacts an engine:
  parse     the launcher's argparse (vllm_router.launch_router.parse_router_args): names,
            types, choices, the --prefill URL [BOOTSTRAP_PORT] form; and every flag spelled out
            in full (argparse would take an abbreviation, which a later flag can make ambiguous).
  launcher  RouterArgs._validate_router_args: P/D mode needs a --prefill and a --decode, or
            service discovery.
  core      the Rust core's own validation (URL schemes and hosts, policy constraints such as
            power_of_two's two workers per role), which runs only inside Router.start(): start
            is called with the metrics listener moved to a loopback port this script holds, so
            the start stops with a panic at that listener, after validation and before any
            engine is contacted (src/lib.rs start, src/server.rs startup order).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import socket
import sys

from check_harness import serve  # this script's own folder

os.environ["RUST_BACKTRACE"] = "0"  # a panic is the expected outcome: keep its report short

METRICS_PANIC = "failed to install Prometheus metrics exporter"


def _argparse_message(text: str) -> str:
    _, _, message = text.partition(": error: ")
    return " ".join(line.strip() for line in message.splitlines() if line.strip()) or text.strip()


def _abbreviated(args_in: list[str]) -> list[str]:
    """Flags argparse accepts only as abbreviations of the parser's own (`--worker-url`)."""
    import argparse

    from vllm_router.router_args import RouterArgs

    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser, use_router_prefix=False)  # what parse_router_args builds
    return [f"parse: {a} is not spelled as vllm-router spells it" for a in args_in
            if a.startswith("--") and a.split("=", 1)[0] not in parser._option_string_actions]


def _parsed(args) -> dict:
    pd = bool(args.vllm_pd_disaggregation)
    return {
        "mode": "PrefillDecode" if pd else "Aggregated",
        "prefill": [url for url, _ in args.prefill_urls] if pd else [],
        "bootstrap_ports": [port for _, port in args.prefill_urls] if pd else [],
        "decode": list(args.decode_urls) if pd else [],
        "worker_urls": [] if pd else list(args.worker_urls),
        "policy": args.policy, "prefill_policy": args.prefill_policy, "decode_policy": args.decode_policy,
        "kv_connector": args.kv_connector,
        "host": args.host, "port": args.port,
        "prometheus_host": args.prometheus_host, "prometheus_port": args.prometheus_port,
        "service_discovery": bool(args.service_discovery),
        "service_discovery_namespace": args.service_discovery_namespace,
        "service_discovery_port": args.service_discovery_port,
        "selector": dict(args.selector), "prefill_selector": dict(args.prefill_selector),
        "decode_selector": dict(args.decode_selector),
        "worker_startup_timeout_secs": args.worker_startup_timeout_secs,
    }


def _core_errors(args, held_port: int) -> list[str]:
    from vllm_router.router import Router

    # No cluster here: the core's discovery finds no kubeconfig and "continues without service
    # discovery" (src/server.rs startup) after the validation this is for.
    probe = dataclasses.replace(args, host="127.0.0.1", prometheus_host="127.0.0.1", prometheus_port=held_port)
    try:
        Router.from_args(probe).start()
    except ValueError as e:  # pyo3 turns the core's ConfigError into ValueError
        return [f"core: {e}"]
    except BaseException as e:  # noqa: BLE001 - pyo3's PanicException derives from BaseException
        if type(e).__name__ == "PanicException" and METRICS_PANIC in str(e):
            return []
        return [f"core: unexpected {type(e).__name__}: {e}"]
    return ["core: Router.start() returned; the held metrics port did not stop it"]


def check_case(case: dict, held_port: int) -> dict:
    from vllm_router.launch_router import parse_router_args

    name = str(case.get("name", "?"))
    args_in = [str(a) for a in case.get("args", [])]
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            args = parse_router_args(args_in)
    except SystemExit:
        return {"name": name, "ok": False, "errors": ["parse: " + _argparse_message(captured.getvalue())], "parsed": {}}
    except Exception as e:  # noqa: BLE001 - e.g. an invalid bootstrap port
        return {"name": name, "ok": False, "errors": [f"parse: {type(e).__name__}: {e}"], "parsed": {}}
    parsed = _parsed(args)
    if spelling := _abbreviated(args_in):
        return {"name": name, "ok": False, "errors": spelling, "parsed": parsed}
    try:
        args._validate_router_args()
    except Exception as e:  # noqa: BLE001
        return {"name": name, "ok": False, "errors": [f"launcher: {e}"], "parsed": parsed}
    errors = _core_errors(args, held_port)
    return {"name": name, "ok": not errors, "errors": errors, "parsed": parsed}


def check_all(cases: list[dict]) -> list[dict]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        return [check_case(c, held.getsockname()[1]) for c in cases]


if __name__ == "__main__":
    sys.exit(serve(check_all))
