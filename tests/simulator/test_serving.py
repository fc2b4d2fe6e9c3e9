"""One aggregated GB300 TP8 engine (golden gb300-tp8-aggregated), started from its rendered leader
command as a real process on loopback, served at time scale 1: timing against the plan's own
predictions, continuous batching, streaming and tool calls, /metrics and the prefix cache.

Timing tolerances: the client-side TTFT of an 8192-token prompt (the planner's default workload
prompt) is never under 95 % of the plan's ttftSeconds, and the best of three attempts lies within
+25 % + 30 ms of it (the client adds sending and tokenizing 8192 words); the mean inter-token gap of
the closest attempt is within 15 % of decodeStepMsBatch1 (asyncio timers on a shared 2-core machine
jitter by a millisecond or so per step; the step loop does not let that accumulate). Three attempts,
not one: CI runs this suite beside two e2e clusters and the image builds on two cores, where one
request's client and server can both wait for a core (seen: 225 ms against a 151 ms plan, 157-161 ms
on the same machine otherwise).
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .sims import Sim, role_report, simulator, sse_text, words

SCENARIO = "gb300-tp8-aggregated"
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def role() -> dict[str, Any]:
    return role_report(SCENARIO, "aggregated")


@pytest.fixture(scope="module")
def agg(role: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    with simulator(role["command"], tmp_path_factory.mktemp("agg"), {"K3SIM_GPU_PRODUCT": role["gpuProduct"]}) as sim:
        yield sim


def test_ttft_and_itl_agree_with_the_plans_prediction(agg: Sim, role: dict[str, Any]) -> None:
    predicted_ttft = role["predicted"]["ttftSeconds"]
    predicted_itl = role["predicted"]["decodeStepMsBatch1"] / 1e3
    ttfts, itls = [], []
    for attempt in range(3):  # distinct prompts: no prefix hit shortens a later attempt
        events = agg.stream("/v1/completions", {"model": "kimi-k3", "prompt": words(8192, f"timing{attempt}-"),
                                                "max_tokens": 48})
        tokens = [t for t, e in events if isinstance(e, dict) and e["choices"]]
        assert len(tokens) == 48 and events[-1][1] == "[DONE]"
        ttfts.append(tokens[0])
        itls.append(statistics.mean(b - a for a, b in itertools.pairwise(tokens)))
    ttft, itl = min(ttfts), min(itls, key=lambda gap: abs(gap - predicted_itl))
    print(f"\nTTFT {[round(t * 1e3, 1) for t in ttfts]} ms (plan {predicted_ttft * 1e3:.1f}), "
          f"ITL {[round(g * 1e3, 2) for g in itls]} ms (plan {predicted_itl * 1e3:.2f})")
    assert all(t >= predicted_ttft * 0.95 for t in ttfts)  # never faster than the model
    assert ttft <= predicted_ttft * 1.25 + 0.03
    assert abs(itl - predicted_itl) <= 0.15 * predicted_itl


def test_concurrent_requests_batch_together(agg: Sim, role: dict[str, Any]) -> None:
    """Eight requests at once take about as long as one: they share every decode step."""
    step = role["predicted"]["decodeStepMsBatch1"] / 1e3
    body = {"model": "kimi-k3", "max_tokens": 40}

    def one(i: int) -> float:
        start = time.monotonic()
        r = agg.post("/v1/completions", {**body, "prompt": words(64, f"batch{i}-")})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 40
        return time.monotonic() - start

    with ThreadPoolExecutor(8) as pool:
        start = time.monotonic()
        latencies = list(pool.map(one, range(8)))
        wall = time.monotonic() - start
    print(f"\n8 concurrent x 40 tokens: {wall:.2f} s wall, slowest {max(latencies):.2f} s; "
          f"one alone ~{40 * step:.2f} s")
    assert wall < 2.5 * 40 * step  # serial would be 8 x


def _tool_calls(events: list[tuple[float, Any]]) -> dict[int, dict[str, str]]:
    """Accumulate tool-call deltas the way OpenAI clients do."""
    calls: dict[int, dict[str, str]] = {}
    for _, e in events:
        if not isinstance(e, dict):
            continue
        for choice in e["choices"]:
            for delta in choice["delta"].get("tool_calls") or []:
                call = calls.setdefault(delta["index"], {"id": "", "name": "", "arguments": ""})
                call["id"] = delta.get("id") or call["id"]
                function = delta.get("function") or {}
                call["name"] += function.get("name") or ""
                call["arguments"] += function.get("arguments") or ""
    return calls


def test_streaming_chat_with_a_tool_call_parses(agg: Sim) -> None:
    body = {"model": "kimi-k3", "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": WEATHER, "stream_options": {"include_usage": True}}
    events = agg.stream("/v1/chat/completions", body)
    chunks = [e for _, e in events if isinstance(e, dict)]
    assert events[-1][1] == "[DONE]"
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    calls = _tool_calls(events)
    assert list(calls) == [0] and calls[0]["name"] == "get_weather" and calls[0]["id"].startswith("chatcmpl-tool-")
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes == ["tool_calls"]
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # the tool result comes back: the next turn answers in text
    follow = agg.post("/v1/chat/completions", {**body, "stream": False, "messages": body["messages"] + [
        {"role": "assistant", "tool_calls": [{"id": calls[0]["id"], "type": "function", "function": {
            "name": "get_weather", "arguments": calls[0]["arguments"]}}]},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "sunny, 21 C"}], "max_tokens": 12}).json()
    message = follow["choices"][0]["message"]
    assert message["tool_calls"] == [] and len(message["content"].split()) == 12
    assert follow["choices"][0]["finish_reason"] == "length"


def test_non_streaming_chat_and_completion_answers(agg: Sim) -> None:
    chat = agg.post("/v1/chat/completions", {"model": "kimi-k3", "max_tokens": 5, "tools": WEATHER,
                                             "messages": [{"role": "user", "content": "weather in Oslo"}]})
    # five tokens are not enough to close the call block: no call, cut by length, as vLLM would
    assert chat.json()["choices"][0]["finish_reason"] == "length"
    full = agg.post("/v1/chat/completions", {"model": "kimi-k3", "tools": WEATHER,
                                             "messages": [{"role": "user", "content": "weather in Oslo"}]}).json()
    assert full["choices"][0]["finish_reason"] == "tool_calls"
    assert json.loads(full["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo"}
    stopped = agg.post("/v1/completions", {"prompt": "tell me a story"}).json()
    assert stopped["choices"][0]["finish_reason"] == "stop" and stopped["usage"]["completion_tokens"] == 256
    assert stopped["kv_transfer_params"] is None and stopped["model"] == "kimi-k3"
    streamed = agg.stream("/v1/completions", {"prompt": "tell me a story", "max_tokens": 7})
    assert sse_text(streamed) == " ".join(stopped["choices"][0]["text"].split()[:7])


def test_errors_look_like_vllms(agg: Sim) -> None:
    wrong = agg.post("/v1/completions", {"model": "gpt-4", "prompt": "x"})
    assert wrong.status_code == 404 and wrong.json()["error"]["param"] == "model"
    assert wrong.json()["error"]["message"] == "The model `gpt-4` does not exist. Valid aliases: kimi-k3."
    too_long = agg.post("/v1/completions", {"prompt": "x", "max_tokens": 1 << 21})
    assert too_long.status_code == 400 and "maximum context length" in too_long.json()["error"]["message"]
    assert agg.post("/v1/chat/completions", {"messages": []}).status_code == 400
    models = agg.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["kimi-k3"] and models["data"][0]["max_model_len"] == 1 << 20


def test_a_repeated_prompt_hits_the_prefix_cache(agg: Sim) -> None:
    prompt = words(8192, "cached")
    hits_before = agg.metric("vllm:prefix_cache_hits_total")
    first = agg.stream("/v1/completions", {"prompt": prompt, "max_tokens": 2})
    second = agg.stream("/v1/completions", {"prompt": prompt, "max_tokens": 2})
    hit = agg.metric("vllm:prefix_cache_hits_total") - hits_before
    block = agg.stats()["engine"]["block_size"]
    assert hit == (8191 // block) * block  # whole blocks, the last token always computed
    assert second[0][0] < first[0][0] / 3, "a cached prefix shortens prefill"
    assert agg.metric("vllm:prompt_tokens_by_source_total", source="local_cache_hit") >= hit


def test_metrics_parse_and_count_what_was_served(agg: Sim) -> None:
    before = {n: agg.metric(n) for n in ("vllm:generation_tokens_total", "vllm:prompt_tokens_total",
                                         "vllm:time_to_first_token_seconds_count")}
    answers = [agg.post("/v1/completions", {"prompt": words(100 + i, f"m{i}-"), "max_tokens": 3 + i}).json()
               for i in range(3)]
    text = agg.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["vllm:kv_cache_usage_perc"].type == "gauge"
    assert {s.labels["engine"] for s in families["vllm:num_requests_running"].samples} == {"0"}
    assert agg.metric("vllm:generation_tokens_total") - before["vllm:generation_tokens_total"] == \
        sum(a["usage"]["completion_tokens"] for a in answers)
    assert agg.metric("vllm:prompt_tokens_total") - before["vllm:prompt_tokens_total"] == \
        sum(a["usage"]["prompt_tokens"] for a in answers)
    assert agg.metric("vllm:time_to_first_token_seconds_count") - \
        before["vllm:time_to_first_token_seconds_count"] == 3
    assert agg.metric("vllm:request_success_total", finished_reason="length") >= 3
    assert agg.metric("vllm:cache_config_info", block_size=str(agg.stats()["engine"]["block_size"])) == 1


def test_a_client_that_goes_away_frees_its_slot(agg: Sim) -> None:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", int(agg.url.rsplit(":", 1)[1]), timeout=10)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "go on", "max_tokens": 500, "stream": True}),
                 {"Content-Type": "application/json", "X-Request-Id": "walks-away"})
    response = conn.getresponse()
    assert response.readline().startswith(b"data: ")
    conn.close()
    deadline = time.monotonic() + 5
    while agg.stats()["by_request_id"].get("walks-away", {}).get("finish_reason") != "abort":
        assert time.monotonic() < deadline, agg.stats()["by_request_id"].get("walks-away")
        time.sleep(0.05)
    assert agg.metric("vllm:request_success_total", finished_reason="abort") >= 1


def test_it_listens_on_loopback_only(agg: Sim) -> None:
    """Bound to what the command line's last --host says (127.0.0.1), not the rendered 0.0.0.0."""
    port = int(agg.url.rsplit(":", 1)[1])
    listening = [line.split()[1] for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
                 if line.split()[3] == "0A" and int(line.split()[1].split(":")[1], 16) == port]
    assert listening == [f"0100007F:{port:04X}"]
    assert not any(int(line.split()[1].split(":")[1], 16) == port and line.split()[3] == "0A"
                   for line in Path("/proc/net/tcp6").read_text().splitlines()[1:])
    assert agg.get("/version").json() == {"version": "0.33.0"}


