"""The simulator's /v1/responses answers (whole, cut by max_output_tokens, streamed, and a P/D
prefill's) against vLLM 0.33.0's own Responses models (tests/contract/vllm_responses.py in the cached
vLLM venv, one subprocess for all cases), and its refusals as vLLM's serving.py words them."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.simulator.sims import Sim, role_report, simulator, words

from .test_vllm_contract import ROOT, vllm_python

SCENARIO = "b200-dep16-disaggregated"
TO_PREFILL = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}


@pytest.fixture(scope="module")
def pd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sim, Sim]]:
    folder = tmp_path_factory.mktemp("responses")
    env = {"K3SIM_GPU_PRODUCT": role_report(SCENARIO, "prefill")["gpuProduct"]}
    with simulator(role_report(SCENARIO, "prefill")["command"], folder, env) as prefill, \
            simulator(role_report(SCENARIO, "decode")["command"], folder, env) as decode:
        yield prefill, decode


def _verdicts(cases: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Each case's errors as vllm_responses.py finds them (check_harness.py's protocol)."""
    run = subprocess.run([str(vllm_python()), str(ROOT / "tests" / "contract" / "vllm_responses.py")],
                         input=json.dumps([{"name": name, **case} for name, case in cases.items()]),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode in (0, 1), f"vllm_responses.py failed to run:\n{run.stderr[-3000:]}"
    return {v["name"]: v["errors"] for v in json.loads(run.stdout)}


def test_answers_and_stream_events_are_what_vllms_models_read(pd: tuple[Sim, Sim], tmp_path: Path) -> None:
    prefill, decode = pd
    ask = {"model": "kimi-k3", "instructions": "Answer briefly.", "input": words(300, "contract")}
    whole = decode.post("/v1/responses", ask)
    assert whole.status_code == 200, whole.text
    cut = decode.post("/v1/responses", {**ask, "input": [{"role": "user", "content": [
        {"type": "input_text", "text": words(200, "items")}]}], "max_output_tokens": 3})
    assert cut.status_code == 200, cut.text
    handed = prefill.post("/v1/responses", {**ask, "max_output_tokens": 1, "ignore_eos": True, "stream": False,
                                            "store": False, "kv_transfer_params": TO_PREFILL},
                          headers={"X-Request-Id": "responses-contract"})
    assert handed.status_code == 200, handed.text
    events = [e for _, e in decode.stream("/v1/responses", {**ask, "max_output_tokens": 6})]
    cases = {"whole": {"response": whole.json()}, "cut": {"response": cut.json()},
             "prefill": {"response": handed.json()}, "stream": {"events": events}}
    verdicts = _verdicts(cases)
    assert verdicts == {name: [] for name in cases}, json.dumps(verdicts, indent=1)[:6000]
    assert cut.json()["status"] == "incomplete" and cut.json()["incomplete_details"] == {"reason": "max_output_tokens"}
    assert cut.json()["usage"]["output_tokens"] == 3
    assert handed.json()["kv_transfer_params"]["do_remote_prefill"] is True
    kinds = [e["type"] for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == events[-1]["response"]["output"][0]["content"][0]["text"]


def test_what_needs_a_store_is_refused_as_vllm_refuses_it(pd: tuple[Sim, Sim]) -> None:
    _, decode = pd
    ask = {"model": "kimi-k3", "input": "hello"}
    previous = decode.post("/v1/responses", {**ask, "previous_response_id": "resp_1"})
    assert previous.status_code == 404 and previous.json()["error"]["message"] == "Response with id 'resp_1' not found."
    background = decode.post("/v1/responses", {**ask, "background": True})
    assert background.status_code == 400 and "VLLM_ENABLE_RESPONSES_API_STORE" in background.json()["error"]["message"]
    assert decode.post("/v1/responses", {**ask, "background": True, "store": False}).status_code == 200
