"""Status semantics: conditions flip with stable reasons, transition times move only on a flip,
and the summary fields printer columns read."""

from __future__ import annotations

from typing import Any

from kimik3_operator.api import Condition, KimiK3Deployment
from kimik3_operator.api.reasons import (
    ALL_REPLICAS_READY,
    INSUFFICIENT_CAPACITY,
    INSUFFICIENT_MEMORY,
    PODS_NOT_READY,
    UPDATING,
)
from kimik3_operator.planner import PlanningError, plan_deployment, pool_facts
from kimik3_operator.reconcile.status import compute_status, set_condition
from kimik3_operator.render import Owner
from tests.support.cases import load_examples
from tests.support.nodes import b200_nodes, gb300_rack

OWNER = Owner(name="k3-pd", namespace="inference", uid="u")
T0, T1 = "2026-11-30T00:00:00Z", "2026-11-30T00:05:00Z"


def _plan():
    spec = KimiK3Deployment.model_validate(dict(load_examples())["pd-gb300-decode-b200-prefill.yaml"]).spec
    nodes = gb300_rack() + b200_nodes()
    return plan_deployment(spec, {p.name: pool_facts(p.node_selector, nodes) for p in spec.pools})


def _lws(ready: int, updated: int) -> dict[str, Any]:
    return {"status": {"readyReplicas": ready, "updatedReplicas": updated, "replicas": max(ready, updated)}}


def _cond(status, type_: str) -> Condition:
    return next(c for c in status.conditions if c.type == type_)


def test_set_condition_keeps_transition_time_until_status_flips() -> None:
    first = set_condition([], Condition(type="Ready", status="False", reason=PODS_NOT_READY, last_transition_time=T0))
    same = set_condition(first, Condition(type="Ready", status="False", reason=PODS_NOT_READY,
                                          message="1/2", last_transition_time=T1))
    assert same[0].last_transition_time == T0 and same[0].message == "1/2"
    flipped = set_condition(same, Condition(type="Ready", status="True", reason=ALL_REPLICAS_READY,
                                            last_transition_time=T1))
    assert flipped[0].last_transition_time == T1 and len(flipped) == 1


def test_pods_not_ready_then_ready() -> None:
    plan = _plan()
    empty = compute_status(owner=OWNER, generation=3, previous=None, plan=plan, error=None, workloads={}, now=T0)
    assert empty.phase == "Progressing" and empty.observed_generation == 3
    assert _cond(empty, "Ready").status == "False" and _cond(empty, "Ready").reason == PODS_NOT_READY
    assert empty.ready_summary == "0/3"
    assert empty.gpus == 16 + 2 * 8
    workloads = {"k3-pd-b200-prefill-prefill": _lws(1, 1), "k3-pd-gb300-decode-decode": _lws(2, 2)}
    ready = compute_status(owner=OWNER, generation=3, previous=empty, plan=plan, error=None,
                           workloads=workloads, now=T1)
    assert ready.phase == "Ready" and ready.ready_summary == "3/3"
    assert _cond(ready, "Ready").status == "True" and _cond(ready, "Ready").last_transition_time == T1
    assert _cond(ready, "Progressing").status == "False"
    again = compute_status(owner=OWNER, generation=3, previous=ready, plan=plan, error=None,
                           workloads=workloads, now="2026-11-30T01:00:00Z")
    assert again == ready  # nothing changed: the caller writes nothing


def test_rollout_in_progress_is_not_ready() -> None:
    workloads = {"k3-pd-b200-prefill-prefill": _lws(1, 1), "k3-pd-gb300-decode-decode": _lws(2, 1)}
    status = compute_status(owner=OWNER, generation=4, previous=None, plan=_plan(), error=None,
                            workloads=workloads, now=T0)
    assert _cond(status, "Ready").reason == PODS_NOT_READY
    assert "gb300-decode role decode: 2/2 ready, 1 updated" in _cond(status, "Ready").message


