"""The hand-off failing the way vLLM 0.33.0's NIXL connector fails: a dead prefill, the KV lease and
the single read. Engines of golden b200-dep16-disaggregated, each on its own side-channel port.

A decode pulls over the prefill's side channel (remote_host:remote_port), so a SIGKILLed prefill
refuses it: the rendered decode (kv_load_failure_policy recompute) prefills the prompt itself,
one with vLLM's default policy answers 500. A prefill frees a request's blocks at its first read or
when the lease runs out; vLLM cannot refuse a later read of those blocks and the decode silently
decodes from whatever they hold, which the prefill alone counts
(vllm:nixl_num_notifications_after_expiry). The simulator counts it the same way and marks the
decode's answer corrupt (every token is CORRUPT_WORD), so a test sees what production would not.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from kimik3_simulator.cmdline import parse_serve
from kimik3_simulator.config import engine_config
from kimik3_simulator.settings import SimSettings
from kimik3_simulator.text import CORRUPT_WORD
from kimik3_simulator.timing import KV_POST_SECONDS

from .sims import Sim, role_report, simulator, sse_text, words

SCENARIO = "b200-dep16-disaggregated"
GPU = role_report(SCENARIO, "prefill")["gpuProduct"]
ENV = {"K3SIM_GPU_PRODUCT": GPU, "K3SIM_FAULT_ADMIN": "1"}
TO_PREFILL = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
              "remote_block_ids": None, "remote_host": None, "remote_port": None}


def command(role: str, *, lease: float | None = None, policy: str | None = "as rendered") -> list[str]:
    """The role's rendered leader command, with kv_lease_duration in the connector's extra config
    and/or kv_load_failure_policy removed (policy None: vLLM's default, fail)."""
    argv = list(role_report(SCENARIO, role)["command"])
    at = argv.index("--kv-transfer-config") + 1
    config = json.loads(argv[at])
    if lease is not None:
        config["kv_connector_extra_config"] = {"kv_lease_duration": lease}
    if policy is None:
        config.pop("kv_load_failure_policy", None)
    argv[at] = json.dumps(config)
    return argv


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Sim]]:
    """A prefill with vLLM's default 30 s lease, the rendered decode (recompute) and a decode with
    vLLM's default failure policy (fail)."""
    tmp = tmp_path_factory.mktemp("lease")
    with simulator(command("prefill"), tmp, ENV) as prefill, \
            simulator(command("decode"), tmp, ENV) as decode, \
            simulator(command("decode", policy=None), tmp, ENV) as strict:
        yield {"prefill": prefill, "decode": decode, "strict": strict}


def prefill_params(prefill: Sim, prompt: str, request_id: str) -> dict[str, Any]:
    answer = prefill.post("/v1/completions", {"model": "kimi-k3", "prompt": prompt, "max_tokens": 1,
                                              "kv_transfer_params": TO_PREFILL}, headers={"X-Request-Id": request_id})
    assert answer.status_code == 200, answer.text
    params = answer.json()["kv_transfer_params"]
    assert params["do_remote_prefill"] is True
    return dict(params)


def decode(sim: Sim, prompt: str, params: dict[str, Any], request_id: str, max_tokens: int = 6) -> requests.Response:
    return sim.post("/v1/completions", {"model": "kimi-k3", "prompt": prompt, "max_tokens": max_tokens,
                                        "kv_transfer_params": params}, headers={"X-Request-Id": request_id})


def nixl(sim: Sim) -> dict[str, Any]:
    return dict(sim.stats()["nixl"])


def wait_for(predicate: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"not {what} within {seconds}s"
        time.sleep(0.05)


def test_a_second_read_of_one_set_of_params_is_counted_and_decodes_corrupt(engines: dict[str, Sim]) -> None:
    prefill, first, second = engines["prefill"], engines["decode"], engines["strict"]
    prompt = words(3000, "twice")
    params = prefill_params(prefill, prompt, "twice")
    assert nixl(prefill)["leases_held"] >= 1
    before = nixl(prefill)

    good = decode(first, prompt, params, "twice-1")
    assert good.status_code == 200, good.text
    assert CORRUPT_WORD not in good.json()["choices"][0]["text"]
    assert first.stats()["by_request_id"]["twice-1"]["corrupt_kv"] is None
    after_first = nixl(prefill)
    assert after_first["reads"] == before["reads"] + 1 and after_first["second_reads"] == before["second_reads"]

    # the same params to another decode: vLLM reads the freed blocks without an error
    events = second.stream("/v1/completions", {"model": "kimi-k3", "prompt": prompt, "max_tokens": 6,
                                               "kv_transfer_params": params}, headers={"X-Request-Id": "twice-2"})
    assert events[-1][1] == "[DONE]" and not any(isinstance(e, dict) and "error" in e for _, e in events)
    assert sse_text(events).split() == [CORRUPT_WORD] * 6
    record = second.stats()["by_request_id"]["twice-2"]
    assert record["path"] == "remote_prefill" and "after they were freed (read)" in record["corrupt_kv"]
    assert second.stats()["requests"]["corrupt_outputs"] == 1
    after_second = nixl(prefill)
    assert after_second["second_reads"] == before["second_reads"] + 1
    assert after_second["reads"] == after_first["reads"]
    assert prefill.metric("vllm:nixl_num_notifications_after_expiry_total") == after_second["second_reads"]
    assert second.metric("vllm:nixl_num_failed_transfers_total") == 0  # the decode saw no failure


def test_a_decode_that_took_the_params_and_reset_has_read_them(engines: dict[str, Sim]) -> None:
    """A reset after the 200's headers: the decode had pulled the KV, so resending the params to
    another decode (which the router must not do) is a second read."""
    prefill, first, second = engines["prefill"], engines["decode"], engines["strict"]
    prompt = words(500, "reset")
    params = prefill_params(prefill, prompt, "reset")
    before = nixl(prefill)
    assert first.post("/sim/fault", {"fault": "reset"}).status_code == 200
    cut = requests.post(first.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 6,
                                                             "kv_transfer_params": params}, stream=True, timeout=30)
    assert cut.status_code == 200
    with pytest.raises(requests.exceptions.ChunkedEncodingError, match="reset by peer"):
        cut.content  # noqa: B018 - reading the body is what fails
    assert first.stats()["faults"]["counts"]["reset"] == 1
    assert nixl(prefill)["reads"] == before["reads"] + 1
    again = decode(second, prompt, params, "reset-2")
    assert again.status_code == 200 and set(again.json()["choices"][0]["text"].split()) == {CORRUPT_WORD}
    assert nixl(prefill)["second_reads"] == before["second_reads"] + 1


