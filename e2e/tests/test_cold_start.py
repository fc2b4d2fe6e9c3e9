"""The predicted cold start, end to end: the operator shows it per role in status, and a played
engine takes that long to answer its health check (compressed by the pod runner's start-up time
scale), at the storage speed the spec gives; so e2e rollouts and scale-ups take the modelled time."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e.harness.kube import apply, condition, delete_deployments, get_json, kubectl, wait_for
from e2e.harness.pod_runner import PodRunner, Proc

from .conftest import REPORT

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "manifests" / "examples" / "gb300-aggregated-tp8.yaml"
SLOW_STORAGE = "200M"
"""An object store through a FUSE mount, say: a GB300 TP8 pod's 0.79 TB take over an hour."""


@pytest.fixture(autouse=True)
def _free_the_gpus(namespace: str) -> Iterator[None]:
    yield
    delete_deployments(namespace)


def _healthy_at(engine: Proc, timeout: float) -> float:
    """time.monotonic() when the engine's /health first answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{engine.ip}:{engine.port}/health", timeout=2) as r:
                if r.status == 200:
                    return time.monotonic()
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"{engine.pod} did not answer /health within {timeout} s")


def test_an_engine_takes_its_predicted_cold_start_at_the_specs_storage_speed(
        operator: Path, namespace: str, pod_runner: PodRunner) -> None:
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"] = {"name": "k3-cold", "namespace": namespace}
    body["spec"]["model"]["readThroughput"] = SLOW_STORAGE
    body["spec"]["pools"][0]["aggregated"]["replicas"] = 1
    pod_runner.play(namespace)
    kubectl("-n", namespace, "create", "secret", "generic", "hf-token", "--from-literal=token=hf_e2e")
    apply(body)

    cold = wait_for("coldStart in status", lambda: next(
        (r.get("coldStart") for p in (get_json("k3", "k3-cold", "-n", namespace).get("status") or {}).get("pools", [])
         for r in p.get("roles", []) if r.get("coldStart")), None), timeout=120)
    assert cold["readSource"] == "spec" and cold["readBytesPerSecond"] == 200_000_000
    assert cold["loadSeconds"] == pytest.approx(cold["podReadBytes"] / 2e8, abs=1)
    modelled = cold["readySeconds"] - cold["imagePullSeconds"]  # the image is on the node before the process starts
    wall = modelled * pod_runner.cold_start_scale

    (engine,) = wait_for("the engine's process", lambda: (
        e if len(e := pod_runner.running(namespace, "aggregated")) == 1 else None), timeout=120)
    took = _healthy_at(engine, timeout=wall + 60) - engine.started
    logged = wait_for("the simulator's start-up line", lambda: re.search(
        r"start-up (\d+) s modelled \(([\d.]+) s\)", engine.log.read_text(errors="replace")), timeout=30)
    assert int(logged.group(1)) == modelled, logged.group(0)
    # Not before the prediction; after it by no more than the simulator's own start (imports, 2 CPUs).
    assert wall <= took <= wall + 15, (took, wall)
    wait_for("k3-cold Ready", lambda: (condition(get_json("k3", "k3-cold", "-n", namespace), "Ready") or {})
             .get("status") == "True", timeout=60)
    REPORT.append(f"cold start: GB300 TP8 pod reading {cold['podReadBytes'] / 1e12:.2f} TB at {SLOW_STORAGE}/s: "
                  f"predicted {cold['readySeconds']} s to Ready (first start {cold['firstReadySeconds']} s); "
                  f"the played engine answered after {took:.1f} s against {wall:.1f} s "
                  f"({modelled} s x {pod_runner.cold_start_scale})")
