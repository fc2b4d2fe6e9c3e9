"""Autoscaling from real metrics: the engines (the simulator, playing each leader pod) are scraped by
the cluster's Prometheus through file-based discovery, a bounded load goes through the rendered
router, and each mode moves the real LeaderWorkerSets: the operator's SLO scaler, KEDA's
ScaledObject (its operator and metrics API server on loopback), and an HPA on a pods metric that
prometheus-adapter serves, acted on by the controller-manager's HPA controller. Each test prints
its load and replica timeline."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest

from e2e.harness.kube import apply, condition, get_json, wait_for
from e2e.harness.load import Load
from e2e.harness.pod_runner import PodRunner
from e2e.harness.traffic import _ok, router_uids
from kimik3_operator.api.reasons import INSUFFICIENT_CAPACITY

from .conftest import REPORT
from .test_traffic import (
    AGGREGATED_EXAMPLE,
    PD_EXAMPLE,
    _example,
    _free_the_gpus,  # noqa: F401 - autouse: each test frees the fake GPUs it used
    _serve,
)

pytestmark = pytest.mark.e2e

FAST = {"intervalSeconds": 2, "windowSeconds": 10, "breachSeconds": 0, "scaleUpCooldownSeconds": 4,
        "scaleDownCooldownSeconds": 12}
"""Scaler settings for a test's minutes; the defaults (15 s, 60 s, 30 s, 60 s, 300 s) suit replicas
that load 1.6 TB."""


class Timeline:
    """Every LeaderWorkerSet of a namespace, sampled each second: (t, {name: (asked, ready)})."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.samples: list[tuple[float, dict[str, tuple[int, int]]]] = []
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(1)

    def sample(self) -> None:
        """One sample now (the thread takes one every second; a test adds one where a count may
        last under a second)."""
        items = get_json("leaderworkersets", "-n", self.namespace)["items"]
        self.samples.append((time.monotonic() - self.started, {
            o["metadata"]["name"]: (o["spec"].get("replicas", 0), (o.get("status") or {}).get("readyReplicas", 0))
            for o in items}))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.sample()

    def of(self, lws: str) -> list[tuple[float, int, int]]:
        return [(t, *s[lws]) for t, s in self.samples if lws in s]

    def changes(self, lws: str) -> str:
        """The asked count's changes, with when its replicas were all Ready: "2@0s 3@14s(ready 31s) ..."."""
        out, last = [], None
        series = self.of(lws)
        for i, (t, asked, _) in enumerate(series):
            if asked != last:
                ready_at = next((u for u, a, r in series[i:] if r >= asked or a != asked), None)
                out.append(f"{asked}@{t:.0f}s" + (f"(ready {ready_at:.0f}s)" if ready_at is not None else ""))
                last = asked
        return " ".join(out)

    def directions(self, lws: str) -> list[int]:
        """+1 / -1 per change of the asked count: more than one turn (up then down) is oscillation."""
        asked = [a for _, a, _ in self.of(lws)]
        return [1 if b > a else -1 for a, b in zip(asked, asked[1:], strict=False) if b != a]


def _router_url(runner: PodRunner, namespace: str) -> str | None:
    for proc in reversed(runner.running(namespace, "router")):
        if _ok(f"{proc.url}/readiness"):
            return proc.url
    return None


def _routers_ready(runner: PodRunner, namespace: str) -> set[str]:
    """Once a router answers its readiness (the load counts every moment without one): the router
    pods' uids, which scaling must leave as they are."""
    wait_for("a ready router", lambda: _router_url(runner, namespace), timeout=60)
    return router_uids(namespace)


def _asked(namespace: str, lws: str) -> int:
    return int(get_json("leaderworkerset", lws, "-n", namespace)["spec"]["replicas"])


def _group_pods(namespace: str, lws: str) -> dict[str, int]:
    """Pods per group index of a LeaderWorkerSet: whole groups have every pod."""
    groups: dict[str, int] = {}
    for pod in get_json("pods", "-n", namespace, "-l", f"leaderworkerset.sigs.k8s.io/name={lws}")["items"]:
        index = pod["metadata"]["labels"].get("leaderworkerset.sigs.k8s.io/group-index", "?")
        groups[index] = groups.get(index, 0) + 1
    return groups


