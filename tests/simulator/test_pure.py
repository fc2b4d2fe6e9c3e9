"""The simulator's pure parts: reading the rendered command line, the perf-model timing, the prefix
cache, answers and tool calls, and the NIXL parameters, without starting a process."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest
from prometheus_client import generate_latest

from kimik3_operator.planner.catalog import CATALOG
from kimik3_operator.planner.perf import decode_batch1, decode_step_ms, prefill_seconds
from kimik3_operator.planner.plan import Layout
from kimik3_simulator.cmdline import CommandLineError, human_int, parse_serve
from kimik3_simulator.config import PREFILL_BACKOFF, EngineConfig, engine_config, engine_metrics
from kimik3_simulator.nixl import (
    CONSUME,
    EXPIRED,
    LEASED,
    NONE,
    PRODUCE,
    READ,
    UNKNOWN,
    Leases,
    Nixl,
    Pull,
    classify,
    produced_params,
)
from kimik3_simulator.prefix_cache import MLA, PrefixCache, Retention, block_hashes
from kimik3_simulator.settings import SettingsError, SimSettings, settings_from_env
from kimik3_simulator.text import (
    SENTENCE,
    THINK_CLOSE,
    THINK_OPEN,
    THOUGHT,
    Answer,
    chat_answer,
    chat_prompt,
    completion_prompt,
    prompt_seed,
)
from kimik3_simulator.timing import PerfModel
from kimik3_simulator.vocab import token_id

from .sims import expand, free_port, free_port_base, role_report


def test_reads_the_rendered_leader_commands() -> None:
    agg = parse_serve(role_report("gb300-tp8-aggregated", "aggregated")["command"])
    assert (agg.served_model_name, agg.port, agg.tensor, agg.data, agg.kv_role) == ("kimi-k3", 8000, 8, 1, None)
    assert agg.prefix_caching and agg.speculative_tokens == 0 and agg.nnodes == 2 and not agg.headless
    prefill = parse_serve(role_report("gb300-prefill-rack-a-decode-rack-b", "prefill")["command"])
    assert (prefill.tensor, prefill.data, prefill.expert, prefill.kv_role) == (8, 2, True, "kv_producer")
    assert prefill.speculative == {"method": "dspark", "model": "/models/kimi-k3-draft", "num_speculative_tokens": 7}
    decode = parse_serve(role_report("b200-dep16-disaggregated", "decode")["command"])
    assert decode.kv_role == "kv_consumer" and decode.retention_interval > 0
    assert decode.kv_transfer is not None and decode.kv_transfer["kv_load_failure_policy"] == "recompute"


def test_a_worker_command_is_headless() -> None:
    worker = role_report("gb300-tp8-aggregated", "aggregated")["worker"]["command"]
    assert parse_serve(expand(worker)).headless


def test_unknown_flags_shell_wrapping_and_spellings() -> None:
    argv = ["/bin/sh", "-c", "exec vllm serve /m --some-future-flag x --max_model_len=1M --served-model-name a b "
                             "--no-enable-prefix-caching -tp 4 --port 9000 --port 9001 --speculative-config "
                             "'{\"method\":\"dspark\",\"num_speculative_tokens\":3}'"]
    args = parse_serve(argv)
    assert (args.model, args.max_model_len, args.served_model_names) == ("/m", 1 << 20, ("a", "b"))
    assert (args.tensor, args.port, args.prefix_caching, args.speculative_tokens) == (4, 9001, False, 3)
    with pytest.raises(CommandLineError):
        parse_serve(["python", "server.py"])
    with pytest.raises(CommandLineError):
        parse_serve(["vllm", "serve", "/m", "--kv-transfer-config", "{not json"])
    assert (human_int("1m"), human_int("32k"), human_int("auto")) == (10**6, 32000, None)


def test_settings_from_the_environment() -> None:
    s = settings_from_env({"K3SIM_GPU_PRODUCT": "NVIDIA-B200", "K3SIM_TIME_SCALE": "0.1", "K3SIM_ROLE": "decode",
                           "K3SIM_CROSSES_RDMA": "0", "VLLM_NIXL_SIDE_CHANNEL_PORT": "6000"})
    assert (s.gpu_product, s.time_scale, s.role, s.crosses_rdma, s.side_channel_port) == \
        ("NVIDIA-B200", 0.1, "decode", False, 6000)
    assert settings_from_env({}).acceptance == 2.61
    for bad in ({"K3SIM_ROLE": "router"}, {"K3SIM_TIME_SCALE": "fast"}, {"K3SIM_DSPARK_ACCEPTANCE": "0.5"}):
        with pytest.raises(SettingsError):
            settings_from_env(bad)
    with pytest.raises(SettingsError):
        engine_config(parse_serve(["vllm", "serve", "/m"]), SimSettings(gpu_product="NVIDIA-T4"))
    with pytest.raises(SettingsError, match="closest known labels: NVIDIA-B200"):  # not read as B200
        engine_config(parse_serve(["vllm", "serve", "/m"]), SimSettings(gpu_product="NVIDIA-B200A"))


def test_engine_config_follows_the_command_line_and_vllm_defaults() -> None:
    prefill = role_report("b200-dep16-disaggregated", "prefill")
    config = engine_config(parse_serve(prefill["command"]), SimSettings(gpu_product="NVIDIA-B200"))
    assert config.role == "prefill" and config.perf.crosses_rdma  # TP8 x DP2 spans two HGX boards
    assert config.engine_ids[1] == config.engine_ids[0][:-1] + "1" and config.engine_ids[0].endswith("_dp0")
    # the role's shaping flags, as rendered; the checkpoint's context where none is given
    assert (config.max_num_seqs, config.max_num_batched_tokens, config.max_model_len) == (
        prefill["maxNumSeqs"], prefill["maxNumBatchedTokens"], 1 << 20)
    h200 = engine_config(parse_serve(["vllm", "serve", "/m", "-tp", "8", "-pp", "2"]), SimSettings(gpu_product="H200"))
    assert h200.max_num_batched_tokens == 8192 and h200.role == "aggregated"


@pytest.mark.parametrize(("scenario", "role"), [
    ("gb300-tp8-aggregated", "aggregated"), ("gb300-tp16-dspark", "aggregated"),
    ("b200-dep16-disaggregated", "prefill"), ("b200-dep16-disaggregated", "decode"),
    ("gb300-prefill-rack-a-decode-rack-b", "prefill"), ("gb300-prefill-rack-a-decode-rack-b", "decode"),
    ("h200-16", "aggregated"), ("mi355x-tp8", "aggregated")])
def test_a_predicted_start_up_is_the_plans_cold_start_read_from_the_command_line(scenario: str, role: str) -> None:
    """From the rendered command and the node's GPU alone, the simulator arrives at the cold start
    the plan shows (less the image pull, done before the process starts), at the same storage speed."""
    report = role_report(scenario, role)
    cold = report["coldStart"]
    settings = settings_from_env({"K3SIM_STARTUP_SECONDS": "predicted", "K3SIM_GPU_PRODUCT": report["gpuProduct"],
                                  "K3SIM_READ_BYTES_PER_S": str(cold["readBytesPerSecond"]),
                                  "K3SIM_TIME_SCALE": "0.5", "K3SIM_STARTUP_TIME_SCALE": "0.01"})
    config = engine_config(parse_serve(expand(report["command"])), settings)
    assert config.startup_seconds == cold["readySeconds"] - cold["imagePullSeconds"]
    assert config.startup_wall_seconds == pytest.approx(config.startup_seconds * 0.01)
    plain = engine_config(parse_serve(expand(report["command"])), settings_from_env({"K3SIM_STARTUP_SECONDS": "3"}))
    assert (plain.startup_seconds, plain.startup_wall_seconds) == (3, 3)


PERF = PerfModel(gpu=CATALOG["GB300"], layout=Layout(tensor=8), crosses_rdma=False, kv_dtype="bf16",
                 ssm_dtype="float32", spec_tokens=0, block_size=768, fabric_gb_s=100)


def test_prefill_time_is_the_planners_and_chunks_add_up() -> None:
    assert PERF.prefill_s(8192) == pytest.approx(prefill_seconds(PERF.gpu, PERF.layout, 8192))
    chunks = PERF.prefill_s(3000) + PERF.prefill_s(8192, 3000)
    assert chunks == pytest.approx(PERF.prefill_s(8192))
    with_hit = PERF.prefill_s(8192, 7680)
    assert PERF.prefill_s(512) < with_hit < PERF.prefill_s(8192) / 10  # new tokens still attend to the cached ones
    dp = PerfModel(**{**PERF.__dict__, "layout": Layout(tensor=8, data=2, expert=True)})
    assert dp.prefill_s(8192) == pytest.approx(2 * prefill_seconds(dp.gpu, dp.layout, 8192))


@pytest.mark.parametrize("batch,context", [(1, 8192), (16, 4096), (200, 9000)])
def test_decode_step_is_the_planners(batch: int, context: int) -> None:
    assert PERF.decode_step_s(batch, context) * 1e3 == pytest.approx(
        decode_step_ms(PERF.gpu, PERF.layout, False, batch, context, "bf16"))


def test_a_speculative_step_at_batch_one_is_decode_batch1s() -> None:
    spec = PerfModel(**{**PERF.__dict__, "spec_tokens": 7})
    reference = decode_batch1(spec.gpu, spec.layout, False, context=8192, spec_tokens=7, acceptance=2.61,
                              kv_dtype="bf16")
    assert spec.decode_step_s(1, 8192) * 1e3 == pytest.approx(reference.inputs["stepMs"])
    assert spec.decode_step_s(8, 8192) > spec.decode_step_s(1, 8192) > PERF.decode_step_s(1, 8192)


def test_kv_transfer_grows_with_the_prompt() -> None:
    short, long = PERF.kv_transfer(1000), PERF.kv_transfer(100_000)
    assert 0 < short.seconds < long.seconds and short.bytes < long.bytes
    assert long.descriptors == math.ceil(100_000 / 768) * 24 + 69
    # 100k tokens of BF16 MLA KV per GPU plus its KDA shard over a 100 GB/s NIC: tens of milliseconds
    assert 0.02 < long.seconds < 0.05


def test_prefix_cache_hits_whole_blocks_and_evicts_lru() -> None:
    words = [f"w{i}" for i in range(1000)]
    hashes = block_hashes(words, 128)
    assert len(hashes) == 7
    cache = PrefixCache(capacity_blocks=20, retention=Retention(128, None))  # Dense: a state at every block
    assert cache.match(hashes, 1000) == 0
    cache.insert(hashes, 1000, 1000)
    assert cache.match(hashes, 1000) == 7 * 128
    other = block_hashes(["x", *words[1:]], 128)
    assert cache.match(other, 1000) == 0  # chained: a different first block changes every block
    exact = block_hashes(words[:896], 128)
    assert cache.match(exact, 896) == 6 * 128  # the last token is always computed
    cache.insert(other, 1000, 1000)
    assert len(cache) == 20 and cache.match(hashes, 1000) < 7 * 128  # 28 blocks asked of 20: LRU went
    assert PrefixCache(10, Retention(128, None), enabled=False).match(hashes, 1000) == 0


def test_kda_states_are_kept_where_vllm_keeps_them() -> None:
    """--prefix-cache-retention-interval: 0 the prompt's checkpoint at floor((N - 1) / B) * B only;
    a positive interval its multiples too; None every block end; a decode that loaded N - 1 tokens
    from a prefill a state at N - 1 only, when that is a block end."""
    assert Retention(128, 0).kept(1000, 1000, False) == [6]  # 999 // 128 * 128 = 896: block 6 ends there
    assert Retention(128, 0).kept(1000, 1000, True) == []  # loaded 999 tokens: no block end
    assert Retention(128, 0).kept(897, 897, True) == [6]  # loaded 896: a block end
    # A decode keeps no state it did not compute, dense or periodic; past N - 1 its own count.
    assert Retention(128, None).kept(1000, 1000, True) == []
    assert Retention(128, 512).kept(1000, 1000, True) == []
    assert Retention(128, None).kept(1025, 1025, True) == [7]  # the state at 1024, loaded
    assert Retention(128, None).kept(1024, 1024, True) == [7]  # token 1024 computed here: its own
    assert Retention(128, 512).kept(1000, 1000, False) == [3, 6]  # 512, and the prompt's 896
    assert Retention(128, None).kept(1000, 1000, False) == list(range(7))
    assert Retention(128, 0).kept(100, 100, False) == []  # no full block before the last token


def test_a_k3_hit_needs_a_kda_state_at_its_end_not_only_mla_blocks() -> None:
    """The hybrid hit rule: MLA's run of cached blocks, cut back to the last block end with a KDA
    state. A shared system prompt with another question after it hits MLA blocks but, with
    semantic retention, no state inside it: no hit at all. A conversation's next turn hits up to
    the previous turn's checkpoint."""
    system = [f"s{i}" for i in range(600)]
    first = [*system, *(f"a{i}" for i in range(300))]
    cache = PrefixCache(100, Retention(128, 0))
    first_hashes = block_hashes(first, 128)
    cache.insert(first_hashes, len(first), len(first))
    other = [*system, *(f"b{i}" for i in range(300))]
    other_hashes = block_hashes(other, 128)
    assert sum(cache.holds(MLA, h) for h in other_hashes) == 4  # 4 full blocks of the system prompt...
    assert cache.hit(other_hashes, len(other)) == 0  # ...and no KDA state at any of their ends
    turn = [*first, *(f"r{i}" for i in range(200))]
    assert cache.hit(block_hashes(turn, 128), len(turn)) == (len(first) - 1) // 128 * 128
    dense = PrefixCache(100, Retention(128, None))
    dense.insert(first_hashes, len(first), len(first))
    assert dense.hit(other_hashes, len(other)) == 4 * 128


