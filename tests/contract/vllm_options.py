#!/usr/bin/env python3
"""Print every option string of `vllm serve`'s parser and the destination it sets, as JSON.

Run with the python of the venv made by scripts/vllm-venv.sh (the project's venv has no vllm):

    "$(scripts/vllm-venv.sh)/bin/python" tests/contract/vllm_options.py
    -> {"--tensor-parallel-size": "tensor_parallel_size", "-tp": "tensor_parallel_size", ...}

Hidden spellings are included (`--no-enable-x`, `--no-disable-x` that vLLM's EnableDisableAction
registers but leaves out of --help), since argparse accepts them all. The owned-flags contract
test uses this to prove every spelling of a flag the operator renders is owned.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ["VLLM_TARGET_DEVICE"] = "cpu"
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    from vllm_check import _serve_parser  # same parser as the contract check

    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # vLLM logs to stdout
    top = _serve_parser()
    serve = next(a for a in top._actions if isinstance(getattr(a, "choices", None), dict)).choices["serve"]
    json.dump({opt: action.dest for opt, action in sorted(serve._option_string_actions.items())}, out, indent=0)
    out.write("\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
