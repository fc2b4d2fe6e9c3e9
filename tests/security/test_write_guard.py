"""No write after the Lease can be taken by another replica: the guard every write asks, against
the elector's clock; then the Cluster's every write path against a fake API server on 127.0.0.1,
which must receive nothing once the guard has turned; and the chart's grace period."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kimik3_operator.k8s import Cluster, NotLeaderError, WriteGuard
from kimik3_operator.k8s.lease import LeaseConfig
from kimik3_operator.reconcile.runner import DRAIN_SECONDS, GRACE_SECONDS
from tests.support.chart import CHART, helm_binary
from tests.unit.test_lease import Clock, MemoryLease, elector

from .fake_api import FakeApiServer, fake_api_server


def test_the_guard_allows_until_its_deadline_and_never_after_a_revocation() -> None:
    clock = Clock()
    guard = WriteGuard(clock)
    with pytest.raises(NotLeaderError):
        guard.check()  # never renewed: no write
    guard.extend(clock.now + 10)
    clock.now += 9.9
    guard.check()
    clock.now += 0.1
    with pytest.raises(NotLeaderError, match="renew deadline"):
        guard.check()
    guard.extend(clock.now + 10)
    guard.check()  # a renewal that began in time and landed late still counts
    guard.revoke("the operator is shutting down")
    guard.extend(clock.now + 10)
    with pytest.raises(NotLeaderError, match="shutting down"):
        guard.check()


def test_while_the_old_leaders_guard_allows_a_write_no_standby_can_take_the_lease() -> None:
    """The leader renews, then goes silent (paused, partitioned); the standby polls every 100 ms
    and may first have seen the last renewal late. At no tick may both act."""
    for seen_late in (0.0, 0.05, 1.9):
        store, clock = MemoryLease(), Clock()
        a, b = elector(store, "a", clock), elector(store, "b", clock)
        assert a.try_acquire_or_renew()
        for _ in range(3):
            clock.now += 2
            assert a.try_acquire_or_renew()
        clock.now += seen_late
        last_write_allowed, taken_at = None, None
        for _ in range(300):  # 30 s
            if b.try_acquire_or_renew() and taken_at is None:
                taken_at = clock.now
            try:
                a.guard.check()
                last_write_allowed = clock.now
                assert taken_at is None, "a may write while b holds the lease"
            except NotLeaderError:
                pass
            clock.now += 0.1
        assert last_write_allowed is not None and taken_at is not None
        cfg = LeaseConfig("l", "ns", "a")
        # The margin a write sent at the last allowed moment has to land before b acts.
        assert taken_at - last_write_allowed >= cfg.lease_seconds - cfg.renew_deadline - 0.1


@pytest.fixture
def cluster_and_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[tuple[Cluster, WriteGuard,
                                                                                          FakeApiServer]]:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the dynamic client's discovery cache
    clock = Clock()
    guard = WriteGuard(clock)
    guard.extend(clock.now + 10)
    with fake_api_server() as server:
        config = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
        yield Cluster(client.ApiClient(config), guard), guard, server


SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "ns", "uid": "uid-1"},
           "spec": {"ports": [{"port": 80}]}}
OWNER = {"apiVersion": "serving.kimik3.dev/v1alpha1", "kind": "KimiK3Deployment", "name": "k3", "uid": "uid-0"}
WRITES: dict[str, Callable[[Cluster], Any]] = {
    "apply": lambda c: c.apply(SERVICE, None),
    "set_replicas": lambda c: c.set_replicas(SERVICE, 3),
    "delete": lambda c: c.delete(SERVICE),
    "post_event": lambda c: c.post_event(OWNER, "ns", "Normal", "Test", "a message"),
    "apply_status": lambda c: c.apply_status("ns", "k3", {"phase": "Ready"}),
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_write_after_the_guard_turned_raises_and_sends_nothing(
        write: str, cluster_and_server: tuple[Cluster, WriteGuard, FakeApiServer]) -> None:
    cluster, guard, server = cluster_and_server
    WRITES[write](cluster)
    sent = list(server.writes)
    assert sent, "while the guard allows it, the write reaches the server"
    guard.revoke("leadership lost")
    with pytest.raises(NotLeaderError):
        WRITES[write](cluster)
    assert server.writes == sent, "a write reached the server after the guard turned"
    assert cluster.list_nodes() == []  # reads go on: they change nothing


def test_the_chart_grace_period_covers_the_drain_and_the_release() -> None:
    helm = helm_binary()
    if helm is None:
        pytest.skip("helm is not built (e2e/cluster/build.sh helm)")
    out = subprocess.run([helm, "template", "t", str(CHART), "--show-only", "templates/deployment.yaml"],
                         capture_output=True, text=True, check=True).stdout
    pod = yaml.safe_load(out)["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == GRACE_SECONDS
    assert GRACE_SECONDS >= DRAIN_SECONDS + LeaseConfig.request_timeout + 2