def test_block_hashes_follow_pythonhashseed(monkeypatch: pytest.MonkeyPatch) -> None:
    words = [f"w{i}" for i in range(300)]
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    unset = block_hashes(words, 128)
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    assert block_hashes(words, 128) != unset and len(unset) == 2


WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}}]


def test_prompts_are_words() -> None:
    assert completion_prompt("a b  c") == ["a", "b", "c"]
    assert completion_prompt([[1, 2, 3]]) == ["#1", "#2", "#3"]
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert chat_prompt(messages, None) == ["<|system|>", "be", "brief", "<|user|>", "hi"]
    assert len(chat_prompt(messages, WEATHER)) > 5


def test_a_request_with_tools_gets_one_tool_call() -> None:
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    plain = Answer.after([1, 2, 3], 256, 0)
    answer = chat_answer(messages, WEATHER, "auto", plain)
    assert answer.tool_call is not None and answer.tool_call.name == "get_weather"
    assert json.loads(answer.tool_call.arguments) == {"city": "Paris", "days": 1}
    assert answer.text(0, answer.natural_length) == ""
    assert "".join(answer.markup).startswith("<|open|>tools<|sep|><|open|>call tool=\"get_weather\"")
    assert answer.call_closed_at < answer.natural_length
    after_tool = messages + [{"role": "assistant", "tool_calls": [answer.tool_call.as_dict()]},
                             {"role": "tool", "content": "sunny"}]
    assert chat_answer(after_tool, WEATHER, "auto", plain) is plain
    assert chat_answer(messages, WEATHER, "none", plain) is plain
    assert plain.text(0, 3) + plain.text(3, 6) == plain.text(0, 6)


