"""Status semantics: conditions flip with stable reasons, transition times move only on a flip,
and the summary fields printer columns read."""

from __future__ import annotations

from typing import Any

from kimik3_operator.api import Condition, KimiK3Deployment, RoleStatus
from kimik3_operator.api.reasons import (
    ALL_REPLICAS_READY,
    INSUFFICIENT_CAPACITY,
    INSUFFICIENT_MEMORY,
    PODS_NOT_READY,
    ROUTER_NOT_READY,
)
from kimik3_operator.planner import PlanningError, plan_deployment, pool_facts
from kimik3_operator.reconcile.status import compute_status, set_condition
from kimik3_operator.render import Owner, RoleEndpoints
from tests.support.cases import load_examples
from tests.support.nodes import b200_nodes, gb300_rack

OWNER = Owner(name="k3-pd", namespace="inference", uid="u")
T0, T1 = "2026-11-30T00:00:00Z", "2026-11-30T00:05:00Z"


def _plan(body: dict[str, Any] | None = None):
    spec = KimiK3Deployment.model_validate(body or dict(load_examples())["pd-gb300-decode-b200-prefill.yaml"]).spec
    nodes = gb300_rack() + b200_nodes()
    return plan_deployment(spec, {p.name: pool_facts(p.node_selector, nodes) for p in spec.pools})


def _lws(ready: int, updated: int) -> dict[str, Any]:
    return {"status": {"readyReplicas": ready, "updatedReplicas": updated, "replicas": max(ready, updated)}}


ALL_READY = {"k3-pd-b200-prefill-prefill": _lws(1, 1), "k3-pd-gb300-decode-decode": _lws(2, 2)}
H = _plan().compat_hash
ROUTER = f"k3-pd-router-{H[:10]}"
"""The P/D router Deployment of the plan's own revision."""
ENDPOINTS = (RoleEndpoints("b200-prefill", "prefill", ("10.0.0.1",), H),
             RoleEndpoints("gb300-decode", "decode", ("10.0.1.1", "10.0.1.2"), H))


def _router(ready: int, updated: int | None = None, generation: int = 1, observed: int = 1) -> dict[str, Any]:
    """A live router Deployment with 2 desired replicas."""
    updated = ready if updated is None else updated
    return {"metadata": {"generation": generation},
            "status": {"observedGeneration": observed, "replicas": max(ready, updated),
                       "readyReplicas": ready, "updatedReplicas": updated}}


SERVING = {"workloads": ALL_READY, "endpoints": ENDPOINTS, "pairs": {H: 1}, "routers": {ROUTER: _router(2)}}
"""Every engine and the router ready."""


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
    ready = compute_status(owner=OWNER, generation=3, previous=empty, plan=plan, error=None, now=T1, **SERVING)
    assert ready.phase == "Ready" and ready.ready_summary == "3/3"
    assert _cond(ready, "Ready").status == "True" and _cond(ready, "Ready").last_transition_time == T1
    assert _cond(ready, "Progressing").status == "False"
    again = compute_status(owner=OWNER, generation=3, previous=ready, plan=plan, error=None,
                           now="2026-11-30T01:00:00Z", **SERVING)
    assert again == ready  # nothing changed: the caller writes nothing


def test_rollout_in_progress_is_not_ready() -> None:
    workloads = {"k3-pd-b200-prefill-prefill": _lws(1, 1), "k3-pd-gb300-decode-decode": _lws(2, 1)}
    status = compute_status(owner=OWNER, generation=4, previous=None, plan=_plan(), error=None,
                            workloads=workloads, now=T0)
    assert _cond(status, "Ready").reason == PODS_NOT_READY
    assert "gb300-decode role decode: 2/2 ready, 1 updated" in _cond(status, "Ready").message


def _decode(spec: int, groups: int, ready: int, updated: int, generation: int = 1,
            observed: int = 1) -> dict[str, Any]:
    """The decode role's LeaderWorkerSet (2 planned) as its controller reports it."""
    return {"metadata": {"generation": generation}, "spec": {"replicas": spec},
            "status": {"replicas": groups, "readyReplicas": ready, "updatedReplicas": updated,
                       "observedGeneration": observed}}


