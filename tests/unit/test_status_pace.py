"""A status whose story is unchanged (phase, conditions' status and reason, observed generation) is
written at most once per PACE_SECONDS; a new story at once; a held-back one by the pass it asks for."""

from __future__ import annotations

from kimik3_operator.reconcile.reconciler import Pass, reconcile
from kimik3_operator.reconcile.status import compute_status
from kimik3_operator.reconcile.status_pace import PACE_SECONDS, StatusPace
from tests.support.memory_cluster import NODES, MemoryCluster, pd_body, staged
from tests.unit.test_status import ALL_READY, ENDPOINTS, OWNER, ROUTER, H, _lws, _plan, _router


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _status(ready_router: int, decode: tuple[int, int] = (2, 2), generation: int = 1):
    workloads = {**ALL_READY, "k3-pd-gb300-decode-decode": _lws(*decode)}
    return compute_status(owner=OWNER, generation=generation, previous=None, plan=_plan(), error=None,
                          now="t", workloads=workloads, endpoints=ENDPOINTS, pairs={H: 1},
                          routers={ROUTER: _router(ready_router)})


def test_counts_alone_wait_for_the_pace_and_a_new_story_does_not() -> None:
    clock = Clock()
    pace = StatusPace(clock=clock)
    key = ("inference", "k3-pd")
    first, more = _status(0, decode=(0, 2)), _status(0, decode=(1, 2))
    assert first.phase == more.phase and first != more  # the same story, other counts
    assert pace.wait(key, None, first) == 0  # nothing written yet
    assert pace.wait(key, first, more) == 0  # nothing written by this process yet
    pace.wrote(key)
    clock.now += 1
    assert pace.wait(key, first, more) == PACE_SECONDS - 1
    ready = _status(2)
    assert ready.phase == "Ready" != first.phase and pace.wait(key, first, ready) == 0
    assert pace.wait(key, first, _status(0, decode=(0, 2), generation=2)) == 0  # a spec change
    clock.now += PACE_SECONDS
    assert pace.wait(key, first, more) == 0
    pace.forget_all_but(set())
    clock.now -= PACE_SECONDS
    assert pace.wait(key, first, more) == 0


def test_a_held_back_status_is_written_by_the_pass_it_asks_for() -> None:
    clock = Clock()
    pace = StatusPace(clock=clock)
    cluster = staged(MemoryCluster(pd_body(), NODES))
    first = reconcile(Pass(cluster, "ns", "k3", pace=pace))  # serving children applied: a new story
    assert first.status_written and first.due is None
    lws = cluster.objects[("LeaderWorkerSet", "k3-gb300-decode")]
    lws["status"] = {"replicas": 2, "updatedReplicas": 2, "readyReplicas": 0, "observedGeneration": 1}
    lws["metadata"]["generation"] = 1
    before = cluster.deployment["status"]
    clock.now += 1
    held = reconcile(Pass(cluster, "ns", "k3", pace=pace))
    assert not held.status_written and held.due == PACE_SECONDS - 1
    assert cluster.deployment["status"] == before
    clock.now += held.due
    later = reconcile(Pass(cluster, "ns", "k3", pace=pace))
    assert later.status_written and later.due is None
    (decode,) = [r for p in cluster.deployment["status"]["pools"] for r in p["roles"] if r["role"] == "decode"]
    assert decode["updatedReplicas"] == 2