def _resumed(prompt: list[int], answer: Answer, cut: int, natural: int, thinking: int) -> Answer:
    return Answer.after([*prompt, *answer.ids(0, cut)], natural, thinking)


@pytest.mark.parametrize("thinking", [0, 5])
def test_an_answer_resumed_from_its_prompt_and_generated_ids_goes_on_token_for_token(thinking: int) -> None:
    """The simulated model is a function of the context: a stream cut after any token and resumed
    elsewhere from prompt + generated ids (the router's migration) yields the uninterrupted tokens,
    stops at the same place, and its text and think channel join up with the same spacing."""
    prompt = [token_id(w) for w in "tell me about the weather".split()]
    if thinking:
        prompt += [token_id(w) for w in THINK_OPEN]
    natural = 30
    whole = Answer.after(prompt, natural, thinking)
    n = whole.natural_length
    assert n == natural + (thinking + 3 if thinking else 0)
    for cut in range(1, n):
        rest = _resumed(prompt, whole, cut, natural, thinking)
        assert rest.natural_length == n - cut, cut
        assert rest.ids(0, rest.natural_length) == whole.ids(cut, n), cut
        assert whole.raw(0, cut, False) + rest.raw(0, n - cut, False) == whole.raw(0, n, False), cut
        assert whole.text(0, cut) + rest.text(0, n - cut) == whole.text(0, n), cut
        assert whole.reasoning(0, cut) + rest.reasoning(0, n - cut) == whole.reasoning(0, n), cut
    if thinking:
        assert whole.reasoning(0, n).split() == [THOUGHT[i % len(THOUGHT)] for i in range(thinking)]
        assert "<|close|>think<|sep|>" in whole.raw(0, n, False) and "<|" not in whole.raw(0, n)
    assert len(whole.text(0, n).split()) == natural


