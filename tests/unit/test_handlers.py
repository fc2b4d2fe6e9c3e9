"""The kopf wiring: the periodic resync keeps its clock (a deployment that fails on every pass,
requeued every retry interval, must not postpone the others), and a pass cut short by an API
server that went away is retried promptly, not after kopf's default minute."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import kopf
import pytest
import urllib3

from kimik3_operator.metrics import PhaseBook
from kimik3_operator.reconcile.autoscaler import SloScaler
from kimik3_operator.reconcile.handlers import _drain, on_deployment
from kimik3_operator.reconcile.queue import WorkQueue
from kimik3_operator.reconcile.settings import OperatorConfig


class _Cache:
    def deployment_keys(self) -> list[tuple[str, str]]:
        return [("ns", "broken"), ("ns", "fine")]


class _State:
    def __init__(self) -> None:
        self.config = OperatorConfig(resync_seconds=0.2, retry_seconds=0.02)
        self.queue = WorkQueue()
        self.cache = _Cache()
        self.runs: Counter[str] = Counter()
        self.phases = PhaseBook()
        self.scaler = SloScaler(None)

    def forget_all_but(self, keys: set[tuple[str, str]]) -> None:
        self.phases.keep_only(keys)

    def run(self, namespace: str, name: str) -> None:
        self.runs[name] += 1
        if name == "broken":
            raise RuntimeError("fails every pass")


def test_a_failing_deployment_does_not_starve_the_resync() -> None:
    state = _State()

    async def main() -> None:
        state.queue.put(("ns", "broken"))
        task = asyncio.create_task(_drain(state))  # type: ignore[arg-type]
        await asyncio.sleep(1.1)
        task.cancel()

    asyncio.run(main())
    assert state.runs["broken"] > 10  # retried every 20 ms
    assert 4 <= state.runs["fine"] <= 6  # and still resynced every 200 ms with the others


def test_an_unreachable_api_server_is_a_prompt_retry() -> None:
    class Refused:
        def run(self, namespace: str, name: str, body: Any = None) -> Any:
            raise urllib3.exceptions.MaxRetryError(None, "/apis", reason=ConnectionRefusedError())  # type: ignore[arg-type]

    with pytest.raises(kopf.TemporaryError) as caught:
        on_deployment(namespace="ns", name="k3", body={}, memo=kopf.Memo(state=Refused()))
    assert caught.value.delay == 5


def test_what_is_kept_per_deployment_is_dropped_once_it_is_gone() -> None:
    import threading

    from kimik3_operator.planner.disaggregation import Verdict
    from kimik3_operator.reconcile.disaggregation import DisaggregationProbe
    from kimik3_operator.reconcile.failing import FailureMemory
    from kimik3_operator.reconcile.handlers import State
    from kimik3_operator.reconcile.queueing import QueueProbe

    state = State.__new__(State)  # no API client: only the bookkeeping is under test
    state._guard, state.phases, state.scaler, state.pace = threading.Lock(), PhaseBook(), SloScaler(None), None
    state.probe = DisaggregationProbe(None, clock=lambda: 0.0)
    state.probe._last = {("ns", "gone"): (0.0, Verdict("False", "NoTraffic", "")),
                         ("ns", "kept"): (0.0, Verdict("False", "NoTraffic", ""))}
    state.queues = QueueProbe(clock=lambda: 0.0)
    state.queues._last = {("ns", "gone"): (0.0, (), []), ("ns", "kept"): (0.0, (), [])}
    state.failures = FailureMemory()
    state.failures._ready = {("ns", "gone"): {("lws", 0): "r"}, ("ns", "kept"): {("lws", 0): "r"}}
    busy = threading.Lock()
    busy.acquire()
    state._locks = {("ns", "gone"): threading.Lock(), ("ns", "kept"): threading.Lock(), ("ns", "running"): busy}
    state.phases.record(("ns", "gone"), "Ready")
    state.forget_all_but({("ns", "kept")})
    assert set(state._locks) == {("ns", "kept"), ("ns", "running")}  # a pass still running keeps its lock
    assert set(state.probe._last) == {("ns", "kept")}
    assert set(state.queues._last) == {("ns", "kept")}
    assert set(state.failures._ready) == {("ns", "kept")}


def test_every_watched_child_kind_starts_a_pass_on_its_events() -> None:
    """The router's Deployment included: its readiness is part of the deployment's, and a router
    deleted or edited by hand is repaired at once, not at the next resync. The informers call the
    queue; kopf watches only KimiK3Deployments (no second watch per child kind)."""
    from kimik3_operator.contract.kinds import CHILD_KINDS
    from kimik3_operator.k8s.cache import ClusterCache

    started: list[tuple[str, str]] = []
    cache = ClusterCache.__new__(ClusterCache)  # no API client: only the wiring is under test
    cache._on_child = lambda namespace, name, kind: started.append((namespace, name))
    owned = {"metadata": {"namespace": "ns", "name": "k3-router", "ownerReferences": [
        {"apiVersion": "serving.kimik3.dev/v1alpha1", "kind": "KimiK3Deployment", "name": "k3", "uid": "u"}]}}
    foreign = {"metadata": {"namespace": "ns", "name": "x", "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "k3", "uid": "u"}]}}
    listening = set()
    for kind in CHILD_KINDS:
        if (listen := cache._listener(kind)) is not None:
            listening.add(kind.kind)
            listen("MODIFIED", owned)
            listen("DELETED", foreign)
    assert listening == {k.kind for k in CHILD_KINDS if k.watched} >= {"Deployment", "LeaderWorkerSet", "Job"}
    assert started == [("ns", "k3")] * len(listening)
    assert {h.selector.any_name for h in kopf.get_default_registry()._watching.get_all_handlers()} == set()


def test_a_held_back_status_gets_the_pass_it_asks_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that held its status back (reconcile/status_pace.py) queues its deployment for the
    moment the status may be written, from whichever thread ran it (a worker's or kopf's)."""
    import threading

    from kimik3_operator.reconcile import handlers
    from kimik3_operator.reconcile.failing import FailureMemory
    from kimik3_operator.reconcile.pass_memo import PassMemo
    from kimik3_operator.reconcile.reconciler import Outcome

    monkeypatch.setattr(handlers, "reconcile", lambda *a, **kw: Outcome(phase="Progressing", due=0.1))

    async def main() -> tuple[float, tuple[str, str]]:
        state = handlers.State.__new__(handlers.State)  # no API client: only the requeue is under test
        state.config, state.queue, state._loop = OperatorConfig(), WorkQueue(), asyncio.get_running_loop()
        state._guard, state._locks, state.phases = threading.Lock(), {}, PhaseBook()
        state.cluster = state.scaler = state.pace = state.probe = state.queues = None
        state.memo, state.failures = PassMemo(), FailureMemory()
        started = asyncio.get_running_loop().time()
        await asyncio.to_thread(state.run, "ns", "k3")
        assert len(state.queue) == 0  # not at once
        key = await asyncio.wait_for(state.queue.get(), 2)
        return asyncio.get_running_loop().time() - started, key

    waited, key = asyncio.run(main())
    assert key == ("ns", "k3") and waited >= 0.1


def test_a_resync_round_does_not_wait_for_a_deployment_deleted_before_its_pass() -> None:
    """Deployments are queued when due, not all at a round's start: one deleted before its turn
    would otherwise hold the round (and every later one) open for good."""
    from kimik3_operator.metrics import RESYNCS
    from kimik3_operator.reconcile.handlers import ResyncRound

    before = RESYNCS._value.get()
    round_ = ResyncRound(every=10.0)
    round_.begin({("ns", "a"), ("ns", "gone")}, now=0.0)
    round_.passed(("ns", "a"), started=1.0)
    assert RESYNCS._value.get() == before
    round_.begin({("ns", "a")}, now=2.5)  # the next look: "gone" is no longer listed
    assert RESYNCS._value.get() == before + 1
    round_.begin(set(), now=5.0)  # nothing listed: still one round per interval, not one per look
    round_.begin(set(), now=7.5)
    assert RESYNCS._value.get() == before + 1
    round_.begin(set(), now=10.0)
    assert RESYNCS._value.get() == before + 2