def _with_decode(decode: dict[str, Any]) -> dict[str, Any]:
    return {**SERVING, "workloads": {**ALL_READY, "k3-pd-gb300-decode-decode": decode}}


def _decode_status(status) -> RoleStatus:
    return next(r for p in status.pools for r in p.roles if r.role == "decode")


def test_counts_are_the_workloads_own_and_only_the_planned_count_everywhere_is_ready() -> None:
    plan = _plan()
    exact = compute_status(owner=OWNER, generation=1, previous=None, plan=plan, error=None, now=T0,
                           **_with_decode(_decode(spec=2, groups=2, ready=2, updated=2, generation=7, observed=7)))
    assert exact.phase == "Ready" and exact.ready_summary == "3/3"
    cases = {
        # scaled through /scale and not taken back yet: three groups run, the plan has two
        "3/2 ready, 3 updated, spec.replicas 3, planned 2, 3 groups running": _decode(spec=3, groups=3, ready=3,
                                                                                     updated=3),
        # taken back, the third group still running
        "3/2 ready, 3 updated, 3 groups running": _decode(spec=2, groups=3, ready=3, updated=3),
        # a surge during a rollout: the counts alone would pass
        "2/2 ready, 2 updated, 3 groups running": _decode(spec=2, groups=3, ready=2, updated=2),
        # counts of the generation before the operator's last apply
        "2/2 ready, 2 updated, generation 8 not observed yet": _decode(spec=2, groups=2, ready=2, updated=2,
                                                                      generation=8, observed=7),
        # scaled down: fewer run than planned
        "1/2 ready, 1 updated, spec.replicas 1, planned 2": _decode(spec=1, groups=1, ready=1, updated=1),
    }
    for says, decode in cases.items():
        status = compute_status(owner=OWNER, generation=1, previous=exact, plan=plan, error=None, now=T1,
                                **_with_decode(decode))
        assert status.phase == "Progressing" and _cond(status, "Ready").reason == PODS_NOT_READY, says
        assert f"pool gb300-decode role decode: {says}" in _cond(status, "Ready").message
        role = _decode_status(status)
        assert (role.replicas, role.ready_replicas, role.updated_replicas) == (
            2, decode["status"]["readyReplicas"], decode["status"]["updatedReplicas"])
        assert status.ready_summary == f"{1 + role.ready_replicas}/3"


def test_resolved_facts_and_endpoint_are_visible() -> None:
    status = compute_status(owner=OWNER, generation=1, previous=None, plan=_plan(), error=None, workloads={}, now=T0)
    pools = {p.name: p for p in status.pools}
    assert pools["gb300-decode"].gpu_product == "GB300" and pools["gb300-decode"].interconnect == "NVLink"
    assert pools["b200-prefill"].interconnect == "RDMA"
    (decode,) = pools["gb300-decode"].roles
    assert (decode.tensor_parallel, decode.nodes_per_replica, decode.gpus_per_replica) == (8, 2, 8)
    assert status.endpoint == "http://k3-pd-router.inference.svc:8000"
    assert decode.endpoint == "http://k3-pd-gb300-decode-decode-leader.inference.svc:8000"
    assert status.routing is None


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
    # All-Blackwell pools default to fp8 KV, where TP8 aligns blocks to 1536 tokens; 32768 is not a
    # multiple of it: the status shows what runs (21 x 1536) and the dtype chosen.
    assert status.engine.kv_cache_dtype == "fp8"
    assert status.engine.retention_policy == "Interval" and status.engine.retention_interval_tokens == 32256
    assert status.engine.requested_retention_interval_tokens == 32768 and status.engine.block_size == 1536
    assert status.engine.speculative_method == "dspark" and status.engine.num_speculative_tokens == 7
    assert status.engine.compatibility_hash == _plan().compat_hash
    decode = next(r for p in status.pools for r in p.roles if r.role == "decode")
    assert decode.replicas_source == "spec" and decode.block_size == 1536
    # DSpark's 7 drafts: the decode graph covers 8 tokens per sequence, and so does its token budget.
    assert decode.max_num_batched_tokens == decode.max_cudagraph_capture_size >= 8 * (decode.max_num_seqs or 0) > 0


