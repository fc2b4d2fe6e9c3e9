"""The work queue's rules: a key waits once however often it is put, is never handed to two
workers at once, comes back after its pass when it was put meanwhile, and a burst of child events
shares one pass."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

from kimik3_operator.metrics import RESYNCS, PhaseBook
from kimik3_operator.reconcile.autoscaler import SloScaler
from kimik3_operator.reconcile.handlers import _drain
from kimik3_operator.reconcile.queue import WorkQueue
from kimik3_operator.reconcile.settings import OperatorConfig

A, B = ("ns", "a"), ("ns", "b")


def test_a_key_waits_once_and_comes_back_after_a_pass_it_was_put_during() -> None:
    async def main() -> None:
        queue = WorkQueue()
        for key in (A, B, A, A):
            queue.put(key)
        assert len(queue) == 2
        assert await queue.get() == A
        queue.put(A)  # while A's pass runs: not handed out again yet
        assert await queue.get() == B
        assert len(queue) == 0
        queue.done(A)
        assert await queue.get() == A  # ... but after it
        queue.done(A)
        queue.done(B)
        assert len(queue) == 0
    asyncio.run(main())


def test_a_burst_of_events_shares_one_pass() -> None:
    async def main() -> None:
        queue = WorkQueue()
        for _ in range(5):
            queue.put_soon(A, 0.05)
        assert len(queue) == 0  # not before the window
        await asyncio.sleep(0.1)
        assert len(queue) == 1 and await queue.get() == A
        queue.put_soon(A, 0.05)  # an event during the pass: one more pass after it
        await asyncio.sleep(0.1)
        assert len(queue) == 0
        queue.done(A)
        assert await queue.get() == A
        queue.done(A)
        queue.put(B)
        queue.put_soon(B, 0.05)  # B waits already: its pass reads this event's change
        await asyncio.sleep(0.1)
        assert await queue.get() == B and len(queue) == 0
    asyncio.run(main())


class _Cache:
    def __init__(self, keys: list[tuple[str, str]]) -> None:
        self.keys = keys

    def deployment_keys(self) -> list[tuple[str, str]]:
        return self.keys


class _State:
    """Passes that take `seconds[name]`, counting overlaps of one deployment with itself."""

    def __init__(self, seconds: dict[str, float], resync: float = 60.0, workers: int = 2) -> None:
        self.config = OperatorConfig(resync_seconds=resync, retry_seconds=0.02, workers=workers)
        self.queue = WorkQueue()
        self.cache = _Cache([("ns", n) for n in seconds])
        self.phases = PhaseBook()
        self.scaler = SloScaler(None)
        self.seconds = seconds
        self.runs: Counter[str] = Counter()
        self.running: Counter[str] = Counter()
        self.overlaps = 0
        self._lock = threading.Lock()

    def forget_all_but(self, keys: set[tuple[str, str]]) -> None:
        self.phases.keep_only(keys)

    def run(self, namespace: str, name: str) -> None:
        with self._lock:
            self.running[name] += 1
            self.overlaps += self.running[name] > 1
        time.sleep(self.seconds[name])
        with self._lock:
            self.running[name] -= 1
            self.runs[name] += 1


def test_a_slow_pass_holds_up_only_its_own_deployment() -> None:
    state = _State({"slow": 0.6, "fast": 0.01})

    async def main() -> None:
        task = asyncio.create_task(_drain(state))  # type: ignore[arg-type]
        state.queue.put(("ns", "slow"))
        for _ in range(10):
            state.queue.put(("ns", "fast"))
            state.queue.put(("ns", "slow"))  # while its pass runs: once more after it, never beside it
            await asyncio.sleep(0.03)
        await asyncio.sleep(0.1)
        fast_during_slow = state.runs["fast"]
        await asyncio.sleep(0.8)
        task.cancel()
        assert fast_during_slow >= 5  # the fast deployment's passes went on beside the slow one
    asyncio.run(main())
    assert state.runs["slow"] == 2 and state.overlaps == 0


def test_a_resync_round_counts_once_every_listed_deployment_had_a_pass_after_it_began() -> None:
    state = _State({"a": 0.05, "b": 0.3}, resync=0.2, workers=4)

    async def main() -> None:
        before = RESYNCS._value.get()
        task = asyncio.create_task(_drain(state))  # type: ignore[arg-type]
        await asyncio.sleep(0.3)  # the first round began at the first look (0.05 s); b's pass ends at ~0.35 s
        assert RESYNCS._value.get() == before
        await asyncio.sleep(0.15)
        task.cancel()
        assert RESYNCS._value.get() >= before + 1
    asyncio.run(main())


def test_a_scaling_decision_that_never_comes_is_not_asked_for_in_a_busy_loop() -> None:
    """A deployment whose decision is due but whose pass ends before deciding (a plan that fails)
    keeps its old due time: the drain asks for it again only after the hold, not at loop speed."""
    state = _State({"stuck": 0.0, "other": 0.0}, resync=60.0)
    state.scaler._next[("ns", "stuck")] = 0.0  # due since the epoch; its passes never decide

    async def main() -> None:
        task = asyncio.create_task(_drain(state))  # type: ignore[arg-type]
        await asyncio.sleep(1.5)
        task.cancel()
    asyncio.run(main())
    assert 1 <= state.runs["stuck"] <= 3, state.runs  # at 0 s and after each 1 s hold
    assert state.runs["other"] == 0


def test_next_due_holds_what_it_returned() -> None:
    now = [100.0]
    scaler = SloScaler(None, clock=lambda: now[0])
    scaler._next = {A: 90.0, B: 105.0}
    assert scaler.next_due(hold=1.0) == (1.0, {A})
    assert scaler.next_due(hold=1.0) == (1.0, set())  # A held for a second
    now[0] = 101.0
    assert scaler.next_due(hold=1.0) == (1.0, {A})
    scaler._next[A] = 130.0  # its pass decided: next in 30 s
    now[0] = 105.0
    assert scaler.next_due(hold=1.0) == (1.0, {B})
    assert scaler.next_due() == (0.0, {B})  # without a hold, what is due is due


def test_a_deployment_with_a_recent_pass_is_not_resynced_until_its_own_interval_is_up() -> None:
    """The resync is due per deployment, an interval after its last pass: a deployment that child
    events keep reconciling gets no resync pass on top, and one that nothing moves gets one every
    interval (and a quarter at most)."""
    state = _State({"busy": 0.0, "quiet": 0.0}, resync=0.4)

    async def main() -> None:
        task = asyncio.create_task(_drain(state))  # type: ignore[arg-type]
        for _ in range(20):  # 2 s of child events for `busy`, one every 0.1 s
            state.queue.put(("ns", "busy"))
            await asyncio.sleep(0.1)
        task.cancel()
    asyncio.run(main())
    # Each event one pass and no resync pass besides (a resync of all every 0.4 s made ~25; one
    # more is a stall of the loaded test machine); `quiet` every 0.4 s, the first at the first look.
    assert 20 <= state.runs["busy"] <= 21
    assert 3 <= state.runs["quiet"] <= 6
