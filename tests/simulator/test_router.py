"""The real vllm-router (scripts/router-venv.sh's) in vLLM P/D mode in front of a prefill and a
decode simulator of golden b200-dep16-disaggregated (TP8 x DP2 each, the pod env's
VLLM_USE_RUST_FRONTEND=1), with --prefill-policy cache_aware, all on loopback.

What it shows: the router expands each engine into one worker per data-parallel rank (from the
`engine` labels of /metrics) and pins requests with X-data-parallel-rank, which the simulator
honours; completions go prefill -> decode with the KV hand-off; and prefix-aware routing needs
token ids, which the router asks `{route}/render` for and, only on a 404/405/501, /tokenize. The
command without --enable-scale-out gets 403 from render, as vLLM 0.33.0's Rust frontend
answers, so every decision is `missing_tokens`; with --enable-scale-out the Rust frontend answers
501, the router tokenizes, and a repeated prompt is a `prefix_hit` on the rank holding its blocks.

Skipped when scripts/router-venv.sh is missing (it installs the pinned vllm-router). Each run is
bounded (router startup 30 s, every request 30 s) and stops every process it started.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from kimik3_operator.render.router import ROUTER_LOG_FILTER

from .sims import ROOT, Sim, free_port, role_report, simulator, words

SCENARIO = "b200-dep16-disaggregated"
ROUTER_VENV = ROOT / "scripts" / "router-venv.sh"
STARTUP_SECONDS = 30
"""--worker-startup-timeout-secs: the router exits if the engines are not healthy by then."""


@pytest.fixture(scope="module")
def router_binary() -> Path:
    if not ROUTER_VENV.exists():
        pytest.skip(f"{ROUTER_VENV.relative_to(ROOT)} is missing: no pinned vllm-router to start")
    venv = subprocess.run([str(ROUTER_VENV)], capture_output=True, text=True, timeout=900)
    assert venv.returncode == 0, f"{ROUTER_VENV.name} failed:\n{venv.stderr[-3000:]}"
    lines = venv.stdout.strip().splitlines()
    assert lines, f"{ROUTER_VENV.name} printed no venv path"
    binary = Path(lines[-1]) / "bin" / "vllm-router"
    assert binary.exists(), f"{ROUTER_VENV.name} printed {lines[-1]}, which has no bin/vllm-router"
    return binary


@contextmanager
def router(binary: Path, prefill: Sim, decode: Sim, tmp: Path,
           policies: tuple[str, str] = ("cache_aware", "round_robin"),
           rust_log: str | None = None) -> Iterator[tuple[str, str, Path]]:
    """A P/D vllm-router on free loopback ports, ready; yields (its URL, its metrics URL, its log).
    With `rust_log` it logs as RUST_LOG says (at --log-level's default, info), else at warning."""
    port, metrics_port = free_port(), free_port()
    log = tmp / f"router-{port}.log"
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "RUST_LOG")}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(binary), "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
             "--prometheus-port", str(metrics_port), "--vllm-pd-disaggregation", "--kv-connector", "nixl",
             "--prefill", prefill.url, "none", "--decode", decode.url,
             "--prefill-policy", policies[0], "--decode-policy", policies[1],
             "--worker-startup-check-interval", "1", "--worker-startup-timeout-secs", str(STARTUP_SECONDS),
             "--request-timeout-secs", "30", *(["--log-level", "warning"] if rust_log is None else [])],
            env=env if rust_log is None else {**env, "RUST_LOG": rust_log}, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS + 5
        while True:
            assert process.poll() is None, f"vllm-router exited with {process.returncode}:\n{log.read_text()[-3000:]}"
            try:
                if requests.get(url + "/readiness", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, f"vllm-router not ready in time:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        yield url, f"http://127.0.0.1:{metrics_port}/metrics", log
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # its own session: the launcher and anything it forked
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)


