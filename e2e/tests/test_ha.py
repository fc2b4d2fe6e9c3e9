"""High availability: two replicas on one Lease, exactly one acts; SIGKILL the leader in the
middle of a reconcile pass and the standby takes over and converges; SIGTERM hands over at once.

The replicas are the session's (conftest `replicas`): the operator always runs as the chart
deploys it, two replicas with leader election, so there is no second operator to collide with.
Each test leaves a leader and a standby behind (the killed slot is started again, as the kubelet
would), and every test's `operator` fixture waits for a leader first.

Who wrote what comes from the API server's audit log: every request carries the replica's
identity in its User-Agent (the Kubernetes client's and kopf's alike)."""

from __future__ import annotations

import json
import re
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.kube import apply, condition, get_json, kubectl, wait_for
from e2e.harness.replicas import Replica, Replicas, lease_json
from tests.support.cases import base_deployment

from .conftest import CHART_NAMESPACE, SERVICE_ACCOUNT

pytestmark = pytest.mark.e2e

USER = f"system:serviceaccount:{CHART_NAMESPACE}:{SERVICE_ACCOUNT}"
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
GB300 = {"nvidia.com/gpu.product": "NVIDIA-GB300"}
POOLS = ("a", "b")
TAKEOVER_LIMIT = 60.0


def deployment(namespace: str, name: str) -> dict[str, Any]:
    """Two aggregated GB300 pools: eight children (LWS, leader Service, ComputeDomain each, and the
    router's Deployment and Service) so a pass takes several writes and a kill can land between
    them; GB300 only (4 B200 nodes are what the other tests need)."""
    body = base_deployment(name=name, namespace=namespace)
    body["spec"]["pools"] = [{"name": p, "nodeSelector": GB300,
                              "aggregated": {"replicas": 1, "parallelism": {"tensor": 8}}} for p in POOLS]
    return body


def expected_children(name: str) -> dict[str, set[str]]:
    return {"LeaderWorkerSet": {f"{name}-{p}-aggregated" for p in POOLS},
            "Service": {f"{name}-{p}-aggregated-leader" for p in POOLS} | {f"{name}-router"},
            "ComputeDomain": {f"{name}-{p}-aggregated-cd" for p in POOLS},
            "Deployment": {f"{name}-router"}}


SERVING_KINDS = ("leaderworkersets", "services", "computedomains", "deployments")