def _choices(events: list[tuple[float, Any]]) -> list[dict[str, Any]]:
    return [c for _, e in events if isinstance(e, dict) for c in e["choices"]]


def test_token_ids_come_back_and_a_stream_resumed_from_them_goes_on_unchanged(agg: Sim) -> None:
    """return_token_ids as vLLM 0.33.0 gives them (prompt ids on the first chunk, each chunk's own
    ids), and what a router's migration relies on: a completion resumed from prompt + generated ids
    with max_tokens lowered gives the rest of the uninterrupted answer, word for word."""
    body = {"model": "kimi-k3", "prompt": words(40, "resume"), "max_tokens": 30, "return_token_ids": True}
    whole = _choices(agg.stream("/v1/completions", body))
    prompt_ids = whole[0]["prompt_token_ids"]
    assert len(prompt_ids) == 40 and all(c["prompt_token_ids"] is None for c in whole[1:])
    ids = [t for c in whole for t in c["token_ids"]]
    text = "".join(c["text"] for c in whole)
    assert len(ids) == 30 and len(text.split()) == 30
    assert agg.post("/v1/completions", {**body, "prompt": body["prompt"]}).json()["choices"][0]["token_ids"] == ids
    for cut in (1, 7, 29):
        resumed = {**body, "prompt": prompt_ids + ids[:cut], "max_tokens": 30 - cut}
        rest = _choices(agg.stream("/v1/completions", resumed))
        assert [t for c in rest for t in c["token_ids"]] == ids[cut:]
        assert text == "".join(c["text"] for c in whole[:cut]) + "".join(c["text"] for c in rest)


