#!/usr/bin/env python3
"""Validate bodies as vLLM 0.33.0's /inference/v1/generate would parse them: the GenerateRequest
model that its /render paths answer with (entrypoints/scale_out/token_in_token_out/protocol.py).

Run with the python of the venv made by scripts/vllm-venv.sh (the project's venv has no vllm):

    echo '{"completion": [{"request_id": "cmpl-1", "token_ids": [1], "sampling_params": {}}]}' \\
      | "$(scripts/vllm-venv.sh)/bin/python" tests/contract/vllm_render.py
    -> {"completion": []}    (the validation errors of each case's items; none when vLLM accepts them)

A case is a list of bodies (a completion render answers a list) or one body (a chat render).
Beyond parsing, a field whose value vLLM's model would change (a default filled in where the body
left null, a coerced type) counts as an error, so the simulator writes what vLLM writes.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["VLLM_TARGET_DEVICE"] = "cpu"


def main() -> int:
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # vLLM logs to stdout
    from pydantic import ValidationError
    from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest

    verdicts: dict[str, list[str]] = {}
    for name, case in json.load(sys.stdin).items():
        errors: list[str] = []
        for body in case if isinstance(case, list) else [case]:
            try:
                parsed = GenerateRequest.model_validate(body)
            except ValidationError as exc:
                errors.append(str(exc))
                continue
            dumped = parsed.model_dump(mode="json")
            dumped["sampling_params"] = body["sampling_params"]  # SamplingParams dumps as vLLM's serializer does
            errors += [f"{key}: {body[key]!r} becomes {dumped.get(key)!r}" for key in body
                       if key != "sampling_params" and dumped.get(key) != body[key]]
            errors += [f"{key}: vLLM writes it, the simulator does not" for key in dumped if key not in body]
            sampling = parsed.sampling_params
            errors += [f"sampling_params.{key}: {value!r} becomes {getattr(sampling, key, None)!r}"
                       for key, value in body["sampling_params"].items()
                       if getattr(sampling, key, None) != value and not (key == "output_kind"
                                                                         and sampling.output_kind.value == value)]
        verdicts[name] = errors
    json.dump(verdicts, out)
    out.write("\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