class Audit:
    """The API server's audit log from a point on: the operator's writes, leases excluded."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size
        self.since = datetime.now(UTC)
        self.writes: list[dict[str, Any]] = []

    def read(self) -> list[dict[str, Any]]:
        """Every write so far (new lines are parsed once)."""
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[:chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            event = json.loads(line)
            ref = event.get("objectRef") or {}
            if ((event.get("user") or {}).get("username") == USER and event["verb"] in WRITES
                    and ref.get("resource") != "leases"):
                event["identity"] = identity(event.get("userAgent", ""))
                self.writes.append(event)
        return self.writes


def identity(user_agent: str) -> str:
    match = re.search(r"\(([^()]+)\)$", user_agent)
    return match.group(1) if match else f"<unidentified: {user_agent}>"


def at(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))


def writers_in_turn(writes: list[dict[str, Any]]) -> list[str]:
    """Identities in time order, runs collapsed: [a, b] is a clean handover, [a, b, a] is not."""
    turns: list[str] = []
    for event in sorted(writes, key=at):
        if not turns or turns[-1] != event["identity"]:
            turns.append(event["identity"])
    return turns


def converged(namespace: str, name: str) -> bool:
    """Ready, observed, and the children are exactly the expected ones, each owned by the CR."""
    cr = get_json("k3", name, "-n", namespace)
    ready = condition(cr, "Ready")
    if not (ready and ready["status"] == "True"
            and cr["status"].get("observedGeneration") == cr["metadata"]["generation"]):
        return False
    uid, selector = cr["metadata"]["uid"], f"serving.kimik3.dev/deployment={name}"
    found: dict[str, set[str]] = {}
    for kind in SERVING_KINDS:
        for child in get_json(kind, "-n", namespace, "-l", selector)["items"]:
            owners = [(o["uid"], o.get("controller")) for o in child["metadata"].get("ownerReferences") or []]
            assert owners == [(uid, True)], f"{child['kind']} {child['metadata']['name']} owners {owners}"
            found.setdefault(child["kind"], set()).add(child["metadata"]["name"])
    pods = get_json("pods", "-n", namespace, "-l", f"{selector},serving.kimik3.dev/role")["items"]  # serving pods
    return found == expected_children(name) and len(pods) == 2 * len(POOLS)


def no_strays(namespace: str, names: set[str]) -> None:
    """Every operator-managed object in the namespace belongs to one of `names`."""
    for kind in SERVING_KINDS:
        items = get_json(kind, "-n", namespace, "-l", "app.kubernetes.io/managed-by=kimik3-operator")["items"]
        owners = {o["metadata"]["labels"]["serving.kimik3.dev/deployment"] for o in items}
        assert owners <= names, f"{kind} of unknown deployments: {owners - names}"


def audit_log(cluster: dict[str, str]) -> Path:
    return Path(cluster["KUBECONFIG"]).parent / "audit.log"


def takeover(replicas: Replicas, new: Replica, started: float) -> tuple[float, list[str]]:
    """Seconds from `started` until `new` says it leads (polled on its liveness endpoint, which
    is quick; then the Lease must name it); the liveness failures `new` showed meanwhile (it
    must answer probes across the transition)."""
    failures: list[str] = []

    def leads() -> bool:
        health = new.health()
        if health is None:
            failures.append(f"{time.monotonic() - started:.1f}s")
        return bool(health) and health["role"] == "leader"

    wait_for(f"{new.identity} to take over", leads, timeout=TAKEOVER_LIMIT + 30, interval=0.1)
    seconds = time.monotonic() - started
    assert replicas.holder() == new.identity
    return seconds, failures


def test_sigkill_mid_reconcile_standby_takes_over_and_converges(
        operator: Path, replicas: Replicas, namespace: str, cluster: dict[str, str]) -> None:
    leader = replicas.leader()
    (standby,) = replicas.others(leader)
    assert (standby.health() or {}).get("role") == "standby"
    assert (leader.leader_gauge(), standby.leader_gauge()) == (1.0, 0.0)
    audit = Audit(audit_log(cluster))

    # Exactly one acts: the first deployment is built by the leader alone.
    apply(deployment(namespace, "k3-first"))
    wait_for("k3-first to converge", lambda: converged(namespace, "k3-first"), timeout=120)
    assert {w["identity"] for w in audit.read()} == {leader.identity}

    # A second deployment; SIGKILL the leader as soon as its pass has made its first write.
    before = len(audit.read())
    apply(deployment(namespace, "k3-second"))

    def pass_started() -> list[dict[str, Any]]:
        return [w for w in audit.read()[before:] if (w["objectRef"].get("name") or "").startswith("k3-second")]

    first = wait_for("the leader's first write for k3-second", pass_started, timeout=60, interval=0.01)
    leader.kill(signal.SIGKILL)
    killed_at, killed_wall = time.monotonic(), datetime.now(UTC)
    assert leader.proc.wait(10) == -signal.SIGKILL
    written = len(pass_started())
    print(f"\nSIGKILL after {written} write(s) of k3-second's pass (first: {first[0]['verb']} "
          f"{first[0]['objectRef']['resource']})")

    seconds, failures = takeover(replicas, standby, killed_at)
    print(f"takeover after SIGKILL: {seconds:.1f}s (lease {lease_json(replicas)['spec']['leaseDurationSeconds']}s)")
    assert seconds < TAKEOVER_LIMIT
    assert failures == [], "the standby's liveness endpoint failed during the takeover"
    assert standby.leader_gauge() == 1.0

    wait_for("k3-second to converge under the new leader", lambda: converged(namespace, "k3-second"), timeout=120)
    assert converged(namespace, "k3-first")
    no_strays(namespace, {"k3-first", "k3-second"})

    writes = audit.read()
    assert writers_in_turn(writes) == [leader.identity, standby.identity], writers_in_turn(writes)
    new_writes = [w for w in writes if w["identity"] == standby.identity]
    assert new_writes and min(map(at, new_writes)) > killed_wall
    first_write = (min(map(at, new_writes)) - killed_wall).total_seconds()
    print(f"first write by the new leader {first_write:.1f}s after the SIGKILL")
    if written < len(expected_children("k3-second")):
        # the killed pass was cut short: the new leader finished it
        assert any((w["objectRef"].get("name") or "").startswith("k3-second") for w in new_writes)

    # The kubelet restarts the killed pod: it comes back as the standby.
    restarted = replicas.start(leader.slot)
    wait_for("the restarted replica to stand by", lambda: (restarted.health() or {}).get("role") == "standby")
    assert replicas.holder() == standby.identity
    kubectl("delete", "k3", "k3-first", "k3-second", "-n", namespace, "--wait=true", "--timeout=60s")


def test_sigterm_releases_the_lease_and_the_standby_takes_over_at_once(
        operator: Path, replicas: Replicas, namespace: str, cluster: dict[str, str]) -> None:
    leader = replicas.leader()
    (standby,) = replicas.others(leader)
    transitions = lease_json(replicas)["spec"].get("leaseTransitions", 0)
    audit = Audit(audit_log(cluster))
    apply(deployment(namespace, "k3-term"))
    wait_for("k3-term to converge", lambda: converged(namespace, "k3-term"), timeout=120)

    leader.kill(signal.SIGTERM)
    started, stopped_wall = time.monotonic(), datetime.now(UTC)
    seconds, failures = takeover(replicas, standby, started)
    print(f"\ntakeover after SIGTERM: {seconds:.1f}s")
    # Faster than the 15 s lease could expire: only a release explains it.
    assert seconds < 10
    assert failures == []
    assert leader.proc.wait(30) == 0, leader.tail()
    assert "released" in leader.log.read_text()
    assert lease_json(replicas)["spec"]["leaseTransitions"] == transitions + 1

    # The new leader acts: a spec change is applied by it, and by it alone.
    body = deployment(namespace, "k3-term")
    body["spec"]["pools"] = body["spec"]["pools"][:1]
    apply(body)

    def pruned() -> bool:
        names = {o["metadata"]["name"] for o in get_json("leaderworkersets", "-n", namespace)["items"]}
        return names == {"k3-term-a-aggregated"}

    wait_for("the removed pool to be pruned by the new leader", pruned, timeout=60)
    writes = audit.read()
    assert writers_in_turn(writes) == [leader.identity, standby.identity], writers_in_turn(writes)
    assert all(at(w) > stopped_wall for w in writes if w["identity"] == standby.identity)

    restarted = replicas.start(leader.slot)
    wait_for("the restarted replica to stand by", lambda: (restarted.health() or {}).get("role") == "standby")
    assert replicas.holder() == standby.identity
    kubectl("delete", "k3", "k3-term", "-n", namespace, "--wait=true", "--timeout=60s")