def test_a_thinking_chat_streams_reasoning_then_content_and_resumes_through_completions(agg: Sim) -> None:
    """chat_template_kwargs thinking: the prompt ends with K3's think opener, the answer streams
    `reasoning` deltas, the closing marker (held back by the parser, sent with token ids), then
    content; the same context sent to /v1/completions as ids with skip_special_tokens false goes on
    with the raw channel text (what a router parses when it moves a chat stream)."""
    body = {"model": "kimi-k3", "messages": [{"role": "user", "content": "think about Paris"}], "max_tokens": 40,
            "chat_template_kwargs": {"thinking": True}, "return_token_ids": True}
    events = agg.stream("/v1/chat/completions", body)
    chunks = [e for _, e in events if isinstance(e, dict)]
    prompt_ids = chunks[0]["prompt_token_ids"]
    choices = [c for e in chunks[1:] for c in e["choices"]]
    reasoning = "".join(c["delta"].get("reasoning") or "" for c in choices)
    content = "".join(c["delta"].get("content") or "" for c in choices)
    ids = [t for c in choices for t in c["token_ids"]]
    assert len(ids) == 40 and len(reasoning.split()) == 24 and len(content.split()) == 40 - 24 - 3
    assert any(c["delta"] == {} for c in choices)  # the close marker: no text, its ids only
    cut = sum(len(c["token_ids"]) for c in choices[:10])  # a DSpark chunk carries several tokens
    rest = _choices(agg.stream("/v1/completions", {"model": "kimi-k3", "prompt": prompt_ids + ids[:cut],
                                                   "max_tokens": 40 - cut, "skip_special_tokens": False,
                                                   "return_token_ids": True}))
    raw = "".join(c["text"] for c in rest)
    assert [t for c in rest for t in c["token_ids"]] == ids[cut:]
    head, _, tail = raw.partition("<|close|>think<|sep|>")
    assert reasoning == "".join(c["delta"].get("reasoning") or "" for c in choices[:10]) + head
    assert tail == content


