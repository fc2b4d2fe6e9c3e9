"""The simulator as vLLM 0.33.0's Rust frontend (VLLM_USE_RUST_FRONTEND=1, what the operator renders
on leaders) against the real one: the same requests to the wheel's `vllm-rs frontend`
(tests/contract/vllm_rs_frontend.py, in the cached vLLM venv, with a stand-in engine that only
says READY) and to simulator processes of golden gb300-tp8-aggregated, with and without
--enable-scale-out. Refusals must match exactly (status and error body); /tokenize and
/detokenize must answer the same fields and counts (the ids differ: another tokenizer).

This pins what vllm-router's cache_aware policy meets: render 403 without --enable-scale-out (no
token ids, no prefix affinity), 501 with it (the router then tokenizes).
"""

from __future__ import annotations

import json
import subprocess
from functools import lru_cache
from typing import Any

import pytest
import requests

from tests.simulator.sims import role_report, simulator

from .test_vllm_contract import ROOT, vllm_python

SCENARIO = "gb300-tp8-aggregated"
PROBES: list[dict[str, Any]] = [
    {"name": "completions-render", "path": "/v1/completions/render",
     "body": {"model": "kimi-k3", "prompt": "w1 w2", "max_tokens": 4}},
    {"name": "chat-render", "path": "/v1/chat/completions/render",
     "body": {"model": "kimi-k3", "messages": [{"role": "user", "content": "w1 w2"}]}},
    {"name": "tokenize-prompt", "path": "/tokenize", "body": {"model": "kimi-k3", "prompt": "w1 w2 w3"}},
    {"name": "tokenize-strs", "path": "/tokenize", "body": {"prompt": "w1 w2", "return_token_strs": True}},
    {"name": "tokenize-messages", "path": "/tokenize",
     "body": {"model": "kimi-k3", "messages": [{"role": "user", "content": "w1 w2"}]}},
    {"name": "tokenize-unknown-model", "path": "/tokenize", "body": {"model": "gpt-4", "prompt": "w1"}},
    {"name": "detokenize", "path": "/detokenize", "body": {"model": "kimi-k3", "tokens": []}},
    {"name": "rank-out-of-range", "path": "/v1/completions", "body": {"prompt": "w1", "max_tokens": 1},
     "headers": {"X-data-parallel-rank": "1"}},
]
"""Requests the Rust frontend answers by itself (its stand-in engine never generates)."""
CASES = [dict(probe, name=f"{probe['name']}/{'scale-out' if scale_out else 'plain'}", scale_out=scale_out)
         for scale_out in (False, True) for probe in PROBES]


@lru_cache(maxsize=1)
def rust_answers() -> dict[str, dict[str, Any]]:
    run = subprocess.run([str(vllm_python()), str(ROOT / "tests" / "contract" / "vllm_rs_frontend.py")],
                         input=json.dumps(CASES), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"vllm_rs_frontend.py failed:\n{run.stderr[-3000:]}"
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def simulator_answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    role = role_report(SCENARIO, "aggregated", scale_out=False)
    env = {"K3SIM_GPU_PRODUCT": role["gpuProduct"], "VLLM_USE_RUST_FRONTEND": role["env"]["VLLM_USE_RUST_FRONTEND"]}
    answers = {}
    for scale_out in (False, True):
        command = [*role["command"], *(["--enable-scale-out"] if scale_out else [])]
        with simulator(command, tmp_path_factory.mktemp("rs"), env) as sim:
            for case in (c for c in CASES if c["scale_out"] == scale_out):
                r = requests.post(sim.url + case["path"], json=case["body"], headers=case.get("headers"), timeout=10)
                answers[case["name"]] = {"status": r.status_code, "body": r.json()}
    return answers


def shape(answer: dict[str, Any]) -> Any:
    """What must agree: a refusal's whole body; of an answer, its fields and its count."""
    body = answer["body"]
    if answer["status"] != 200:
        return answer
    if "tokens" in body:
        return {"fields": list(body), "count": body["count"], "counted": len(body["tokens"]) == body["count"],
                "strs": body["token_strs"] is not None}
    return {"fields": list(body)}


@pytest.mark.parametrize("case", [c["name"] for c in CASES])
def test_the_simulator_answers_as_the_rust_frontend(case: str, simulator_answers: dict[str, Any]) -> None:
    ours, theirs = simulator_answers[case], rust_answers()[case]
    if case.startswith("tokenize-messages"):  # a chat template of its own: only the fields agree
        assert ours["status"] == theirs["status"] == 200 and list(ours["body"]) == list(theirs["body"])
        return
    assert shape(ours) == shape(theirs)


def test_render_gives_a_router_no_tokens_unless_scale_out_is_on() -> None:
    answers = rust_answers()
    assert answers["completions-render/plain"]["status"] == 403
    assert answers["completions-render/scale-out"]["status"] == 501  # vllm-router falls back to /tokenize
    assert answers["tokenize-prompt/plain"]["status"] == 200
