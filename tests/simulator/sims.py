"""Simulator processes for tests: started from a golden scenario's rendered leader command, on loopback."""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
from prometheus_client.parser import text_string_to_metric_families

from kimik3_operator.render.report import plan_report
from tests.golden.scenarios import SCENARIOS
from tests.golden.test_golden import plan_scenario
from tests.support import kubelet

ROOT = Path(__file__).resolve().parents[2]
POD_VALUES = {"POD_IP": "10.0.0.1", "LWS_LEADER_ADDRESS": "10.0.0.1", "LWS_WORKER_INDEX": "1"}
"""What the kubelet would expand $(NAME) to; the simulator never connects to these addresses."""
START_TIMEOUT = 30.0
PYTHONPATH = os.pathsep.join(str(ROOT / d) for d in ("operator", "simulator"))
"""This checkout's operator and simulator, whatever an editable install in the venv points at."""


def role_report(scenario: str, role: str, *, scale_out: bool | None = None) -> dict[str, Any]:
    """The plan report of one role of a golden scenario (its leader command, env and predictions).
    `scale_out` False/True: the leader command without/with --enable-scale-out, which the renderer
    adds only for a prefix-aware router (Plan.router_tokenizes); None: as rendered."""
    report = plan_report(plan_scenario(SCENARIOS[scenario]))
    found = next(r | {"gpuProduct": p["gpuProduct"]} for p in report["pools"] for r in p["roles"] if r["role"] == role)
    if scale_out is not None:
        plain = [a for a in found["command"] if a != "--enable-scale-out"]
        found["command"] = [*plain, "--enable-scale-out"] if scale_out else plain
    return found


def expand(argv: list[str]) -> list[str]:
    return [kubelet.expand(a, POD_VALUES) for a in argv]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


HANDED_OUT: list[tuple[int, int]] = []
"""(base, count) of every range given out in this process: a simulator started a moment ago may not
have bound its range yet when the next one is checked."""


def free_port_base(count: int = 16) -> int:
    """A loopback port where `count` consecutive ports are free: a NIXL side channel's base (5600's
    stand-in), one port per data-parallel rank. Picked below Linux's ephemeral range (32768 up),
    where outgoing connections do not take ports between the check and the simulator's bind, and
    clear of the ranges this process gave out before."""
    rng = random.Random()
    for _ in range(100):
        base = rng.randrange(20000, 32768 - count)
        taken = any(base < b + n and b < base + count for b, n in HANDED_OUT)
        for port in range(base, base + count):
            if taken:
                break
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    taken = True
        if not taken:
            HANDED_OUT.append((base, count))
            return base
    raise AssertionError(f"no {count} consecutive free loopback ports")


@dataclass
class Sim:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str] | None = None
    """What the test gave it on top of the defaults (start())."""

    def get(self, path: str, **kw: Any) -> requests.Response:
        return requests.get(self.url + path, timeout=10, **kw)

    def post(self, path: str, body: dict[str, Any], **kw: Any) -> requests.Response:
        return requests.post(self.url + path, json=body, timeout=kw.pop("timeout", 30), **kw)

    def stream(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None,
               timeout: float = 30) -> list[tuple[float, Any]]:
        """POST with stream: true; (seconds since the request was sent, event) per SSE event, as the
        event arrives (http.client reads line by line, so the times are the client's own)."""
        url = urlsplit(self.url)
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout)
        sent = time.monotonic()
        try:
            conn.request("POST", path, json.dumps({**body, "stream": True}),
                         {"Content-Type": "application/json", **(headers or {})})
            response = conn.getresponse()
            assert response.status == 200, response.read()[:500]
            assert response.getheader("Content-Type", "").startswith("text/event-stream")
            events: list[tuple[float, Any]] = []
            while line := response.readline():
                if line.startswith(b"data: "):
                    data = line[6:].strip().decode()
                    events.append((time.monotonic() - sent, data if data == "[DONE]" else json.loads(data)))
            return events
        finally:
            conn.close()

    def stats(self) -> dict[str, Any]:
        return self.get("/sim/stats").json()

    def metric(self, sample: str, **labels: str) -> float:
        """The sum of a sample over the series whose labels include `labels`, parsed as a scraper parses it."""
        return sum(s.value for family in text_string_to_metric_families(self.get("/metrics").text)
                   for s in family.samples
                   if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))

    def terminate(self, timeout: float = 15.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
            log = self.log.read_text()[-3000:]
            raise AssertionError(f"the simulator did not stop on SIGTERM; log:\n{log}") from None


def words(count: int, tag: str) -> str:
    """A prompt of exactly `count` tokens (the simulator's tokens are whitespace words)."""
    return " ".join(f"{tag}{i}" for i in range(count))


def sse_text(events: list[tuple[float, Any]]) -> str:
    return "".join(c["text"] for _, e in events if isinstance(e, dict) for c in e["choices"])


def start(argv: list[str], tmp: Path, env: dict[str, str] | None = None) -> Sim:
    """A simulator process running `argv` (plus --host 127.0.0.1 --port <free>), not waited for. Its
    NIXL side channel (if it has a KV connector) listens on 127.0.0.1 from a free port base unless
    `env` names VLLM_NIXL_SIDE_CHANNEL_PORT: engines of one test must not share a port."""
    port = free_port()
    log = tmp / f"sim-{port}.log"
    env = dict(env or {})
    if "VLLM_NIXL_SIDE_CHANNEL_PORT" not in env:
        env.setdefault("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(free_port_base())
    full_env = {**os.environ, "PYTHONPATH": PYTHONPATH, **env}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "kimik3_simulator", *expand(argv),
             "--host", "127.0.0.1", "--port", str(port)],
            env=full_env, stdout=out, stderr=subprocess.STDOUT)
    return Sim(f"http://127.0.0.1:{port}", process, log, env)


@contextmanager
def simulator(argv: list[str], tmp: Path, env: dict[str, str] | None = None, ready: bool = True) -> Iterator[Sim]:
    """A simulator process on a free loopback port, stopped after. Yielded once /health says 200, or
    with ready=False as soon as it answers at all."""
    sim = start(argv, tmp, env)
    process, log = sim.process, sim.log
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert process.poll() is None, f"the simulator exited with {process.returncode}:\n{log.read_text()}"
            try:
                if requests.get(sim.url + "/health", timeout=1).status_code == 200 or not ready:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, f"the simulator was not ready in {START_TIMEOUT}s:\n{log.read_text()}"
            time.sleep(0.05)
        yield sim
    finally:
        if process.poll() is None:
            sim.terminate()