def test_a_decode_pulling_from_a_sigkilled_prefill_is_refused(engines: dict[str, Sim], tmp_path: Path) -> None:
    decode_, strict = engines["decode"], engines["strict"]
    prompt = words(2000, "killed")
    with simulator(command("prefill"), tmp_path, ENV) as doomed:
        params = prefill_params(doomed, prompt, "killed")
        doomed.process.kill()
        doomed.process.wait(10)
    failed_before = decode_.metric("vllm:nixl_num_failed_transfers_total")

    # the rendered decode (recompute) prefills the prompt itself, and counts the failed transfer
    served = decode(decode_, prompt, params, "killed-1", max_tokens=4)
    assert served.status_code == 200, served.text
    assert served.json()["usage"]["completion_tokens"] == 4
    record = decode_.stats()["by_request_id"]["killed-1"]
    assert record["path"] == "recomputed_after_failed_load" and record["computed_prompt_tokens"] == 2000
    assert "NIXL handshake" in record["problem"] and "ConnectionRefusedError" in record["problem"]
    assert decode_.metric("vllm:nixl_num_failed_transfers_total") == failed_before + 1
    assert nixl(decode_)["failed_pulls"] >= 1

    # with vLLM's default policy the request fails
    failed = decode(strict, prompt, params, "killed-2")
    assert failed.status_code == 500, failed.text
    error = failed.json()["error"]
    assert error["type"] == "InternalServerError" and "ConnectionRefusedError" in error["message"]
    assert strict.stats()["by_request_id"]["killed-2"]["finish_reason"] == "error"


SHORT_LEASE = 3


@pytest.fixture(scope="module")
def short_lease(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """A prefill whose kv_lease_duration is 3 s: a heartbeat extends a lease to 2 s from then."""
    with simulator(command("prefill", lease=SHORT_LEASE), tmp_path_factory.mktemp("short"), ENV) as prefill:
        yield prefill


def test_a_read_after_the_lease_expired_is_counted_and_decodes_corrupt(
        engines: dict[str, Sim], short_lease: Sim) -> None:
    prefill, decode_ = short_lease, engines["decode"]
    prompt = words(1000, "late")
    params = prefill_params(prefill, prompt, "late")
    expired_before = nixl(prefill)["expired_leases"]
    wait_for(lambda: nixl(prefill)["expired_leases"] == expired_before + 1, SHORT_LEASE + 3, "expired")
    assert prefill.metric("vllm:nixl_num_kv_expired_reqs_total") == expired_before + 1

    late = decode(decode_, prompt, params, "late")
    assert late.status_code == 200, late.text  # no error: vLLM cannot tell
    assert set(late.json()["choices"][0]["text"].split()) == {CORRUPT_WORD}
    assert "(expired)" in decode_.stats()["by_request_id"]["late"]["corrupt_kv"]
    assert nixl(prefill)["reads_after_expiry"] == 1
    assert prefill.metric("vllm:nixl_num_notifications_after_expiry_total") == 1


def test_heartbeats_keep_the_lease_through_a_transfer_longer_than_it(short_lease: Sim, tmp_path: Path) -> None:
    """A decode on a slow fabric pulls for ~4.5 s, longer than the 3 s lease; its heartbeats (every
    step: lease // 6 is 0) keep the blocks the request's until the read."""
    prompt = words(8192, "slow")
    decode_command = command("decode", lease=SHORT_LEASE)
    per_gpu = engine_config(parse_serve(decode_command), SimSettings(gpu_product=GPU, kv_fabric_gb_s=1.0)
                            ).perf.kv_transfer(8191).seconds - KV_POST_SECONDS  # seconds at 1 GB/s
    fabric = per_gpu / (SHORT_LEASE + 1.5)
    with simulator(decode_command, tmp_path, {**ENV, "K3SIM_KV_FABRIC_GBPS": str(fabric)}) as slow:
        before = nixl(short_lease)
        params = prefill_params(short_lease, prompt, "slow")
        served = decode(slow, prompt, params, "slow", max_tokens=2)
        assert served.status_code == 200, served.text
        record = slow.stats()["by_request_id"]["slow"]
    assert record["ttft_seconds"] > SHORT_LEASE + 0.5 and record["path"] == "remote_prefill"
    assert record["corrupt_kv"] is None and CORRUPT_WORD not in served.json()["choices"][0]["text"]
    after = nixl(short_lease)
    assert after["reads"] == before["reads"] + 1 and after["expired_leases"] == before["expired_leases"]
    assert after["heartbeats"] - before["heartbeats"] >= 20
