#!/usr/bin/env python3
"""Print, as JSON, every `vllm serve` setting the wheel's vllm-rs frontend exits on.

Run with the python of the venv made by scripts/vllm-venv.sh:

    "$(scripts/vllm-venv.sh)/bin/python" tests/contract/vllm_rs_refused.py
    -> {"max_log_len": ["--max-log-len"], ...}

Each setting of the serve parser (except those RustFrontendProcessManager leaves out, and those
whose default is argparse.SUPPRESS, which vllm serve never hands on) is handed to
`vllm-rs frontend --args-json` alone, as vllm serve hands it a non-default value, with values of a
few JSON types until one gets past vllm-rs's type check: the setting is refused when vllm-rs names
it under "not implemented in Rust frontend yet". vllm-rs exits while reading its arguments, before
it touches any descriptor, so no socket or engine is needed (and it runs without a network).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ["VLLM_TARGET_DEVICE"] = "cpu"
sys.path.insert(0, str(Path(__file__).resolve().parent))

VALUES = (12345, "zz", True, ["zz"], {"zz": 1})


def _refused(binary: str, dest: str) -> bool:
    """vllm-rs exits on `dest` as not implemented (False once a value of some type gets past it)."""
    for value in VALUES:
        handed = {"model": "/nonexistent", "model_tag": "/nonexistent", dest: value}
        run = subprocess.run(
            ["unshare", "--net", binary, "frontend", "--listen-fd", "1000", "--input-listener-fd", "1001",
             "--output-listener-fd", "1002", "--args-json", json.dumps(handed)],
            capture_output=True, text=True, timeout=60)
        text = run.stdout + run.stderr
        if "not implemented in Rust frontend" in text:
            return f"- {dest}" in text.splitlines()
        if "invalid JSON arguments" not in text:  # read it: it went on (and failed on the missing model)
            return False
    return False


def main() -> int:
    import vllm
    from vllm_check import RUST_FRONTEND_EXCLUDED, _serve_parser

    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # vLLM logs to stdout
    top = _serve_parser()
    serve = next(a for a in top._actions if isinstance(getattr(a, "choices", None), dict)).choices["serve"]
    spellings: dict[str, list[str]] = {}
    for opt, action in serve._option_string_actions.items():
        # A SUPPRESS default never reaches vllm-rs: jsonify_non_default_args compares with it.
        if action.dest not in RUST_FRONTEND_EXCLUDED and action.dest != "help" and action.default != "==SUPPRESS==":
            spellings.setdefault(action.dest, []).append(opt)
    binary = os.path.join(os.path.dirname(vllm.__file__), "vllm-rs")
    with ThreadPoolExecutor(max_workers=4) as pool:
        verdicts = dict(zip(spellings, pool.map(lambda d: _refused(binary, d), spellings), strict=True))
    json.dump({d: sorted(spellings[d]) for d, refused in sorted(verdicts.items()) if refused}, out, indent=0)
    out.write("\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
