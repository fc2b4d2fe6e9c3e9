"""The stdin/stdout protocol of the contract checks that run in a venv of their own (vllm_check.py,
router_check.py, handoff_check.py, vllm_responses.py): a JSON list of cases in, a JSON list of
verdicts `{"name", "ok", ...}` out, and nothing else on stdout, which the checked code (vLLM's
logging, the router's Rust core) also prints to. Imported by those scripts from their own folder,
never by the project's tests."""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

Verdicts = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


def serve(check: Verdicts) -> int:
    """Exit status: 0 all cases ok, 1 some case failed, 2 the harness itself failed."""
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    try:
        cases = json.load(sys.stdin)
        if not isinstance(cases, list):
            raise ValueError("stdin must be a JSON list of cases")
        results = check(cases)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return 2
    json.dump(results, out, indent=1)
    out.write("\n")
    out.flush()
    return 0 if all(r["ok"] for r in results) else 1