def test_answer_words_are_unique_so_a_word_says_where_it_is() -> None:
    assert len(set(SENTENCE)) == len(SENTENCE) and len(set(THOUGHT)) == len(THOUGHT)
    assert not set(THOUGHT) & (set(SENTENCE) | set(THINK_OPEN) | set(THINK_CLOSE))
    assert prompt_seed([token_id(w) for w in "a b c".split()]) == prompt_seed([token_id(w) for w in ["a", "b", "c"]])


def test_nixl_parameters_are_vllms() -> None:
    config = engine_config(parse_serve(role_report("b200-dep16-disaggregated", "prefill")["command"]),
                           SimSettings(gpu_product="B200", side_channel_host="10.1.2.3"))
    params = produced_params(config, rank=1, internal_id="cmpl-x-1", computed_tokens=99, block_ids=[[1], [2]])
    assert set(params) == {"do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id",
                           "remote_request_id", "remote_host", "remote_port", "tp_size", "dcp_size", "pp_size",
                           "remote_num_tokens", "remote_blocks_expiry_time", "remote_registration_generation",
                           "transfer_mode"}
    assert (params["remote_host"], params["remote_port"], params["tp_size"]) == ("10.1.2.3", 5601, 8)
    assert params["remote_engine_id"] == config.engine_ids[1]
    assert classify(params, connector=True).kind == CONSUME
    assert classify(params, connector=False).kind == NONE  # an engine without a connector ignores them
    assert classify({"do_remote_decode": True}, connector=True).kind == PRODUCE
    broken = classify({**params, "remote_host": None} | {"remote_block_ids": []}, connector=True)
    assert broken.kind == NONE and "invalid" in broken.problem
    assert classify(params, True).remote_tokens(100) == 100 - PREFILL_BACKOFF


