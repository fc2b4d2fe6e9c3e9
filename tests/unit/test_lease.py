"""Leader election: the pure decisions, then two electors on one in-memory Lease that keeps the
API server's one rule that matters here (a write carrying a stale resourceVersion gets 409)."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kimik3_operator.k8s.lease import (
    LeaderElector,
    LeaseConfig,
    Observation,
    claimed,
    default_lease_namespace,
    held_by_other,
    micro_time,
    observe,
    released,
    renew_overdue,
)

T0 = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)


def lease(version: str, holder: str | None, seconds: int = 15) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": version},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": seconds}}


# ---- pure decisions -----------------------------------------------------------------------------

def test_observation_clock_restarts_only_when_the_record_changes() -> None:
    first = observe(None, lease("1", "a"), now=100.0)
    assert first == Observation(version="1", holder="a", lease_seconds=15, since=100.0)
    assert observe(first, lease("1", "a"), now=110.0) is first  # unchanged: still since 100
    renewed = observe(first, lease("2", "a"), now=110.0)
    assert renewed.since == 110.0 and renewed.version == "2"


def test_held_by_other_until_unchanged_for_its_duration() -> None:
    seen = observe(None, lease("7", "a", seconds=15), now=100.0)
    assert held_by_other(seen, "b", now=114.9)
    assert not held_by_other(seen, "b", now=115.0)
    assert not held_by_other(seen, "a", now=101.0), "our own lease is never held by another"
    free = observe(None, lease("8", None), now=100.0)
    assert not held_by_other(free, "b", now=100.0), "a released lease is free at once"


def test_claim_takes_renews_and_counts_transitions() -> None:
    created = claimed({}, "a", 15, T0)
    assert created == {"holderIdentity": "a", "leaseDurationSeconds": 15, "acquireTime": micro_time(T0),
                       "renewTime": micro_time(T0), "leaseTransitions": 0}
    later = T0 + timedelta(seconds=2)
    renewed = claimed(created, "a", 15, later)
    assert renewed["acquireTime"] == micro_time(T0) and renewed["renewTime"] == micro_time(later)
    assert renewed["leaseTransitions"] == 0
    taken = claimed(renewed, "b", 15, later)
    assert taken["holderIdentity"] == "b" and taken["acquireTime"] == micro_time(later)
    assert taken["leaseTransitions"] == 1
    assert claimed(released(taken, later), "a", 15, later)["leaseTransitions"] == 2


def test_release_frees_with_a_short_duration() -> None:
    spec = released(claimed({}, "a", 15, T0), T0)
    assert spec["holderIdentity"] is None and spec["leaseDurationSeconds"] == 1
    assert micro_time(T0) == "2026-01-02T03:04:05.123456Z"


def test_renew_deadline() -> None:
    assert not renew_overdue(last_renew=100.0, now=109.9, renew_deadline=10)
    assert renew_overdue(last_renew=100.0, now=110.0, renew_deadline=10)


@pytest.mark.parametrize(("retry", "deadline", "duration"), [(2, 15, 15), (0, 1, 15), (3, 2, 15)])
def test_timings_must_nest(retry: float, deadline: float, duration: int) -> None:
    with pytest.raises(ValueError, match="retry_period < renew_deadline < lease_seconds"):
        LeaseConfig("l", "ns", "me", lease_seconds=duration, renew_deadline=deadline, retry_period=retry)


# ---- electors on an in-memory Lease ---------------------------------------------------------------

class MemoryLease:
    """One Lease with the API server's optimistic concurrency: create 409s when it exists,
    PUT 409s on a stale resourceVersion."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.version = 0
        self.fail = False

    def _check(self) -> None:
        if self.fail:
            raise ConnectionError("API server unreachable")

    def _store(self, spec: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        self.obj = {"metadata": {"name": "l", "resourceVersion": str(self.version)}, "spec": spec}
        return copy.deepcopy(self.obj)

    def get(self) -> dict[str, Any] | None:
        self._check()
        return copy.deepcopy(self.obj)

    def create(self, spec: dict[str, Any]) -> dict[str, Any] | None:
        self._check()
        return None if self.obj is not None else self._store(spec)

    def replace(self, lease: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any] | None:
        self._check()
        assert self.obj is not None
        if lease["metadata"]["resourceVersion"] != self.obj["metadata"]["resourceVersion"]:
            return None
        return self._store(spec)

    @property
    def holder(self) -> str | None:
        return None if self.obj is None else self.obj["spec"].get("holderIdentity")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(store: MemoryLease, me: str, clock: Clock, wall_offset: float = 0.0,
            **timings: float) -> LeaderElector:
    cfg = LeaseConfig("l", "ns", me, **timings)  # type: ignore[arg-type]
    return LeaderElector(store, cfg, clock=clock,  # type: ignore[arg-type]
                         wall=lambda: T0 + timedelta(seconds=clock.now + wall_offset))


def test_first_candidate_creates_the_lease_and_the_second_stands_by() -> None:
    store, clock = MemoryLease(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert a.try_acquire_or_renew() and store.holder == "a"
    assert not b.try_acquire_or_renew() and b.holder == "a"
    for _ in range(20):  # a renews every 2 s: b never gets it
        clock.now += 2
        assert a.try_acquire_or_renew() and a.renewed_at == clock.now
        assert not b.try_acquire_or_renew()
    assert store.holder == "a" and store.obj is not None
    assert store.obj["spec"]["leaseTransitions"] == 0


def test_standby_takes_over_a_whole_lease_duration_after_the_last_renewal_it_saw() -> None:
    store, clock = MemoryLease(), Clock()
    # b's wall clock is an hour fast: it must not matter, b only trusts its own observations.
    a, b = elector(store, "a", clock), elector(store, "b", clock, wall_offset=3600)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    seen_at = clock.now  # a dies right after this renewal, which b has just seen
    while clock.now < seen_at + 14.9:
        clock.now += 0.1
        assert not b.try_acquire_or_renew(), f"took over after {clock.now - seen_at:.1f}s"
    clock.now = seen_at + 15
    assert b.try_acquire_or_renew() and store.holder == "b"
    assert store.obj is not None and store.obj["spec"]["leaseTransitions"] == 1
    # a comes back (a paused process, say): its fast-path renewal is stale and it sees b hold it
    assert not a.try_acquire_or_renew() and a.holder == "b"


class Interleaved:
    """c's view of the Lease: just before c's PUT lands, `first` runs (b's whole round)."""

    def __init__(self, store: MemoryLease) -> None:
        self.store, self.first = store, lambda: None

    def get(self) -> dict[str, Any] | None:
        return self.store.get()

    def create(self, spec: dict[str, Any]) -> dict[str, Any] | None:
        return self.store.create(spec)

    def replace(self, lease: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any] | None:
        self.first()
        return self.store.replace(lease, spec)


def test_two_candidates_racing_for_one_version_cannot_both_win() -> None:
    store, clock = MemoryLease(), Clock()
    assert elector(store, "old", clock).try_acquire_or_renew()
    view = Interleaved(store)
    b = elector(store, "b", clock)
    c = LeaderElector(view, LeaseConfig("l", "ns", "c"), clock=clock)  # type: ignore[arg-type]
    assert not b.try_acquire_or_renew() and not c.try_acquire_or_renew()
    clock.now += 15  # "old" is gone: both may take it, and both read the same version
    results: list[bool] = []
    view.first = lambda: results.append(b.try_acquire_or_renew())
    assert not c.try_acquire_or_renew(), "c's PUT carried a version b had already replaced"
    assert results == [True] and store.holder == "b"
    view.first = lambda: None
    assert not c.try_acquire_or_renew() and c.holder == "b"


def test_release_lets_the_standby_take_over_at_once() -> None:
    store, clock = MemoryLease(), Clock()
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    assert a.release() and store.holder is None
    clock.now += 2
    assert b.try_acquire_or_renew() and store.holder == "b"
    assert not a.release(), "a no longer holds it: nothing to release"
    assert store.holder == "b"


def test_hold_ends_when_renewals_fail_past_the_deadline() -> None:
    store = MemoryLease()
    a = LeaderElector(store, LeaseConfig("l", "ns", "a", lease_seconds=2, renew_deadline=0.3,  # type: ignore[arg-type]
                                         retry_period=0.05))

    async def scenario() -> tuple[str, float]:
        assert await a.acquire(asyncio.Event())
        store.fail = True
        loop = asyncio.get_running_loop()
        started = loop.time()
        reason = await asyncio.wait_for(a.hold(), 5)
        return reason, loop.time() - started

    reason, took = asyncio.run(scenario())
    assert reason == "lease not renewed for 0.3s"
    assert 0.3 <= took < 2.0, "must stop before the lease (2 s) can expire for a standby"


def test_hold_ends_at_once_when_someone_else_holds_the_lease() -> None:
    store, clock = MemoryLease(), Clock()
    a = elector(store, "a", clock, lease_seconds=1, renew_deadline=0.3, retry_period=0.05)
    assert a.try_acquire_or_renew()
    current = store.get()
    assert current is not None
    store.replace(current, claimed(current["spec"], "intruder", 15, T0))
    assert asyncio.run(asyncio.wait_for(a.hold(), 5)) == "lease taken by intruder"


def test_acquire_returns_false_when_stopped_while_standing_by() -> None:
    store, clock = MemoryLease(), Clock()
    assert elector(store, "a", clock).try_acquire_or_renew()
    b = elector(store, "b", clock, lease_seconds=1, renew_deadline=0.3, retry_period=0.05)

    async def scenario() -> bool:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, stop.set)
        return await asyncio.wait_for(b.acquire(stop), 5)

    assert asyncio.run(scenario()) is False
    assert store.holder == "a"


def test_lease_namespace_from_the_pod_then_the_kubeconfig_context(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u, namespace: ops}}]\n")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("POD_NAMESPACE", "kimik3-system")
    assert default_lease_namespace() == "kimik3-system"
    monkeypatch.delenv("POD_NAMESPACE")
    assert default_lease_namespace() == "ops"
    kubeconfig.write_text(kubeconfig.read_text().replace(", namespace: ops", ""))
    assert default_lease_namespace() == "default"