def test_resolved_facts_and_endpoint_are_visible() -> None:
    status = compute_status(owner=OWNER, generation=1, previous=None, plan=_plan(), error=None, workloads={}, now=T0)
    pools = {p.name: p for p in status.pools}
    assert pools["gb300-decode"].gpu_product == "GB300" and pools["gb300-decode"].interconnect == "NVLink"
    assert pools["b200-prefill"].interconnect == "RDMA"
    (decode,) = pools["gb300-decode"].roles
    assert (decode.tensor_parallel, decode.nodes_per_replica, decode.gpus_per_replica) == (8, 2, 8)
    assert status.endpoint == "http://k3-pd-gb300-decode-decode-leader.inference.svc:8000"


def test_planning_error_keeps_last_known_facts() -> None:
    good = compute_status(owner=OWNER, generation=1, previous=None, plan=_plan(), error=None, workloads={}, now=T0)
    bad = compute_status(owner=OWNER, generation=2, previous=good, plan=None,
                         error=PlanningError("PlanningNotImplemented", "pool x: parallelism not given"),
                         workloads={}, now=T1)
    assert bad.phase == "Failed" and bad.observed_generation == 2
    assert _cond(bad, "Ready").reason == "PlanningNotImplemented"
    assert _cond(bad, "Ready").last_transition_time == T0  # was already False
    assert bad.pools == good.pools and bad.endpoint == good.endpoint


def test_effective_engine_values_are_visible() -> None:
    status = compute_status(owner=OWNER, generation=1, previous=None, plan=_plan(), error=None, workloads={}, now=T0)
    assert status.engine is not None
    # 32768 is not a multiple of the 768-token block TP8 aligns to: the status shows what runs.
    assert status.engine.retention_policy == "Interval" and status.engine.retention_interval_tokens == 33024
    assert status.engine.requested_retention_interval_tokens == 32768 and status.engine.block_size == 768
    assert status.engine.speculative_method == "dspark" and status.engine.num_speculative_tokens == 7
    assert status.engine.compatibility_hash == _plan().compat_hash
    decode = next(r for p in status.pools for r in p.roles if r.role == "decode")
    assert decode.replicas_source == "spec" and decode.block_size == 768


def test_not_ready_for_lack_of_room_says_so() -> None:
    status = compute_status(owner=OWNER, generation=1, previous=None, plan=_plan(), error=None, workloads={},
                            now=T0, capacity=["pool gb300-decode role decode: 1 of 2 replicas do not fit now"])
    ready = _cond(status, "Ready")
    assert (ready.status, ready.reason) == ("False", INSUFFICIENT_CAPACITY)
    assert "1 of 2 replicas do not fit now" in ready.message
    ready_anyway = compute_status(owner=OWNER, generation=1, previous=None, plan=_plan(), error=None, now=T0,
                                  workloads={"k3-pd-b200-prefill-prefill": _lws(1, 1),
                                             "k3-pd-gb300-decode-decode": _lws(2, 2)}, capacity=["ignored"])
    assert _cond(ready_anyway, "Ready").status == "True"


def test_events_only_on_transitions() -> None:
    from kimik3_operator.reconcile.status import transitions

    owner = Owner(name="k3", namespace="ns", uid="u")
    plan = _plan()
    starting = compute_status(owner=owner, generation=1, previous=None, plan=plan, error=None,
                              workloads={}, now="t0")
    first = transitions(None, starting)
    assert [(t, r) for t, r, _ in first] == [("Normal", UPDATING), ("Normal", PODS_NOT_READY)]
    again = compute_status(owner=owner, generation=1, previous=starting, plan=plan, error=None, workloads={},
                           now="t1")
    assert transitions(starting, again) == []
    failed = compute_status(owner=owner, generation=2, previous=again, plan=None,
                            error=PlanningError(INSUFFICIENT_MEMORY, "no fit"), workloads={}, now="t2")
    kinds = {(t, r) for t, r, _ in transitions(again, failed)}
    assert ("Warning", INSUFFICIENT_MEMORY) in kinds and all(t == "Warning" for t, _ in kinds)