def test_the_oracle_probe_reads_the_hit_a_request_then_gets(agg: Sim) -> None:
    """/sim/prefix_hits (what bench/prefix_routing.py's oracle reads) says, touching nothing, the hit
    the same body then gets: for a chat too, and 0 for a prompt never seen."""
    block = agg.stats()["engine"]["block_size"]
    chat = {"messages": [{"role": "system", "content": words(3 * block, "oracle-sys")},
                         {"role": "user", "content": words(block + 7, "oracle-user")}], "max_tokens": 2}
    unseen = agg.post("/sim/prefix_hits", chat).json()
    assert unseen["hits"] == {"0": 0}
    agg.post("/v1/chat/completions", chat)
    probe = agg.post("/sim/prefix_hits", chat).json()
    hits = agg.metric("vllm:prefix_cache_hits_total")
    agg.post("/v1/chat/completions", chat)
    assert probe["hits"]["0"] == agg.metric("vllm:prefix_cache_hits_total") - hits > 0
    assert probe["hits"]["0"] == (probe["prompt_tokens"] - 1) // block * block
    records = agg.stats()["by_request_id"].values()
    assert sum(r["prompt_fingerprint"] == probe["prompt_fingerprint"] for r in records) == 2  # the key it joins by
    assert agg.post("/sim/prefix_hits", {"messages": "nope"}).status_code == 400


def test_a_small_block_override_evicts_what_vllm_would(role: dict[str, Any], tmp_path: Path) -> None:
    """--num-gpu-blocks-override (vLLM's, config/cache.py) caps the cache: a prompt that needs more
    blocks than the rest leaves pushes the oldest prefix out, LRU."""
    argv = [*role["command"], "--num-gpu-blocks-override", "64"]
    with simulator(argv, tmp_path, {"K3SIM_GPU_PRODUCT": role["gpuProduct"]}) as sim:
        block = sim.stats()["engine"]["block_size"]
        first = {"prompt": words(40 * block + 1, "evict-a"), "max_tokens": 1}
        sim.post("/v1/completions", first)
        assert sim.post("/sim/prefix_hits", first).json()["hits"]["0"] == 40 * block
        sim.post("/v1/completions", {"prompt": words(40 * block + 1, "evict-b"), "max_tokens": 1})
        assert sim.post("/sim/prefix_hits", first).json()["hits"]["0"] == 0