def test_slo_scaler_scales_decode_and_prefill_under_load_within_free_gpus_and_back(
        operator: Any, stager: Any, pod_runner: PodRunner, namespace: str) -> None:
    body = _example(PD_EXAMPLE, namespace, "k3-slo")
    pools = {p["name"]: p for p in body["spec"]["pools"]}
    # Decode follows requests in flight (4 per replica), prefill prompt tokens per second (400 per
    # replica: more than the B200 pool's 4 nodes hold at 2 nodes per replica, so it is capped there).
    pools["gb300-decode"]["decode"]["autoscaling"] = {"minReplicas": 2, "maxReplicas": 4, "target": 4}
    pools["b200-prefill"]["prefill"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 4, "target": 400}
    body["spec"]["slo"] = {"ttftMilliseconds": 3000, "itlMilliseconds": 100}
    body["spec"]["autoscaling"] = FAST
    _serve(pod_runner, namespace, body)
    decode, prefill = "k3-slo-gb300-decode-decode", "k3-slo-b200-prefill-prefill"
    routers = _routers_ready(pod_runner, namespace)
    timeline = Timeline(namespace)
    # 14 in flight: the decode engines see ~12-15 of them (the rest wait on the capped prefill), so
    # 4 replicas are wanted and 3 (under 80% of 12, 9.6) are not; at 12 the decode count sat on that
    # line (9.5 one decision, 12.1 the next), and a scaler that acted on one calm reading went
    # 4 -> 3 -> 4 (it now waits for a calm scaleDownCooldownSeconds long: planner/slo_scaler.py).
    load = Load(lambda: _router_url(pod_runner, namespace), concurrency=14, max_requests=2000, max_seconds=150,
                input_words=512, output_tokens=256).start()
    try:
        wait_for("decode scaled up by the SLO scaler", lambda: _asked(namespace, decode) > 2, timeout=120)
        wait_for("prefill scaled up to what the B200 pool holds", lambda: _asked(namespace, prefill) == 2,
                 timeout=120)

        def held_back() -> dict[str, Any] | None:
            cr = get_json("k3", "k3-slo", "-n", namespace)
            degraded = condition(cr, "Degraded") or {}
            return cr if degraded.get("reason") == INSUFFICIENT_CAPACITY and "prefill" in degraded["message"] else None
        cr = wait_for("InsufficientCapacity for the prefill role", held_back, timeout=120)
        message = (condition(cr, "Degraded") or {})["message"]
        time.sleep(10)  # five more decisions under the same load: no unschedulable groups, no thrash
        assert _asked(namespace, prefill) == 2
        stuck = [p["metadata"]["name"] for p in get_json("pods", "-n", namespace)["items"]
                 for c in p["status"].get("conditions") or []
                 if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"]
        assert not stuck, stuck
        wait_for("the new decode replicas Ready", lambda: (get_json("leaderworkerset", decode, "-n", namespace)
                                                           .get("status") or {}).get("readyReplicas", 0)
                 == _asked(namespace, decode), timeout=120)
        peak = {decode: _asked(namespace, decode), prefill: _asked(namespace, prefill)}
    finally:
        load.stop()
    stopped = time.monotonic() - timeline.started
    wait_for("decode back at minReplicas after the cooldown", lambda: _asked(namespace, decode) == 2, timeout=180)
    wait_for("prefill back at minReplicas", lambda: _asked(namespace, prefill) == 1, timeout=180)
    timeline.stop()
    for lws in (decode, prefill):
        # The LeaderWorkerSet controller deletes a removed group's pods one by one: wait for it to finish.
        wait_for(f"{lws}: whole groups only", lambda lws=lws: sorted(_group_pods(namespace, lws).values())
                 == [2] * _asked(namespace, lws), timeout=60)
        turns = timeline.directions(lws)
        assert turns == sorted(turns, reverse=True), f"{lws} oscillated: {timeline.changes(lws)}"
    cr = get_json("k3", "k3-slo", "-n", namespace)
    scaled = [r["autoscaling"] for p in cr["status"]["pools"] for r in p["roles"]]
    assert all(a["scaler"] == "operator" and a["lastScale"] for a in scaled), scaled
    # Scaling by the SLO scaler loses no request and restarts no router (issue 21).
    assert not load.failed(), load.summary()
    assert router_uids(namespace) == routers
    REPORT.append(f"autoscaling SLO mode: load {load.summary()} (14 in flight, 512-word prompts, 256 tokens), "
                  f"stopped at {stopped:.0f} s; decode {timeline.changes(decode)}; "
                  f"prefill {timeline.changes(prefill)}; "
                  f"peak {peak}; capped: {message}")


def _scaled_once(mode: str, operator: Any, pod_runner: PodRunner, namespace: str, name: str) -> str:
    """An aggregated deployment of 2 replicas scales to 3 from requests in flight (2 per replica) in
    `mode`, then autoscaling goes off and the spec's 2 come back. Returns the timeline."""
    body = _example(AGGREGATED_EXAMPLE, namespace, name)
    scaled = copy.deepcopy(body)
    scaled["spec"]["pools"][0]["aggregated"]["autoscaling"] = {
        "minReplicas": 2, "maxReplicas": 3, "mode": mode, "metric": "RequestsInFlight", "target": 2}
    scaled["spec"]["autoscaling"] = FAST
    _serve(pod_runner, namespace, scaled)
    lws = f"{name}-{scaled['spec']['pools'][0]['name']}-aggregated"
    routers = _routers_ready(pod_runner, namespace)
    timeline = Timeline(namespace)
    load = Load(lambda: _router_url(pod_runner, namespace), concurrency=8, max_requests=1500, max_seconds=120,
                input_words=256, output_tokens=256).start()
    try:
        wait_for(f"{mode} scaling {lws} to 3", lambda: _asked(namespace, lws) == 3, timeout=110)
        timeline.sample()
    finally:
        load.stop()
    apply(body)  # autoscaling off: the spec's count is the operator's again, the scaler goes
    wait_for("the spec's 2 replicas back", lambda: _asked(namespace, lws) == 2, timeout=120)
    kind = "scaledobjects" if mode == "KEDA" else "hpa"
    selector = f"serving.kimik3.dev/deployment={name}"
    wait_for(f"the {kind} pruned", lambda: not get_json(kind, "-n", namespace, "-l", selector)["items"], timeout=60)
    timeline.stop()
    assert timeline.directions(lws)[:1] == [1], timeline.changes(lws)
    assert not load.failed(), load.summary()
    assert router_uids(namespace) == routers
    return f"{load.summary()}; {lws} {timeline.changes(lws)}"


def test_keda_scales_a_role_once_from_a_prometheus_metric(
        operator: Any, stager: Any, pod_runner: PodRunner, namespace: str) -> None:
    line = _scaled_once("KEDA", operator, pod_runner, namespace, "k3-keda")
    REPORT.append(f"autoscaling KEDA mode (ScaledObject, Prometheus trigger): {line}")


def test_hpa_scales_a_role_once_from_a_pods_metric_of_prometheus_adapter(
        operator: Any, stager: Any, pod_runner: PodRunner, namespace: str) -> None:
    line = _scaled_once("HPA", operator, pod_runner, namespace, "k3-hpa")
    REPORT.append(f"autoscaling HPA mode (pods metric vllm_requests_in_flight via prometheus-adapter): {line}")


def test_slo_scaler_adds_a_decode_replica_when_itl_p90_stays_over_target(
        operator: Any, stager: Any, pod_runner: PodRunner, namespace: str) -> None:
    """Latency, not load: the load target is out of reach (1000 in flight per replica), the ITL
    target (20 ms) is not met by the simulated engines under load (their gaps fall in vLLM's
    10-25 ms bucket, whose p90 Prometheus interpolates to 23.5 ms): after breachSeconds the scaler
    adds a replica, and says why."""
    body = _example(PD_EXAMPLE, namespace, "k3-itl")
    pools = {p["name"]: p for p in body["spec"]["pools"]}
    pools["gb300-decode"]["decode"]["autoscaling"] = {"minReplicas": 2, "maxReplicas": 3, "target": 1000}
    body["spec"]["slo"] = {"itlMilliseconds": 20}
    body["spec"]["autoscaling"] = {**FAST, "breachSeconds": 4}
    _serve(pod_runner, namespace, body)
    decode = "k3-itl-gb300-decode-decode"
    routers = _routers_ready(pod_runner, namespace)
    timeline = Timeline(namespace)
    load = Load(lambda: _router_url(pod_runner, namespace), concurrency=6, max_requests=1000, max_seconds=100,
                input_words=256, output_tokens=256).start()

    def role() -> dict[str, Any]:
        cr = get_json("k3", "k3-itl", "-n", namespace)
        return next(r for p in cr["status"]["pools"] for r in p["roles"] if r["role"] == "decode")
    try:
        breach = wait_for("the ITL breach seen", lambda: role()["autoscaling"].get("breachSince"), timeout=90)
        wait_for("a decode replica added for it", lambda: _asked(namespace, decode) == 3, timeout=60)
        # The scale is written before the status that says why: wait for that status too.
        scaled = wait_for("the scale recorded in status",
                          lambda: (a := role()["autoscaling"]).get("lastScale") and a, timeout=30)
        wait_for("the new decode replica Ready", lambda: (get_json("leaderworkerset", decode, "-n", namespace)
                                                          .get("status") or {}).get("readyReplicas", 0) == 3,
                 timeout=120)
        ready_after = time.time()
        time.sleep(6)  # at maxReplicas: the breach goes on, the count stays
        assert _asked(namespace, decode) == 3
    finally:
        load.stop()
    timeline.stop()
    assert not load.failed(), load.summary()
    assert router_uids(namespace) == routers
    assert scaled["lastScale"].startswith("up 2 -> 3: itl p90 "), scaled
    assert "> 20 ms for" in scaled["lastScale"]
    since = _epoch(breach)
    REPORT.append(f"autoscaling SLO mode, latency: load {load.summary()}; ITL p90 over 20 ms from {breach}; "
                  f"decided {_epoch(scaled['lastScaleTime']) - since:.0f} s later ({scaled['lastScale']}); "
                  f"the new replica Ready {ready_after - since:.0f} s after the breach began; "
                  f"decode {timeline.changes(decode)}")


def _epoch(stamp: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