def _config(role: str, port: int, *, extra: str = "", lease: float | None = None) -> EngineConfig:
    command = list(role_report("b200-dep16-disaggregated", role)["command"])
    if lease is not None:
        at = command.index("--kv-transfer-config") + 1
        command[at] = json.dumps({**json.loads(command[at]), "kv_connector_extra_config": {"kv_lease_duration": lease}})
    return engine_config(parse_serve(command), SimSettings(gpu_product="B200", compat_extra=extra,
                                                           side_channel_host="127.0.0.1", side_channel_port=port))


def _pulled(prefill: EngineConfig, decode: EngineConfig, params: dict[str, Any], *, read: bool = True) -> Pull:
    """A decode's pull of `params` against `prefill`'s side channel, run to its end."""

    async def run() -> Pull:
        channel = Nixl(prefill, engine_metrics(prefill))
        await channel.start()
        try:
            pull = Nixl(decode, engine_metrics(decode)).pull(params, lambda: None)
            if read:
                pull.read()
            await asyncio.wait_for(pull.task, 10)
            return pull
        finally:
            await channel.stop()

    return asyncio.run(run())


def test_the_side_channel_refuses_dead_unknown_and_incompatible_engines() -> None:
    base = free_port_base()
    prefill, decode = _config("prefill", base), _config("decode", base + 8)
    other = _config("prefill", base, extra="new-image")
    params = produced_params(prefill, rank=1, internal_id="r1", computed_tokens=10, block_ids=[[1], [2]])
    assert params["remote_port"] == base + 1
    served = _pulled(prefill, decode, params)
    assert served.problem is None and served.state == UNKNOWN  # reachable and compatible; never leased there

    mismatch = _pulled(other, decode, {**params, "remote_engine_id": other.engine_ids[1]})
    assert "compatibility hash" in (mismatch.problem or "") and mismatch.state is None
    wrong_rank = _pulled(prefill, decode, {**params, "remote_port": base})  # rank 0's port, rank 1's engine
    assert f"the engine there is {prefill.engine_ids[0]}" in (wrong_rank.problem or "")
    nobody = _pulled(prefill, decode, {**params, "remote_port": free_port()})
    assert "NIXL handshake" in (nobody.problem or "") and "refused" in (nobody.problem or "").lower()
    garbage = _pulled(prefill, decode, {**params, "remote_port": "5600"})
    assert "is not a port" in (garbage.problem or "")


