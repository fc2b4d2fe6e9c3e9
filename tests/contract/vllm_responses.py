#!/usr/bin/env python3
"""Validate Responses API answers as vLLM 0.33.0's own models read them: a whole answer is a
ResponsesResponse (entrypoints/openai/responses/protocol.py), a stream event the model of its `type`
(vLLM's lifecycle events, whose `response` is its ResponsesResponse, else the openai SDK's
ResponseStreamEvent union that vLLM emits). Beyond parsing, a field vLLM's model would write
differently (a default where the body left something else, a missing field) is an error, so the
simulator writes what vLLM writes.

Run with the python of the venv made by scripts/vllm-venv.sh, through check_harness.py's protocol:

    echo '[{"name": "whole", "response": {...}}]' \\
      | "$(scripts/vllm-venv.sh)/bin/python" tests/contract/vllm_responses.py
    -> [{"name": "whole", "ok": true, "errors": []}]    (a case has a `response` or a list of `events`)
"""

from __future__ import annotations

import os
from typing import Any

from check_harness import serve  # this script's own folder

os.environ["VLLM_TARGET_DEVICE"] = "cpu"


def _differences(body: dict[str, Any], dumped: dict[str, Any], where: str) -> list[str]:
    errors = [f"{where}{key}: {body[key]!r} becomes {dumped.get(key)!r}" for key in body
              if key in dumped and dumped[key] != body[key] and not isinstance(body[key], dict)]
    errors += [f"{where}{key}: vLLM writes it, the simulator does not" for key in dumped if key not in body]
    errors += [f"{where}{key}: the simulator writes it, vLLM does not" for key in body if key not in dumped]
    for key in body:
        if isinstance(body[key], dict) and isinstance(dumped.get(key), dict):
            errors += _differences(body[key], dumped[key], f"{where}{key}.")
    return errors


def check(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter, ValidationError
    from vllm.entrypoints.openai.responses import protocol

    lifecycle = {"response.created": protocol.ResponseCreatedEvent,
                 "response.in_progress": protocol.ResponseInProgressEvent,
                 "response.completed": protocol.ResponseCompletedEvent,
                 "response.incomplete": protocol.ResponseIncompleteEvent}
    others = TypeAdapter(ResponseStreamEvent)
    verdicts = []
    for case in cases:
        errors: list[str] = []
        bodies = [("", case["response"])] if "response" in case else [
            (f"event {i} ({e.get('type')}): ", e) for i, e in enumerate(case["events"])]
        for where, body in bodies:
            try:
                if "response" in case:
                    parsed: Any = protocol.ResponsesResponse.model_validate(body)
                elif body.get("type") in lifecycle:
                    parsed = lifecycle[body["type"]].model_validate(body)
                else:
                    parsed = others.validate_python(body)
            except ValidationError as exc:
                errors.append(f"{where}{exc}")
                continue
            errors += _differences(body, parsed.model_dump(mode="json", by_alias=True), where)
        verdicts.append({"name": case["name"], "ok": not errors, "errors": errors})
    return verdicts


if __name__ == "__main__":
    raise SystemExit(serve(check))
