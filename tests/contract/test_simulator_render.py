"""The simulator's /render answers (Python frontend, --enable-scale-out) against vLLM 0.33.0's own
GenerateRequest model, the body a generate server takes from a render server: every body must
parse, keep its values, and carry every field vLLM's model_dump writes (tests/contract/vllm_render.py
in the cached vLLM venv, one subprocess for all cases)."""

from __future__ import annotations

import json
import subprocess
from functools import lru_cache
from typing import Any

from kimik3_operator.render.report import plan_report
from kimik3_simulator.cmdline import parse_serve
from kimik3_simulator.config import engine_config
from kimik3_simulator.frontend import Frontend
from kimik3_simulator.settings import SimSettings
from tests.golden.scenarios import SCENARIOS
from tests.golden.test_golden import plan_scenario

from .test_vllm_contract import ROOT, vllm_python

WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "completion": ("/v1/completions/render", {"model": "kimi-k3", "prompt": "The capital of France is",
                                              "max_tokens": 16}),
    "completion-as-the-router-sends-it": ("/v1/completions/render", {
        "model": "kimi-k3", "prompt": "a b c", "max_tokens": 1, "min_tokens": 1, "stream": False, "temperature": 0.0,
        "echo": False, "ignore_eos": False, "kv_transfer_params": {
            "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None}}),
    "streaming-completion": ("/v1/completions/render", {"prompt": [1, 2, 3], "stream": True, "ignore_eos": True,
                                                        "stream_options": {"include_usage": True}}),
    "chat": ("/v1/chat/completions/render", {"messages": [{"role": "user", "content": "hi there"}]}),
    "chat-with-tools": ("/v1/chat/completions/render", {
        "messages": [{"role": "user", "content": "weather in Oslo"},
                     {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
                         "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
        "tools": WEATHER, "max_completion_tokens": 8, "cache_salt": "salt", "priority": 0}),
}


def frontend() -> Frontend:
    report = plan_report(plan_scenario(SCENARIOS["gb300-tp8-aggregated"]))
    command = report["pools"][0]["roles"][0]["command"]
    return Frontend(engine_config(parse_serve([*command, "--enable-scale-out"]), SimSettings()))


def vllm_verdicts(cases: dict[str, Any]) -> dict[str, list[str]]:
    run = subprocess.run([str(vllm_python()), str(ROOT / "tests" / "contract" / "vllm_render.py")],
                         input=json.dumps(cases), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"vllm_render.py failed:\n{run.stderr[-3000:]}"
    return json.loads(run.stdout)


@lru_cache(maxsize=1)
def rendered() -> dict[str, Any]:
    f = frontend()
    return {name: f.render(path, body, None) for name, (path, body) in REQUESTS.items()}


def test_vllm_takes_what_the_simulator_renders() -> None:
    cases = rendered()
    verdicts = vllm_verdicts({**cases, "wrong-type": dict(cases["completion"][0], token_ids=["a"]),
                              "changed-and-missing": {**{k: v for k, v in cases["completion"][0].items()
                                                         if k != "output_mode"},
                                                      "stream_options": {"include_usage": True}}})
    assert {name: errors for name, errors in verdicts.items() if name in cases and errors} == {}
    # the check bites: a wrong type, a value vLLM would fill in, a missing field
    assert len(verdicts["wrong-type"]) == 1 and "token_ids" in verdicts["wrong-type"][0]
    assert sorted(e.split(":")[0] for e in verdicts["changed-and-missing"]) == ["output_mode", "stream_options"]
