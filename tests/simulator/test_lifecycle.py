"""Start, readiness, drain and exit of the simulator process, the way a pod runner drives it."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .sims import PYTHONPATH, Sim, expand, role_report, simulator, sse_text, start, words

AGG = role_report("gb300-tp8-aggregated", "aggregated")
ENV = {"K3SIM_GPU_PRODUCT": AGG["gpuProduct"]}


def _wait(predicate: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"not {what} within {seconds}s"
        time.sleep(0.05)


def test_health_is_503_until_the_startup_delay_has_passed(tmp_path: Path) -> None:
    with simulator(AGG["command"], tmp_path, {**ENV, "K3SIM_STARTUP_SECONDS": "20", "K3SIM_TIME_SCALE": "0.1"},
                   ready=False) as sim:
        assert sim.get("/health").status_code == 503
        refused = sim.post("/v1/completions", {"prompt": "early"})
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "ServiceUnavailableError"
        _wait(lambda: sim.get("/health").status_code == 200, 10, "ready after 20 s x 0.1")
        assert sim.post("/v1/completions", {"prompt": "now", "max_tokens": 1}).status_code == 200


def _stream_in_background(sim: Sim, body: dict[str, Any]) -> tuple[threading.Thread, list[Any]]:
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(sim.stream("/v1/completions", body))
        except Exception as exc:  # noqa: BLE001 - the assertion happens in the test thread
            result.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_sigterm_drains_in_flight_requests_then_exits(tmp_path: Path) -> None:
    with simulator(AGG["command"], tmp_path, ENV) as sim:
        thread, result = _stream_in_background(sim, {"prompt": words(64, "drain"), "max_tokens": 120})
        _wait(lambda: sim.stats()["engine"]["in_flight"] == 1, 5, "in flight")
        sim.process.send_signal(signal.SIGTERM)
        _wait(lambda: sim.get("/health").status_code == 503, 5, "unready once draining")
        assert sim.post("/v1/completions", {"prompt": "late", "max_tokens": 1}).status_code == 503
        thread.join(10)
        events = result[0]
        assert not isinstance(events, Exception), events
        assert len(sse_text(events).split()) == 120 and events[-1][1] == "[DONE]"
        assert sim.process.wait(10) == 0


def test_a_zero_shutdown_timeout_aborts_in_flight_requests(tmp_path: Path) -> None:
    with simulator([*AGG["command"], "--shutdown-timeout", "0"], tmp_path, ENV) as sim:
        thread, result = _stream_in_background(sim, {"prompt": "abort me", "max_tokens": 2000})
        _wait(lambda: sim.stats()["engine"]["in_flight"] == 1, 5, "in flight")
        sim.process.send_signal(signal.SIGTERM)
        thread.join(10)
        events = result[0]
        assert not isinstance(events, Exception), events
        assert "error" in events[-2][1] and events[-1][1] == "[DONE]"  # a clean SSE error, then the end
        assert sim.process.wait(10) == 0


def test_a_headless_worker_serves_nothing_and_stops_on_sigterm(tmp_path: Path) -> None:
    sim = start(AGG["worker"]["command"], tmp_path, ENV)
    deadline = time.monotonic() + 20  # its imports alone take ~2 s on a loaded 2-core machine
    while "headless" not in sim.log.read_text() and sim.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sim.process.poll() is None, sim.log.read_text()
    assert "headless" in sim.log.read_text()
    assert sim.terminate() == 0


def test_a_command_that_is_not_vllm_serve_exits_2() -> None:
    run = subprocess.run([sys.executable, "-m", "kimik3_simulator", "sleep", "10"], capture_output=True,
                         text=True, timeout=30, env={"PYTHONPATH": PYTHONPATH})
    assert run.returncode == 2 and "no `vllm serve`" in run.stderr
    bad = subprocess.run([sys.executable, "-m", "kimik3_simulator", *expand(AGG["command"])],
                         capture_output=True, text=True, timeout=30,
                         env={"PYTHONPATH": PYTHONPATH, "K3SIM_GPU_PRODUCT": "NVIDIA-T4"})
    assert bad.returncode == 2 and "K3SIM_GPU_PRODUCT" in bad.stderr
