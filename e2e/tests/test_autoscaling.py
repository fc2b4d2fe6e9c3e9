"""Autoscaled roles on the real cluster: the replica count is handed to the scaler without a reset,
the scaler's writes through /scale stand, the HPA is real (the API server validates it and the
controller-manager's HPA controller acts on it), and turning autoscaling off takes the count back."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest

from e2e.harness.kube import apply, condition, get_json, kubectl, wait_for
from kimik3_operator.contract.names import AUTOSCALER_FIELD_MANAGER, FIELD_MANAGER

from .conftest import REPORT
from .test_faults import gb300_deployment, wait_converged

pytestmark = pytest.mark.e2e

LWS = "k3as-gb300-aggregated"


def _owners_of_replicas(lws: dict[str, Any]) -> set[tuple[str, str]]:
    return {(e["manager"], e["operation"]) for e in lws["metadata"].get("managedFields") or []
            if "f:replicas" in ((e.get("fieldsV1") or {}).get("f:spec") or {})}


def _role_status(cr: dict[str, Any]) -> dict[str, Any]:
    (pool,) = cr["status"]["pools"]
    (role,) = pool["roles"]
    return role  # type: ignore[no-any-return]


def test_hpa_mode_hands_over_the_count_keeps_scale_writes_and_gives_it_back(operator: Any, namespace: str) -> None:
    body = gb300_deployment(namespace, "k3as", replicas=2)
    apply(body)
    wait_converged(namespace, "k3as")
    assert get_json("leaderworkerset", LWS, "-n", namespace)["spec"]["replicas"] == 2

    # Watch the count while the role becomes autoscaled: it must never drop to the default of 1.
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(get_json("leaderworkerset", LWS, "-n", namespace)["spec"].get("replicas", -1))
            time.sleep(0.1)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    scaled = copy.deepcopy(body)
    scaled["spec"]["pools"][0]["aggregated"]["autoscaling"] = {
        "minReplicas": 1, "maxReplicas": 3, "mode": "HPA", "metric": "RequestsInFlight", "target": 8}
    started = time.monotonic()
    apply(scaled)

    def handed_over() -> dict[str, Any] | None:
        lws = get_json("leaderworkerset", LWS, "-n", namespace, "--show-managed-fields")
        owners = _owners_of_replicas(lws)
        return lws if (AUTOSCALER_FIELD_MANAGER, "Apply") in owners and (FIELD_MANAGER, "Apply") not in owners \
            else None
    lws = wait_for("spec.replicas owned by the autoscaler's manager alone", handed_over, timeout=120)
    handover_seconds = time.monotonic() - started
    hpa = wait_for("the HorizontalPodAutoscaler", lambda: get_json(
        "hpa", "-n", namespace, "-l", "serving.kimik3.dev/deployment=k3as")["items"] or None)[0]
    time.sleep(1)
    stop.set()
    watcher.join(5)
    assert lws["spec"]["replicas"] == 2 and set(seen) == {2}, sorted(set(seen))
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "leaderworkerset.x-k8s.io/v1",
                                             "kind": "LeaderWorkerSet", "name": LWS}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 3)
    assert hpa["metadata"]["ownerReferences"][0]["name"] == "k3as"

    def role_autoscaled() -> dict[str, Any] | None:
        cr = get_json("k3", "k3as", "-n", namespace)
        role = _role_status(cr)
        return cr if (role.get("autoscaling") or {}).get("mode") == "HPA" else None
    cr = wait_for("status to show the role autoscaled", role_autoscaled, timeout=60)
    auto = _role_status(cr)["autoscaling"]
    assert auto["scaler"] == f"HorizontalPodAutoscaler/{LWS}" and auto["target"] == 8
    assert _role_status(cr)["replicas"] == 2

    # A write through /scale (what the HPA controller does) stands: the count is the scaler's now.
    kubectl("-n", namespace, "scale", "leaderworkerset", LWS, "--replicas=3")

    def three_ready() -> dict[str, Any] | None:
        cr = get_json("k3", "k3as", "-n", namespace)
        ready = condition(cr, "Ready") or {}
        return cr if cr["status"].get("readySummary") == "3/3" and ready.get("status") == "True" else None
    cr = wait_for("the deployment Ready at the scaler's 3 replicas", three_ready, timeout=180)
    assert _role_status(cr)["replicas"] == 3 and cr["status"]["gpus"] == 3 * 8
    time.sleep(25)  # two resyncs of 10 s: nothing takes the count back
    assert get_json("leaderworkerset", LWS, "-n", namespace)["spec"]["replicas"] == 3

    # Autoscaling off: the HPA goes and the spec's count is the operator's again.
    off_started = time.monotonic()
    apply(body)

    def restored() -> dict[str, Any] | None:
        lws = get_json("leaderworkerset", LWS, "-n", namespace, "--show-managed-fields")
        gone = not get_json("hpa", "-n", namespace)["items"]
        return lws if gone and lws["spec"]["replicas"] == 2 and (FIELD_MANAGER, "Apply") in _owners_of_replicas(lws) \
            else None
    wait_for("the spec's 2 replicas back and the HPA gone", restored, timeout=120)
    cr = wait_converged(namespace, "k3as")
    assert "autoscaling" not in _role_status(cr)
    REPORT.append(f"autoscaling HPA mode: count handed to the scaler in {handover_seconds:.1f} s with no reset "
                  f"(LeaderWorkerSet replicas seen: {sorted(set(seen))}); a /scale write to 3 stood and "
                  f"status followed it; autoscaling off gave back the spec's 2 in "
                  f"{time.monotonic() - off_started:.1f} s")