def test_not_ready_for_lack_of_room_says_so() -> None:
    status = compute_status(owner=OWNER, generation=1, previous=None, plan=_plan(), error=None, workloads={},
                            now=T0, capacity=["pool gb300-decode role decode: 1 of 2 replicas do not fit now"])
    ready = _cond(status, "Ready")
    assert (ready.status, ready.reason) == ("False", INSUFFICIENT_CAPACITY)
    assert "1 of 2 replicas do not fit now" in ready.message
    ready_anyway = compute_status(owner=OWNER, generation=1, previous=None, plan=_plan(), error=None, now=T0,
                                  capacity=["ignored"], **SERVING)
    assert _cond(ready_anyway, "Ready").status == "True"


def test_events_only_on_transitions() -> None:
    from kimik3_operator.reconcile.status import transitions

    owner = Owner(name="k3", namespace="ns", uid="u")
    plan = _plan()
    starting = compute_status(owner=owner, generation=1, previous=None, plan=plan, error=None,
                              workloads={}, now="t0")
    first = transitions(None, starting)
    assert [(t, r) for t, r, _ in first] == [("Normal", PODS_NOT_READY)]  # not also Progressing=True Updating
    again = compute_status(owner=owner, generation=1, previous=starting, plan=plan, error=None, workloads={},
                           now="t1")
    assert transitions(starting, again) == []
    failed = compute_status(owner=owner, generation=2, previous=again, plan=None,
                            error=PlanningError(INSUFFICIENT_MEMORY, "no fit"), workloads={}, now="t2")
    assert [(t, r) for t, r, _ in transitions(again, failed)] == [("Warning", INSUFFICIENT_MEMORY)]
    assert transitions(failed, again)[0][:2] == ("Normal", PODS_NOT_READY)  # Ready's change tells the recovery


def test_the_router_reports_its_lists_and_readiness() -> None:
    status = compute_status(owner=OWNER, generation=1, previous=None, plan=_plan(), error=None, now=T0, **SERVING)
    (router,) = status.routers
    assert router.model_dump(exclude_none=True) == {
        "name": ROUTER, "service": "k3-pd-router", "mode": "PrefillDecode",
        "endpoint": "http://k3-pd-router.inference.svc:8000",
        "prefill_policy": "CacheAware", "decode_policy": "CacheAware",
        "replicas": 2, "ready_replicas": 2, "compatibility_hash": H, "prefill_workers": 1, "decode_workers": 2}
    assert status.routable_capacity_percent == 100


def test_routable_capacity_counts_every_revision_with_a_pair() -> None:
    """During a rollout the old pairs and the new ones both serve: capacity is their sum per role."""
    old = (RoleEndpoints("b200-prefill", "prefill", ("10.0.0.9",), "old"),
           RoleEndpoints("gb300-decode", "decode", ("10.0.1.8", "10.0.1.9"), "old"))
    new = (RoleEndpoints("b200-prefill", "prefill", ("10.0.0.1",), H),
           RoleEndpoints("gb300-decode", "decode", ("10.0.1.1",), H))
    status = compute_status(owner=OWNER, generation=1, previous=None, plan=_plan(), error=None, now=T0,
                            **{**SERVING, "endpoints": old + new, "pairs": {"old": 1, H: 1}})
    assert status.routable_capacity_percent == 150  # decode: 3 routed of 2 planned; prefill 2 of 1
    assert {r.compatibility_hash for r in status.routers} == {"old", H}
    # a revision with a decode only has no pair: its engines are not routable
    lonely = (RoleEndpoints("gb300-decode", "decode", ("10.0.1.8",), "old"), *new)
    status = compute_status(owner=OWNER, generation=1, previous=None, plan=_plan(), error=None, now=T0,
                            **{**SERVING, "endpoints": lonely, "pairs": {H: 1}})
    assert status.routable_capacity_percent == 50