def test_a_lease_is_freed_by_its_first_read_and_runs_out_without_heartbeats() -> None:
    now = [100.0]
    prefill = _config("prefill", 5600, lease=30)
    metrics = engine_metrics(prefill)
    leases = Leases(prefill, metrics, clock=lambda: now[0])
    assert (leases.duration, leases.extension, prefill.kv_heartbeat_interval) == (30, 20, 5)
    leases.grant("a", 0, [[1], [2]])
    leases.grant("b", 1, [[3], [4]])
    now[0] += 29
    leases.heartbeat("b")  # b: now until 129 + 20
    assert leases.read("a", 0) == LEASED
    assert leases.read("a", 0) == READ  # the second read of one set of params
    now[0] += 2
    leases.reap()
    assert leases.held.keys() == {"b"}
    now[0] += 18.5  # 149.5: past b's extended expiry
    assert leases.read("b", 1) == EXPIRED and leases.read("never", 0) == UNKNOWN
    assert leases.as_dict() | {"kv_lease_duration": 30} == {
        "kv_lease_duration": 30, "leases_held": 0, "leases_granted": 2, "reads": 1, "second_reads": 1,
        "reads_after_expiry": 1, "unknown_reads": 1, "expired_leases": 1, "heartbeats": 1}
    exposition = generate_latest(metrics.registry).decode()
    assert 'vllm:nixl_num_notifications_after_expiry_total{engine="0",model_name="kimi-k3"} 2.0' in exposition
    assert 'vllm:nixl_num_kv_expired_reqs_total{engine="1",model_name="kimi-k3"} 1.0' in exposition
    # vLLM's integer arithmetic: below 2 s a heartbeat extends nothing, below 6 s it beats every step
    short = _config("prefill", 5600, lease=1)
    assert (short.kv_lease_extension, short.kv_heartbeat_interval) == (0, 0)
    with pytest.raises(SettingsError):
        _config("prefill", 5600, lease="soon")  # type: ignore[arg-type]
