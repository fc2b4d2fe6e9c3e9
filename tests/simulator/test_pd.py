"""vLLM's P/D hand-off between a prefill and a decode engine of golden b200-dep16-disaggregated
(TP8 x DP2 with expert parallelism, NixlConnector kv_producer / kv_consumer), each started from its
rendered leader command, the decode pulling over the prefill's NIXL side channel. The
requests are what a P/D proxy (vllm-router) sends: the prompt to prefill with do_remote_decode and
max_tokens 1, then the original request to decode with the kv_transfer_params prefill returned.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from .sims import Sim, role_report, simulator, sse_text, words

SCENARIO = "b200-dep16-disaggregated"
TO_PREFILL = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}
"""What vLLM's P/D proxies put on the prefill leg."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pd")


def _env(folder: Path, **extra: str) -> dict[str, str]:
    return {"K3SIM_GPU_PRODUCT": role_report(SCENARIO, "prefill")["gpuProduct"], **extra}


@pytest.fixture(scope="module")
def pd(folder: Path) -> Iterator[tuple[Sim, Sim]]:
    with simulator(role_report(SCENARIO, "prefill")["command"], folder, _env(folder)) as prefill, \
            simulator(role_report(SCENARIO, "decode")["command"], folder, _env(folder)) as decode:
        yield prefill, decode


def _prefill(prefill: Sim, prompt: str, request_id: str) -> dict[str, Any]:
    answer = prefill.post("/v1/completions", {"model": "kimi-k3", "prompt": prompt, "max_tokens": 1,
                                              "kv_transfer_params": TO_PREFILL}, headers={"X-Request-Id": request_id})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["usage"]["completion_tokens"] == 1 and body["choices"][0]["finish_reason"] == "length"
    return body["kv_transfer_params"]


