"""The operator's replicas as host processes, the way the chart runs them: `kimik3 run
--leader-elect` with POD_NAME/POD_NAMESPACE as the downward API sets them, acting as the chart's
ServiceAccount. Like the kubelet, `start` runs a slot's process again (a new identity), and
`restart_exited` is the chart's `restartPolicy: Always` for processes that ended on their own.

A leader that cannot renew its Lease for the renew deadline exits on purpose (so that only one
replica ever acts; reconcile/runner.py `_exit_when_lost`), as controller-runtime's managers do. An
API server outage longer than that ends the leader's process, and on a cluster the kubelet starts
it again; a test that tolerates such an exit says so with `Exit.lease_lost`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .kube import get_json, kubectl, wait_for

# Loopback only, never through a proxy from the environment.
NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout: float = 2) -> str | None:
    """The body of a 200 answer from loopback, else None."""
    try:
        with NO_PROXY_OPENER.open(url, timeout=timeout) as response:
            return response.read().decode() if response.status == 200 else None
    except OSError:
        return None


def metric(url: str, name: str) -> float | None:
    """An unlabelled sample of the /metrics at `url`, None while it cannot be read."""
    body = http_get(url) or ""
    return next((float(line.split()[-1]) for line in body.splitlines() if line.startswith(f"{name} ")), None)


LEASE_LOST = "Leadership lost"  # the runner's last log line when it exits on a lost Lease


@dataclass(frozen=True)
class Exit:
    """A replica's process that ended."""
    slot: str
    identity: str
    returncode: int
    tail: str
    signalled: bool
    """A test sent it a signal (`Replica.kill`): the end was the test's doing."""

    @property
    def lease_lost(self) -> bool:
        """It exited on purpose, its Lease lost (exit status 1 after the runner's CRITICAL line)."""
        return self.returncode == 1 and LEASE_LOST in self.tail[-1000:]

    @property
    def crashed(self) -> bool:
        return not (self.signalled or self.lease_lost)

    def __str__(self) -> str:
        return f"replica {self.identity} exited with status {self.returncode}:\n{self.tail}"


@dataclass
class Replica:
    slot: str
    proc: subprocess.Popen[bytes]
    log: Path
    liveness: str
    metrics: str
    identity: str = ""
    signalled: bool = False

    def health(self) -> dict[str, Any] | None:
        body = http_get(self.liveness)
        return json.loads(body) if body else None

    def metric(self, name: str) -> float | None:
        """An unlabelled sample of this replica's /metrics, None while it cannot be read."""
        return metric(self.metrics, name)

    def leader_gauge(self) -> float | None:
        return self.metric("kimik3_operator_leader")

    def wait_resyncs(self, rounds: int, timeout: float = 60) -> None:
        """Wait until this replica has finished `rounds` more resync rounds, each of which
        reconciled every deployment once: "nothing changed over N passes" without guessing a sleep."""
        start = self.metric("kimik3_operator_resyncs_total") or 0.0
        wait_for(f"{rounds} more resync rounds by {self.slot}",
                 lambda: (self.metric("kimik3_operator_resyncs_total") or 0.0) >= start + rounds,
                 timeout=timeout, interval=0.5)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: signal.Signals) -> None:
        self.signalled = True
        self.proc.send_signal(sig)

    def tail(self) -> str:
        return self.log.read_text()[-4000:]


