"""Faults beyond SIGKILL (faults.py): armed at start by K3SIM_FAULTS or at run time by POST /sim/fault,
each doing what an engine in that state does to its clients, and each counted in /sim/stats."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import requests
from aiohttp.test_utils import make_mocked_request

from kimik3_simulator.cmdline import parse_serve
from kimik3_simulator.config import engine_config, engine_metrics
from kimik3_simulator.engine import Engine
from kimik3_simulator.faults import ENGINE_DEAD, Fault, FaultError, Faults, parse_faults
from kimik3_simulator.nixl import Nixl
from kimik3_simulator.server import Simulator
from kimik3_simulator.settings import SettingsError, SimSettings, settings_from_env
from kimik3_simulator.stats import SimStats

from .sims import PYTHONPATH, Sim, expand, role_report, simulator, sse_text, start, words

AGG = role_report("gb300-tp8-aggregated", "aggregated")
ENV = {"K3SIM_GPU_PRODUCT": AGG["gpuProduct"]}
BODY = {"model": "kimi-k3", "prompt": words(32, "f"), "max_tokens": 8}


@pytest.fixture(scope="module")
def admin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    """An engine whose faults may be armed at run time."""
    with simulator(AGG["command"], tmp_path_factory.mktemp("faults"), {**ENV, "K3SIM_FAULT_ADMIN": "1"}) as sim:
        yield sim


@pytest.fixture()
def armed(admin: Sim) -> Iterator[Any]:
    """arm(fault...) on the admin engine; every fault is cleared after the test."""

    def arm(*faults: dict[str, Any]) -> dict[str, Any]:
        answer = admin.post("/sim/fault", list(faults))
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    yield arm
    assert admin.post("/sim/fault", {"fault": "none"}).status_code == 200


def fault_counts(sim: Sim) -> dict[str, int]:
    return dict(sim.stats()["faults"]["counts"])


def test_the_short_and_the_json_forms_of_k3sim_faults() -> None:
    assert parse_faults("") == []
    assert parse_faults("exit_at_start:3, oom:1.5,hang,stall:8,5xx:3,reset") == [
        Fault("exit_at_start", exit_code=3), Fault("oom", delay_seconds=1.5), Fault("hang"),
        Fault("stall", after_tokens=8), Fault("5xx", count=3), Fault("reset", count=1)]
    assert parse_faults('[{"fault": "stall", "after_tokens": 2, "count": 1}, {"fault": "5xx", "count": null}]') == [
        Fault("stall", count=1, after_tokens=2), Fault("5xx", count=None)]
    for bad in ("explode", "5xx:0", "exit_at_start:0", "stall:-1", "hang:x", '{"fault": "hang", "every": 2}',
                '{"fault": "5xx", "count": true}', "none", "[1]", "{nope"):
        with pytest.raises(FaultError):
            parse_faults(bad)
    with pytest.raises(SettingsError, match="K3SIM_FAULTS"):
        settings_from_env({"K3SIM_FAULTS": "oom:soon"})
    settings = settings_from_env({"K3SIM_FAULTS": "hang", "K3SIM_FAULT_ADMIN": "1", "K3SIM_OOM_CAP_BYTES": "1e8"})
    assert (settings.faults, settings.fault_admin, settings.oom_cap_bytes) == ("hang", True, 10**8)
    assert settings_from_env({}).fault_admin is False


def test_a_5xx_burst_answers_the_next_requests_with_vllms_error(admin: Sim, armed: Any) -> None:
    before = fault_counts(admin)["5xx"]
    assert armed({"fault": "5xx", "count": 2})["armed"] == [
        {"kind": "5xx", "count": 2, "after_tokens": 0, "exit_code": 1, "delay_seconds": 0.0}]
    for _ in range(2):
        failed = admin.post("/v1/completions", BODY)
        assert failed.status_code == 500
        assert failed.json() == {"error": {"message": ENGINE_DEAD, "type": "InternalServerError", "param": None,
                                           "code": 500}}
    assert admin.get("/health").status_code == 200
    assert admin.post("/v1/chat/completions", {"model": "kimi-k3", "max_tokens": 2,
                                               "messages": [{"role": "user", "content": "hi"}]}).status_code == 200
    stats = admin.stats()
    assert stats["faults"]["counts"]["5xx"] == before + 2 and stats["faults"]["armed"] == []


def test_a_reset_after_headers_cuts_the_stream_with_an_rst(admin: Sim, armed: Any) -> None:
    before = fault_counts(admin)["reset"]
    armed({"fault": "reset"})
    conn = http.client.HTTPConnection("127.0.0.1", int(admin.url.rsplit(":", 1)[1]), timeout=10)
    try:
        conn.request("POST", "/v1/completions", json.dumps({**BODY, "stream": True}),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("Content-Type") == "text/event-stream"
        with pytest.raises(ConnectionResetError):  # an RST, not a clean end of the body
            response.read()
    finally:
        conn.close()
    assert fault_counts(admin)["reset"] == before + 1
    assert admin.post("/v1/completions", BODY).status_code == 200  # count 1: the next one is served


def test_a_hung_engine_takes_requests_answers_nothing_and_stays_healthy(admin: Sim, armed: Any) -> None:
    before = fault_counts(admin)["hang"]
    armed({"fault": "hang"})
    with pytest.raises(requests.ReadTimeout):  # the connection is held open, not closed
        admin.post("/v1/completions", BODY, timeout=1.5)
    with pytest.raises(requests.ReadTimeout):
        admin.post("/v1/completions", BODY, timeout=0.5)  # every request until cleared
    assert admin.get("/health").status_code == 200
    assert admin.get("/v1/models").status_code == 200
    stats = admin.stats()
    assert stats["faults"]["counts"]["hang"] == before + 2 and stats["engine"]["in_flight"] == 0
    assert admin.post("/sim/fault", {"fault": "none"}).json()["armed"] == []
    assert admin.post("/v1/completions", BODY).status_code == 200


def test_the_admin_route_refuses_what_it_cannot_arm(admin: Sim) -> None:
    for body, message in (({"fault": "explode"}, "unknown fault"), ({"fault": "exit_at_start"}, "start-up fault"),
                          ({"fault": "5xx", "count": 0}, "count"), ({"kind": "hang"}, '"fault"')):
        refused = admin.post("/sim/fault", body)
        assert refused.status_code == 400 and message in refused.json()["error"]["message"], refused.text
    garbage = requests.post(admin.url + "/sim/fault", data=b"{", timeout=10)
    assert garbage.status_code == 400
    assert admin.stats()["faults"]["armed"] == []


def test_a_stall_from_the_environment_stops_the_stream_and_keeps_it_open(tmp_path: Path) -> None:
    """K3SIM_FAULTS=stall:5: five tokens, then silence on an open connection; the admin route is off."""
    with simulator(AGG["command"], tmp_path, {**ENV, "K3SIM_FAULTS": "stall:5"}) as sim:
        assert sim.stats()["faults"]["armed"][0]["after_tokens"] == 5
        refused = sim.post("/sim/fault", {"fault": "none"})
        assert refused.status_code == 403 and "K3SIM_FAULT_ADMIN" in refused.json()["error"]["message"]
        events: list[Any] = []
        with pytest.raises(TimeoutError):  # the socket times out: no [DONE], no end of the body
            _read_stream(sim, {**BODY, "max_tokens": 40}, events, timeout=1.5)
        assert len(sse_text([(0.0, e) for e in events]).split()) == 5
        assert "[DONE]" not in events
        stats = sim.stats()
        assert stats["faults"]["counts"]["stall"] == 1
        assert next(iter(stats["by_request_id"].values()))["finish_reason"] == "abort"  # the engine let it go
        assert stats["engine"]["in_flight"] == 0


def _read_stream(sim: Sim, body: dict[str, Any], events: list[Any], timeout: float) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", int(sim.url.rsplit(":", 1)[1]), timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200
        while line := response.readline():
            if line.startswith(b"data: "):
                data = line[6:].strip().decode()
                events.append(data if data == "[DONE]" else json.loads(data))
    finally:
        conn.close()


def _refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_exit_at_start_exits_with_its_code_before_listening(tmp_path: Path) -> None:
    fault = json.dumps({"fault": "exit_at_start", "exit_code": 3, "delay_seconds": 1.0})
    sim = start(AGG["command"], tmp_path, {**ENV, "K3SIM_FAULTS": fault})
    port = int(sim.url.rsplit(":", 1)[1])
    deadline = time.monotonic() + 30
    while sim.process.poll() is None:
        assert _refused(port), "it listened"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert sim.process.returncode == 3
    assert "fault exit_at_start: exiting with 3 before listening" in sim.log.read_text()
    # a worker pod's headless command crashes the same way
    worker = subprocess.run([sys.executable, "-m", "kimik3_simulator", *expand(AGG["worker"]["command"])],
                            env={**os.environ, "PYTHONPATH": PYTHONPATH, **ENV, "K3SIM_FAULTS": "exit_at_start:7"},
                            capture_output=True, text=True, timeout=60)
    assert worker.returncode == 7


def test_oom_grows_the_memory_to_its_cap_then_exits_137(tmp_path: Path) -> None:
    cap = 192 << 20
    sim = start(AGG["command"], tmp_path, {**ENV, "K3SIM_FAULTS": "oom:3", "K3SIM_OOM_CAP_BYTES": str(cap)})
    deadline = time.monotonic() + 30
    healthy = False
    while sim.process.poll() is None and time.monotonic() < deadline and not healthy:
        try:
            healthy = requests.get(sim.url + "/health", timeout=1).status_code == 200
        except requests.ConnectionError:
            time.sleep(0.05)
    assert healthy, sim.log.read_text()[-2000:]  # it serves until the memory runs out
    _, status, usage = os.wait4(sim.process.pid, 0)
    sim.process.returncode = os.waitstatus_to_exitcode(status)
    assert sim.process.returncode == 137
    assert usage.ru_maxrss * 1024 >= cap  # the pages were written, not just reserved
    assert f"fault oom: {cap} bytes and still alive; exiting 137" in sim.log.read_text()


def test_the_admin_route_answers_loopback_peers_only() -> None:
    config = engine_config(parse_serve(AGG["command"]), SimSettings(gpu_product=AGG["gpuProduct"], fault_admin=True))

    async def arm_from(peer: str) -> int:
        metrics = engine_metrics(config)
        sim = Simulator(config, Engine(config, metrics, SimStats(10), Nixl(config, metrics)), SimStats(10),
                        Faults([], config.settings.oom_cap_bytes))
        transport = mock.Mock()
        transport.get_extra_info.side_effect = lambda name, default=None: (peer, 40000) if name == "peername" \
            else default
        request = make_mocked_request("POST", "/sim/fault", transport=transport)
        request.json = mock.AsyncMock(return_value={"fault": "hang"})  # type: ignore[method-assign]
        response = await sim.sim_fault(request)
        assert ("hang" in sim.faults.armed) is (response.status == 200)
        return response.status

    assert asyncio.run(arm_from("10.1.2.3")) == 403
    assert asyncio.run(arm_from("::1")) == 200
    assert asyncio.run(arm_from("127.0.0.9")) == 200


def test_a_port_in_use_stops_the_start_like_a_side_channel_vllm_cannot_bind(tmp_path: Path) -> None:
    prefill = role_report("b200-dep16-disaggregated", "prefill")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        base = taken.getsockname()[1]
        sim = start(prefill["command"], tmp_path, {"K3SIM_GPU_PRODUCT": prefill["gpuProduct"],
                                                   "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                                                   "VLLM_NIXL_SIDE_CHANNEL_PORT": str(base)})
        assert sim.process.wait(60) == 1
    assert f"cannot listen on the NIXL side channel 127.0.0.1:{base}" in sim.log.read_text()