def test_prefill_answers_with_the_parameters_vllm_returns(pd: tuple[Sim, Sim]) -> None:
    prefill, _ = pd
    params = _prefill(prefill, words(4000, "fields"), "fields")
    engine = prefill.stats()["engine"]
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_engine_id"] in engine["engine_ids"] and params["remote_engine_id"].endswith(("_dp0", "_dp1"))
    assert params["remote_request_id"].startswith("cmpl-fields-")
    assert (params["remote_host"], params["tp_size"], params["dcp_size"], params["pp_size"]) == ("127.0.0.1", 8, 1, 1)
    base = int((prefill.env or {})["VLLM_NIXL_SIDE_CHANNEL_PORT"])  # 5600 in a pod
    assert params["remote_port"] == base + int(params["remote_engine_id"][-1])
    assert prefill.stats()["nixl"]["listening"] == [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"]
    assert params["remote_num_tokens"] == 3999  # the decoder recomputes the last token (KDA state)
    mla, kda = params["remote_block_ids"]
    assert len(mla) == -(-3999 // engine["block_size"]) and len(kda) == 1
    assert params["transfer_mode"] == "pull" and params["remote_blocks_expiry_time"] is None
    record = prefill.stats()["by_request_id"]["fields"]
    assert record["path"] == "prefill_for_remote_decode" and record["computed_prompt_tokens"] == 3999


def test_decode_with_kv_transfer_params_does_not_prefill(pd: tuple[Sim, Sim]) -> None:
    prefill, decode = pd
    prompt = words(8192, "handoff")
    params = _prefill(prefill, prompt, "handoff")
    events = decode.stream("/v1/completions", {"model": "kimi-k3", "prompt": prompt, "max_tokens": 16,
                                               "kv_transfer_params": params}, headers={"X-Request-Id": "handoff"})
    assert len(sse_text(events).split()) == 16
    finals = [e for _, e in events if isinstance(e, dict) and e["choices"][0]["finish_reason"]]
    assert finals[0]["kv_transfer_params"] is None  # a decode engine hands nothing back
    record = decode.stats()["by_request_id"]["handoff"]
    assert record["path"] == "remote_prefill" and record["remote_engine_id"] == params["remote_engine_id"]
    assert (record["external_kv_tokens"], record["computed_prompt_tokens"]) == (8191, 1)
    assert record["prompt_fingerprint"] == prefill.stats()["by_request_id"]["handoff"]["prompt_fingerprint"]
    # it paid a KV transfer and one step, not an 8192-token prefill: counted, not timed (the wall
    # clock of a simulator beside two e2e lanes is the bench's business: 0.086 s against a 0.083 s
    # bound failed a CI rehearsal at nice 19)
    assert decode.metric("vllm:nixl_bytes_transferred_count") == 1
    assert decode.metric("vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 8191
    assert decode.metric("vllm:prompt_tokens_by_source_total", source="local_compute") == 1


def test_decode_without_them_prefills_the_whole_prompt(pd: tuple[Sim, Sim]) -> None:
    _, decode = pd
    events = decode.stream("/v1/completions", {"model": "kimi-k3", "prompt": words(8192, "alone"), "max_tokens": 4},
                           headers={"X-Request-Id": "alone"})
    record = decode.stats()["by_request_id"]["alone"]
    assert record["path"] == "local_prefill" and record["computed_prompt_tokens"] == 8192
    assert record["external_kv_tokens"] == 0 and record["remote_engine_id"] is None
    assert events[0][0] >= role_report(SCENARIO, "prefill")["predicted"]["ttftSeconds"] * 0.95


def test_a_chat_goes_through_the_same_hand_off(pd: tuple[Sim, Sim]) -> None:
    prefill, decode = pd
    chat = {"model": "kimi-k3", "messages": [{"role": "user", "content": words(3000, "chat")}]}
    first = prefill.post("/v1/chat/completions", {**chat, "max_tokens": 1, "kv_transfer_params": TO_PREFILL},
                         headers={"X-Request-Id": "chat"}).json()
    answer = decode.post("/v1/chat/completions", {**chat, "max_tokens": 6,
                                                  "kv_transfer_params": first["kv_transfer_params"]},
                         headers={"X-Request-Id": "chat"}).json()
    assert len(answer["choices"][0]["message"]["content"].split()) == 6
    assert decode.stats()["by_request_id"]["chat"]["path"] == "remote_prefill"


@contextmanager
def _mismatched_params(folder: Path, prompt: str, request_id: str) -> Iterator[dict[str, Any]]:
    """kv_transfer_params from a live prefill engine whose NIXL compatibility hash differs (another image)."""
    with simulator(role_report(SCENARIO, "prefill")["command"], folder,
                   _env(folder, K3SIM_COMPAT_EXTRA="another-image")) as other:
        yield _prefill(other, prompt, request_id)


def test_a_failed_pull_is_prefilled_by_the_decode_as_rendered(pd: tuple[Sim, Sim], folder: Path) -> None:
    """The rendered decode has kv_load_failure_policy recompute: the request is served from a local
    prefill, and the failed transfer is counted."""
    _, decode = pd
    assert '"kv_load_failure_policy":"recompute"' in " ".join(role_report(SCENARIO, "decode")["command"])
    prompt = words(2000, "recompute")
    failed_before = decode.metric("vllm:nixl_num_failed_transfers_total")
    with _mismatched_params(folder, prompt, "recompute") as params:
        served = decode.post("/v1/completions", {"prompt": prompt, "max_tokens": 4, "kv_transfer_params": params},
                             headers={"X-Request-Id": "recompute"})
    assert served.status_code == 200, served.text
    assert served.json()["usage"]["completion_tokens"] == 4
    record = decode.stats()["by_request_id"]["recompute"]
    assert record["path"] == "recomputed_after_failed_load" and "NIXL handshake" in record["problem"]
    assert "compatibility hash" in record["problem"]
    assert record["external_kv_tokens"] == 0 and record["computed_prompt_tokens"] == record["prompt_tokens"]
    assert decode.stats()["requests"]["recomputed_after_failed_load"] >= 1
    assert decode.metric("vllm:nixl_num_failed_transfers_total") == failed_before + 1


def test_with_vllms_default_policy_a_failed_pull_fails_the_request(folder: Path) -> None:
    command = list(role_report(SCENARIO, "decode")["command"])
    at = command.index("--kv-transfer-config") + 1
    command[at] = json.dumps({k: v for k, v in json.loads(command[at]).items() if k != "kv_load_failure_policy"})
    prompt = words(2000, "mismatch")
    with simulator(command, folder, _env(folder)) as decode, _mismatched_params(folder, prompt, "mismatch") as params:
        failed = decode.post("/v1/completions", {"prompt": prompt, "max_tokens": 4, "kv_transfer_params": params},
                             headers={"X-Request-Id": "mismatch"})
        assert failed.status_code == 500 and "compatibility hash" in failed.json()["error"]["message"]
        assert decode.stats()["by_request_id"]["mismatch"]["finish_reason"] == "error"
        assert decode.metric("vllm:nixl_num_failed_transfers_total") >= 1
        # the next request is served
        assert decode.post("/v1/completions", {"prompt": prompt, "max_tokens": 2}).status_code == 200


def test_an_engine_without_a_connector_ignores_kv_transfer_params(tmp_path: Path) -> None:
    agg = role_report("gb300-tp8-aggregated", "aggregated")
    with simulator(agg["command"], tmp_path, {"K3SIM_GPU_PRODUCT": agg["gpuProduct"]}) as sim:
        body = sim.post("/v1/completions", {"prompt": words(100, "x"), "max_tokens": 2,
                                            "kv_transfer_params": TO_PREFILL}).json()
        assert body["kv_transfer_params"] is None and body["usage"]["completion_tokens"] == 2
