"""A scale-in keeps the lowest groups whatever their health (LeaderWorkerSet removes the highest
indexes): a failing group it keeps is restarted by the operator, not left failing
(reconcile/scale_in.py, issue 41 item 2).

The stand-in kubelet (e2e/harness/pod_runner.py) plays every leader pod with the engine simulator;
`freeze` stops a whole engine (SIGSTOP): its container runs, its readiness probe times out, and no
liveness probe restarts it, as for an engine stuck in the driver.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.harness.kube import apply, condition, delete_deployments, get_json, wait_for
from e2e.harness.pod_runner import PodRunner
from kimik3_operator.api.reasons import ENGINE_NOT_READY, GROUP_RESTARTED

from .conftest import REPORT
from .test_traffic import AGGREGATED_EXAMPLE, _engines, _example, _serve

pytestmark = pytest.mark.e2e

GROUP = "leaderworkerset.sigs.k8s.io/group-index"


@pytest.fixture(autouse=True)
def _free_the_gpus(namespace: str) -> Iterator[None]:
    yield
    delete_deployments(namespace)


def _degraded(namespace: str, name: str) -> dict[str, Any]:
    return condition(get_json("k3", name, "-n", namespace), "Degraded") or {}


def test_a_scale_in_restarts_a_hung_group_it_keeps(operator: Any, stager: Any, pod_runner: PodRunner,
                                                   namespace: str) -> None:
    """Three aggregated replicas; group 1's engine hangs whole, then the deployment scales to 2.
    LeaderWorkerSet removes group 2, the healthy one, and keeps the hung group: before, the role then
    served one replica of the two it asked for, for ever. Now the operator restarts group 1 (its leader
    pod deleted; the group recreated): both replicas serve again, status said so while it recovered,
    and a Normal event records the restart."""
    name = "k3-shrink"
    body = _example(AGGREGATED_EXAMPLE, namespace, name)
    role = body["spec"]["pools"][0]["aggregated"]
    role["replicas"] = 3
    _serve(pod_runner, namespace, body)
    engines = _engines(pod_runner, namespace, "aggregated", 3)
    victim = next(e for e in engines if e.labels.get(GROUP) == "1")
    pod_runner.freeze(victim)
    hung = wait_for("Degraded EngineNotReady naming the hung group", lambda: (
        d if (d := _degraded(namespace, name)).get("status") == "True" and victim.pod in d.get("message", "")
        and d.get("reason") == ENGINE_NOT_READY else None), timeout=60)
    role["replicas"] = 2
    started = time.monotonic()
    apply(body)
    said: list[str] = []

    def recovered() -> bool:
        d = _degraded(namespace, name)
        if "restarted for the scale-in to 2 replicas" in d.get("message", "") and d["message"] not in said:
            said.append(d["message"])
        cr = get_json("k3", name, "-n", namespace)
        running = pod_runner.running(namespace, "aggregated")
        return (d.get("status") == "False" and (cr.get("status") or {}).get("phase") == "Ready"
                and sorted(p.labels.get(GROUP) for p in running) == ["0", "1"]
                and all(p.uid != victim.uid for p in running))
    wait_for("group 1 restarted and both replicas Ready", recovered, timeout=240)
    took = time.monotonic() - started
    events = get_json("events", "-n", namespace, "--field-selector", f"involvedObject.name={name}")["items"]
    restarted = [e for e in events if e["reason"] == GROUP_RESTARTED]
    REPORT.append(f"scale-in 3 -> 2 with group 1 hung: restarted and Ready after {took:.0f} s; Degraded "
                  f"{hung['reason']} before; status said: {said[:1]}; events: {[e['message'] for e in restarted]}")
    assert said, "status never said that the scale-in restarted the hung group"
    assert len(restarted) == 1 and restarted[0]["type"] == "Normal" and victim.pod in restarted[0]["message"]
