"""Autoscaled roles in the reconcile pass (in-memory cluster): the count is handed over without a
reset, kept through the scaler's writes, taken back when autoscaling is off; the SLO scaler reads
Prometheus, scales in whole replicas, explains itself, and writes nothing while it holds."""

from __future__ import annotations

import copy
from typing import Any

from kimik3_operator.contract.names import AUTOSCALER_FIELD_MANAGER, FIELD_MANAGER
from kimik3_operator.reconcile.autoscaler import SloScaler
from kimik3_operator.reconcile.reconciler import Pass, reconcile
from tests.support.clocks import Clock, FakePrometheus
from tests.support.memory_cluster import NODES, MemoryCluster, pd_body, staged

DECODE = ("LeaderWorkerSet", "k3-gb300-decode")


def _autoscaled(decode: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body = pd_body()
    body["spec"]["pools"][0]["decode"]["autoscaling"] = decode or {"minReplicas": 1, "maxReplicas": 4, "target": 10}
    body["spec"]["slo"] = {"itlMilliseconds": 40, "ttftMilliseconds": 2000}
    body["spec"].update(spec)
    return body


def _owners(obj: dict[str, Any]) -> set[str]:
    return {e["manager"] for e in obj["metadata"]["managedFields"] if "f:replicas" in e["fieldsV1"].get("f:spec", {})}


def _scaler(prometheus: FakePrometheus, clock: Clock) -> SloScaler:
    scaler = SloScaler("http://prometheus:9090", clock=clock)
    scaler._clients["http://prometheus:9090"] = prometheus  # type: ignore[assignment]
    return scaler


def _serving(body: dict[str, Any]) -> tuple[Clock, FakePrometheus, SloScaler, MemoryCluster]:
    """`body` staged and applied with an SLO scaler, its decode role reporting 2 ready replicas."""
    clock, prometheus = Clock(), FakePrometheus()
    scaler = _scaler(prometheus, clock)
    cluster = staged(MemoryCluster(body, NODES))
    reconcile(Pass(cluster, "ns", "k3", scaler=scaler))
    cluster.report("LeaderWorkerSet", "k3-gb300-decode", 2)
    return clock, prometheus, scaler, cluster


def test_a_role_turning_autoscaled_keeps_its_count_and_hands_it_to_the_scaler() -> None:
    cluster = staged(MemoryCluster(pd_body(), NODES))
    reconcile(Pass(cluster, "ns", "k3"))
    assert cluster.objects[DECODE]["spec"]["replicas"] == 2 and _owners(cluster.objects[DECODE]) == {FIELD_MANAGER}
    cluster.deployment = {**_autoscaled({"minReplicas": 1, "maxReplicas": 4, "mode": "HPA"}),
                          "status": cluster.deployment["status"]}
    cluster.deployment["metadata"].update(uid="uid-1", generation=2)
    reconcile(Pass(cluster, "ns", "k3"))
    lws = cluster.objects[DECODE]
    assert lws["spec"]["replicas"] == 2  # never reset to the default of 1
    assert _owners(lws) == {AUTOSCALER_FIELD_MANAGER}
    assert ("HorizontalPodAutoscaler", "k3-gb300-decode") in cluster.objects
    # The HPA writes through /scale: it stands, and status counts it.
    cluster.scale("k3-gb300-decode", 3)
    cluster.report("LeaderWorkerSet", "k3-gb300-decode", 3)
    reconcile(Pass(cluster, "ns", "k3"))
    assert cluster.objects[DECODE]["spec"]["replicas"] == 3
    (decode,) = [r for p in cluster.deployment["status"]["pools"] for r in p["roles"] if r["role"] == "decode"]
    assert decode["replicas"] == 3 and decode["autoscaling"]["scaler"] == "HorizontalPodAutoscaler/k3-gb300-decode"
    # Off again: the spec's count is the operator's, and the HPA goes.
    cluster.deployment = {**pd_body(), "status": cluster.deployment["status"]}
    cluster.deployment["metadata"].update(uid="uid-1", generation=3)
    out = reconcile(Pass(cluster, "ns", "k3"))
    assert cluster.objects[DECODE]["spec"]["replicas"] == 2 and FIELD_MANAGER in _owners(cluster.objects[DECODE])
    assert "HorizontalPodAutoscaler/k3-gb300-decode" in out.deleted


def test_a_new_autoscaled_role_starts_at_its_planned_count() -> None:
    cluster = staged(MemoryCluster(_autoscaled({"minReplicas": 3, "maxReplicas": 4, "mode": "HPA"}), NODES))
    reconcile(Pass(cluster, "ns", "k3"))
    assert cluster.objects[DECODE]["spec"]["replicas"] == 3
    reconcile(Pass(cluster, "ns", "k3"))
    lws = cluster.objects[DECODE]
    assert lws["spec"]["replicas"] == 3 and AUTOSCALER_FIELD_MANAGER in _owners(lws)


def test_the_slo_scaler_scales_up_on_load_then_holds_without_writing() -> None:
    clock, prometheus, scaler, cluster = _serving(_autoscaled())
    prometheus.values = {"num_requests": 31.0, "inter_token_latency": 0.030, "time_to_first_token": 0.5,
                         "prompt_tokens": 100.0}
    clock.now += 15
    cluster.writes.clear()
    reconcile(Pass(cluster, "ns", "k3", scaler=scaler))
    assert cluster.objects[DECODE]["spec"]["replicas"] == 4  # 31 in flight at 10 per replica
    assert "replicas k3-gb300-decode 4" in cluster.writes and "event Normal ScaledUp" in cluster.writes
    assert any('kimik3_role="decode"' in q and "vllm:num_requests_running" in q for q in prometheus.queries)
    (decode,) = [r for p in cluster.deployment["status"]["pools"] for r in p["roles"] if r["role"] == "decode"]
    assert decode["replicas"] == 4 and decode["autoscaling"]["lastScale"].startswith("up 2 -> 4: RequestsInFlight 31")
    # Not due yet, then due with the same load while the new replicas start: no writes at all.
    cluster.report("LeaderWorkerSet", "k3-gb300-decode", 4, ready=2)
    reconcile(Pass(cluster, "ns", "k3", scaler=scaler))
    cluster.writes.clear()
    clock.now += 15
    reconcile(Pass(cluster, "ns", "k3", scaler=scaler))
    reconcile(Pass(cluster, "ns", "k3", scaler=scaler))
    assert cluster.writes == []


def test_a_rising_load_scales_up_a_predicted_cold_start_ahead_and_the_event_says_so() -> None:
    clock, prometheus, scaler, cluster = _serving(_autoscaled())
    (decode,) = [r for p in cluster.deployment["status"]["pools"] for r in p["roles"] if r["role"] == "decode"]
    lead = decode["coldStart"]["readySeconds"]
    # 15 in flight on 2 replicas of 10: enough now; rising so that one cold start from now it needs 3.
    prometheus.values = {"num_requests": 15.0, "inter_token_latency": 0.010, "time_to_first_token": 0.5,
                         "deriv": 8.0 / lead}
    clock.now += 15
    reconcile(Pass(cluster, "ns", "k3", scaler=scaler))
    assert cluster.objects[DECODE]["spec"]["replicas"] == 3
    trend = next(q for q in prometheus.queries if q.startswith("deriv("))
    span = -(-lead // 3)  # a third of the lead: longer than five 60 s windows
    assert "vllm:num_requests_running" in trend and f"[{span}s:15s]" in trend
    assert any(q.startswith("deriv(") and q.endswith(f" offset {span}s)") for q in prometheus.queries)
    (decode,) = [r for p in cluster.deployment["status"]["pools"] for r in p["roles"] if r["role"] == "decode"]
    assert decode["autoscaling"]["lastScale"].startswith("up 2 -> 3: RequestsInFlight 15 rising")
    assert f"reaches 23 in {lead} s, the predicted time to Ready" in decode["autoscaling"]["lastScale"]
    assert any("ScaledUp" in w for w in cluster.writes)


def test_the_slo_scaler_never_asks_beyond_the_pools_free_gpus() -> None:
    body = _autoscaled({"minReplicas": 1, "maxReplicas": 64, "target": 1}, router={"replicas": 0})
    clock, prometheus, scaler, cluster = _serving(body)
    prometheus.values = {"num_requests": 500.0}
    clock.now += 15
    reconcile(Pass(cluster, "ns", "k3", scaler=scaler))
    replicas = cluster.objects[DECODE]["spec"]["replicas"]
    assert 2 < replicas < 64  # as many 2-tray TP8 groups as the rack's trays hold
    assert "event Warning InsufficientCapacity" in cluster.writes
    # Asked again with the same load once those serve: it holds at what fits, warns no more,
    # and the status says it serves, short of its target.
    cluster.report("LeaderWorkerSet", "k3-gb300-decode", replicas)
    cluster.report("LeaderWorkerSet", "k3-b200-prefill", 1)
    reconcile(Pass(cluster, "ns", "k3", scaler=scaler))
    cluster.writes.clear()
    for _ in range(3):
        clock.now += 15
        reconcile(Pass(cluster, "ns", "k3", scaler=scaler))
    assert cluster.objects[DECODE]["spec"]["replicas"] == replicas
    assert cluster.writes == []
    status = cluster.deployment["status"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert status["phase"] == "Degraded" and conditions["Ready"]["status"] == "True"
    assert (conditions["Degraded"]["status"], conditions["Degraded"]["reason"]) == ("True", "InsufficientCapacity")
    assert f"the pool's free GPUs hold {replicas}" in conditions["Degraded"]["message"]


def test_without_metrics_the_slo_scaler_holds() -> None:
    clock, prometheus, scaler, cluster = _serving(_autoscaled())
    before = copy.deepcopy(cluster.objects[DECODE]["spec"])
    clock.now += 15
    reconcile(Pass(cluster, "ns", "k3", scaler=scaler))
    assert cluster.objects[DECODE]["spec"] == before


def test_the_slo_scaler_never_scales_into_the_one_prefill_one_decode_trap() -> None:
    body = _autoscaled({"minReplicas": 1, "maxReplicas": 4, "target": 10},
                       autoscaling={"scaleDownCooldownSeconds": 0})
    clock, prometheus, scaler, cluster = _serving(body)
    prometheus.values = {"num_requests": 0.0, "inter_token_latency": 0.010}
    clock.now += 15
    reconcile(Pass(cluster, "ns", "k3", scaler=scaler))
    assert cluster.objects[DECODE]["spec"]["replicas"] == 2  # 1 decode beside 1 prefill: vllm#52627
    accepted = _autoscaled({"minReplicas": 1, "maxReplicas": 4, "target": 10},
                           autoscaling={"scaleDownCooldownSeconds": 0},
                           experimental={"acceptKnownIssues": ["vllm#52627"]})
    cluster.deployment = {**accepted, "status": cluster.deployment["status"]}
    cluster.deployment["metadata"].update(uid="uid-1", generation=2)
    clock.now += 15
    reconcile(Pass(cluster, "ns", "k3", scaler=scaler))
    assert cluster.objects[DECODE]["spec"]["replicas"] == 1


def test_a_scaling_decision_is_written_at_once_whatever_the_status_pace() -> None:
    """The scaler's memory (since when a target is missed) lives in the status only: a pass in which
    it decided writes its status even within the pace of a status whose story is unchanged."""
    from kimik3_operator.reconcile.status_pace import StatusPace

    clock, prometheus, scaler, cluster = _serving(_autoscaled())
    cluster.report("LeaderWorkerSet", "k3-gb300-decode", 3, ready=3)
    reconcile(Pass(cluster, "ns", "k3"))
    pace = StatusPace(clock=lambda: 0.0)
    pace.wrote(("ns", "k3"))  # a status write just now, as far as the pace can tell
    # Inter-token latency over its 40 ms target at the load three replicas take: a breach begins,
    # nothing scales yet.
    prometheus.values = {"num_requests": 25.0, "inter_token_latency": 0.080, "time_to_first_token": 0.5,
                         "prompt_tokens": 100.0}
    clock.now += 15
    before = copy.deepcopy(cluster.deployment["status"])
    out = reconcile(Pass(cluster, "ns", "k3", scaler=scaler, pace=pace))
    assert cluster.objects[DECODE]["spec"]["replicas"] == 3 and out.phase == before["phase"]
    assert out.status_written and out.due is None  # the same story, written at once
    (decode,) = [r for p in cluster.deployment["status"]["pools"] for r in p["roles"] if r["role"] == "decode"]
    assert decode["autoscaling"]["breachSince"]