def decisions(metrics_url: str) -> dict[str, float]:
    """vllm_router_prefix_routing_decisions_total of the prefill stage, by outcome."""
    text = requests.get(metrics_url, timeout=5).text
    return {s.labels["outcome"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "vllm_router_prefix_routing_decisions_total" and s.labels.get("stage") == "prefill"}


def records(sim: Sim) -> list[dict[str, Any]]:
    """The simulator's finished requests, oldest first."""
    return list(sim.stats()["by_request_id"].values())


def engines(tmp: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """The scenario's prefill and decode reports (their commands) and the simulators' environment."""
    prefill = role_report(SCENARIO, "prefill", scale_out=False)
    decode = role_report(SCENARIO, "decode", scale_out=False)
    env = {"K3SIM_GPU_PRODUCT": prefill["gpuProduct"], "K3SIM_TIME_SCALE": "0.05",
           "VLLM_USE_RUST_FRONTEND": prefill["env"]["VLLM_USE_RUST_FRONTEND"]}
    return prefill, decode, env


@pytest.mark.parametrize("scale_out", [False, True], ids=["without-scale-out", "enable-scale-out"])
def test_a_repeated_prompt_routes_by_prefix_only_when_the_engines_give_token_ids(
        router_binary: Path, scale_out: bool, tmp_path: Path) -> None:
    prefill, decode, env = engines(tmp_path)
    flag = ["--enable-scale-out"] if scale_out else []
    with simulator([*prefill["command"], *flag], tmp_path, env) as p, \
            simulator([*decode["command"], *flag], tmp_path, env) as d, \
            router(router_binary, p, d, tmp_path) as (url, metrics_url, _):
        prompt = words(3000, "shared")
        for _ in range(3):
            answer = requests.post(url + "/v1/completions", json={"model": "kimi-k3", "prompt": prompt,
                                                                  "max_tokens": 4}, timeout=30)
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["prompt_tokens"] == 3000
        outcomes = decisions(metrics_url)
        prefilled, decoded = records(p), records(d)

    # every completion went prefill -> decode with the hand-off, under the router's request id
    assert [r["path"] for r in prefilled] == ["prefill_for_remote_decode"] * 3
    assert [r["path"] for r in decoded] == ["remote_prefill"] * 3
    assert [r["request_id"] for r in prefilled] == [r["request_id"] for r in decoded]
    assert all(r["request_id"].startswith(f"___prefill_addr_{p.url[7:]}___decode_addr_{d.url[7:]}_")
               for r in prefilled)
    # round robin over decode@0, decode@1 pinned by X-data-parallel-rank (idle, the engine alone picks 0)
    assert [r["rank"] for r in decoded] == [0, 1, 0]
    if scale_out:
        assert outcomes == {"prefix_miss": 1, "prefix_hit": 2}
        # the hits went to the rank holding the prompt's blocks, and the engine's cache agrees
        assert len({r["rank"] for r in prefilled}) == 1
        assert prefilled[0]["local_cache_hit_tokens"] == 0
        assert all(r["local_cache_hit_tokens"] > 0 for r in prefilled[1:])
    else:
        assert outcomes == {"missing_tokens": 3}


SESSION = "alice@example.com-7f3c"
"""A session key as a client sends it (x-session-id); a user id is as likely (x-user-id)."""


@pytest.mark.parametrize(("rust_log", "logged"), [(ROUTER_LOG_FILTER, False), ("vllm_router_rs=info", True)],
                         ids=["rendered-filter", "router-default"])
def test_the_router_pods_log_filter_keeps_session_keys_out_of_the_log(
        router_binary: Path, tmp_path: Path, rust_log: str, logged: bool) -> None:
    """consistent_hash logs each request's key at info; the router pods' RUST_LOG (render/router.py)
    keeps it out and the router's other info lines in. The router's own default, the second case,
    shows the key is there to hide."""
    prefill, decode, env = engines(tmp_path)
    with simulator(prefill["command"], tmp_path, env) as p, simulator(decode["command"], tmp_path, env) as d, \
            router(router_binary, p, d, tmp_path, ("consistent_hash", "consistent_hash"), rust_log) as (url, _, log):
        for _ in range(2):
            answer = requests.post(url + "/v1/completions", headers={"x-session-id": SESSION},
                                   json={"model": "kimi-k3", "prompt": words(50, "s"), "max_tokens": 2}, timeout=30)
            assert answer.status_code == 200, answer.text
        assert [r["path"] for r in records(d)] == ["remote_prefill"] * 2  # routed, by the key
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text())  # its colours
    assert (SESSION in text) is logged, text[-3000:]
    assert "INFO vllm_router_rs::routers::http::vllm_pd_router" in text, text[-3000:]  # still logs at info