class Replicas:
    """Replicas of the operator sharing one Lease."""

    def __init__(self, folder: Path, kubeconfig: str, lease: str, lease_namespace: str,
                 env: dict[str, str], free_port: Any, extra_args: dict[str, list[str]] | None = None) -> None:
        self.folder, self.kubeconfig = folder, kubeconfig
        self.extra_args = extra_args or {}
        self.lease, self.lease_namespace = lease, lease_namespace
        self.env, self.free_port = env, free_port
        self.slots: dict[str, Replica] = {}
        self.lives = 0

    def start(self, slot: str) -> Replica:
        self.lives += 1
        log = self.folder / f"{slot}.{self.lives}.log"
        live_port, metrics_port = self.free_port(), self.free_port()
        env = {**self.env, "KUBECONFIG": self.kubeconfig, "POD_NAME": slot, "POD_NAMESPACE": self.lease_namespace}
        kimik3 = Path(sys.executable).with_name("kimik3")
        with log.open("w") as out:
            proc = subprocess.Popen(
                [str(kimik3), "run", "--leader-elect", f"--lease-name={self.lease}",
                 f"--liveness=http://127.0.0.1:{live_port}/healthz", f"--metrics-port={metrics_port}",
                 *self.extra_args.get(slot, [])],
                stdout=out, stderr=subprocess.STDOUT, env=env)
        replica = Replica(slot, proc, log, f"http://127.0.0.1:{live_port}/healthz",
                          f"http://127.0.0.1:{metrics_port}/metrics")

        def served() -> dict[str, Any] | None:
            assert replica.alive(), f"replica {slot} exited:\n{replica.tail()}"
            return replica.health()

        replica.identity = wait_for(f"replica {slot}'s liveness endpoint", served, timeout=60)["identity"]
        self.slots[slot] = replica
        return replica

    def holder(self) -> str:
        """The Lease's holderIdentity ("" when free or absent)."""
        lease = kubectl("-n", self.lease_namespace, "get", "lease", self.lease, "-o", "json", check=False)
        if lease.returncode != 0:
            return ""
        return str((json.loads(lease.stdout).get("spec") or {}).get("holderIdentity") or "")

    def leader(self, timeout: float = 60, kubelet: list[Exit] | None = None) -> Replica:
        """The replica that holds the Lease and says it leads (waits for one). With `kubelet`, the
        kubelet's part is played meanwhile: a replica whose process ends (its Lease lost in an
        outage, or killed) is started again, as `restartPolicy: Always` would, and its end is added
        to that list; without, a replica that ended stays down."""
        def find() -> Replica | None:
            if kubelet is not None:
                kubelet.extend(self.restart_exited())
            holder = self.holder()
            for replica in self.slots.values():
                if replica.identity == holder and replica.alive() and (replica.health() or {}).get("role") == "leader":
                    return replica
            return None
        return wait_for(f"a leader among {sorted(r.identity for r in self.slots.values())}", find, timeout=timeout)

    def start_all(self, slots: tuple[str, ...]) -> Replica:
        """Start every slot (as the Deployment's pods) and wait for one to lead."""
        for slot in slots:
            self.start(slot)
        return self.leader()

    def alive(self) -> bool:
        """Every replica's process still runs."""
        return all(r.alive() for r in self.slots.values())

    def restart_exited(self) -> list[Exit]:
        """The kubelet's `restartPolicy: Always`: start each slot whose process has ended again,
        and say how each ended."""
        ended = [Exit(r.slot, r.identity, r.proc.returncode, r.tail(), r.signalled)
                 for r in self.slots.values() if r.proc.poll() is not None]
        for gone in ended:
            self.start(gone.slot)
        return ended

    def tails(self) -> str:
        return "\n".join(f"--- {slot}\n{r.tail()}" for slot, r in self.slots.items())

    def others(self, leader: Replica) -> list[Replica]:
        return [r for r in self.slots.values() if r is not leader]

    def stop_all(self) -> None:
        for replica in self.slots.values():
            if replica.alive():
                replica.kill(signal.SIGTERM)
        for replica in self.slots.values():
            try:
                replica.proc.wait(40)
            except subprocess.TimeoutExpired:
                replica.proc.kill()
                replica.proc.wait(10)


def lease_json(replicas: Replicas) -> dict[str, Any]:
    return get_json("-n", replicas.lease_namespace, "lease", replicas.lease)  # type: ignore[no-any-return]