def test_engines_ready_behind_a_router_that_is_not_is_not_ready() -> None:
    def ready_with(router: dict[str, Any]) -> Condition:
        status = compute_status(owner=OWNER, generation=1, previous=None, plan=_plan(), error=None, now=T0,
                                **{**SERVING, "routers": {ROUTER: router}})
        assert status.phase == ("Ready" if _cond(status, "Ready").status == "True" else "Progressing")
        return _cond(status, "Ready")

    assert ready_with(_router(2)).status == "True"
    starting = ready_with(_router(0))
    assert (starting.status, starting.reason) == ("False", ROUTER_NOT_READY)
    assert starting.message == f"router {ROUTER}: 0/2 ready, 0 updated"
    # New lists: the counts of the generation before say nothing until the Deployment saw the new one.
    assert ready_with(_router(2, generation=2, observed=1)).reason == ROUTER_NOT_READY
    # Rolling onto new lists: the old pods still serve, the new ones are not ready yet.
    assert ready_with(_router(2, updated=1)).reason == ROUTER_NOT_READY
    assert ready_with({}).reason == ROUTER_NOT_READY  # not created yet


def test_a_router_serves_only_with_a_routable_leader_of_each_kind_of_engine() -> None:
    no_decode = (ENDPOINTS[0], RoleEndpoints("gb300-decode", "decode", (), H))
    status = compute_status(owner=OWNER, generation=1, previous=None, plan=_plan(), error=None, now=T0,
                            **{**SERVING, "endpoints": no_decode, "pairs": {}, "routers": {ROUTER: _router(0)}})
    (router,) = status.routers
    # it keeps its replicas (it has served: never scaled to 0), and says what it lacks
    assert (router.replicas, router.prefill_workers, router.decode_workers) == (2, 1, 0)
    ready = _cond(status, "Ready")
    assert (ready.status, ready.reason) == ("False", ROUTER_NOT_READY)
    assert f"no routable decode leader of compatibility hash {H}" in ready.message
    assert status.routable_capacity_percent == 0


def test_without_a_router_the_status_says_what_clients_reach() -> None:
    body = dict(load_examples())["pd-gb300-decode-b200-prefill.yaml"]
    status = compute_status(owner=OWNER, generation=1, previous=None, error=None, now=T0, workloads=ALL_READY,
                            plan=_plan({**body, "spec": {**body["spec"], "router": {"replicas": 0}}}))
    assert status.routers == [] and status.phase == "Ready"
    assert status.endpoint == "http://k3-pd-gb300-decode-decode-leader.inference.svc:8000"
    assert status.routing is not None and status.endpoint in status.routing
    assert "prefill and decode do not disaggregate without the router" in status.routing


def test_one_event_per_write_for_the_condition_that_tells_most() -> None:
    from kimik3_operator.api import KimiK3DeploymentStatus
    from kimik3_operator.reconcile.status import transitions

    def status(phase: str, ready: tuple[str, str], progressing: tuple[str, str],
               degraded: tuple[str, str]) -> KimiK3DeploymentStatus:
        return KimiK3DeploymentStatus(phase=phase, conditions=[
            Condition(type=t, status=s, reason=r, message=f"{t} {r}", last_transition_time=T0)
            for t, (s, r) in (("Ready", ready), ("Progressing", progressing), ("Degraded", degraded))])

    serving = status("Ready", ("True", "AllReplicasReady"), ("False", "Stable"), ("False", "AsExpected"))
    held = status("Degraded", ("True", "AllReplicasReady"), ("False", "InsufficientCapacity"),
                  ("True", "InsufficientCapacity"))
    rolling = status("Ready", ("True", "AllReplicasReady"), ("True", "Updating"), ("False", "AsExpected"))
    assert [(t, r) for t, r, _ in transitions(serving, held)] == [("Warning", "InsufficientCapacity")]
    # Back from it, Ready unchanged: that it is no longer degraded is the news, not Progressing=Stable.
    assert [(t, r, m.split(":")[0]) for t, r, m in transitions(held, serving)] == \
        [("Normal", "AsExpected", "Degraded=False")]
    assert [(t, r) for t, r, _ in transitions(serving, rolling)] == [("Normal", "Updating")]  # Progressing alone
    assert transitions(rolling, rolling) == []
