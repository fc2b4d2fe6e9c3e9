"""Leader election on a coordination.k8s.io/v1 Lease, the way client-go's leaderelection does it.

Why our own: kopf's peering (the KopfPeering resource) pauses every operator when peers of equal
priority meet; it does not elect one of them. Two replicas of this operator therefore agree on a
Lease: the holder acts, the other stands by.

The rules (client-go's, with its default timings: lease 15 s, renew deadline 10 s, retry 2 s):

- A candidate takes the Lease only when it has no holder, or when the candidate has seen the very
  same record (same resourceVersion) for a whole `leaseDurationSeconds` on its own monotonic
  clock. It never compares `renewTime` with its wall clock, so clock skew between nodes cannot
  make two leaders.
- Every write is a create or a PUT carrying the resourceVersion that was read: of two candidates
  racing for one version, the API server lets one win and answers the other 409.
- The leader renews every retry period. When it has not renewed for `renew_deadline` it must stop
  acting at once: a standby may take over only `lease_seconds` after it last saw a change, so the
  old leader has stopped for at least `lease_seconds - renew_deadline` (5 s) before the new one acts.
- On a graceful stop the leader releases the Lease (no holder, 1 s duration) so the standby takes
  over on its next retry instead of waiting out the lease.
- Every write this replica sends first asks the elector's `WriteGuard` (k8s/cluster.py does, for
  every request but a read): it says no from `renew_deadline` after the last renewal began, and
  for good once the holder revokes it (leadership lost, or renewals about to stop on shutdown). A
  write is thus never sent when a standby could hold the Lease, however long a reconcile pass runs
  and whatever the pod's grace period.

The decisions are small pure functions (unit-tested); `LeaseLock` is the only I/O, and
`LeaderElector` runs it on a thread of its own, so reconcile passes that fill the default thread
pool can never delay a renewal.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class LeaseConfig:
    name: str
    namespace: str
    identity: str
    lease_seconds: int = 15
    """How long a standby waits, after it last saw the Lease change, before it may take it."""
    renew_deadline: float = 10.0
    """The leader stops acting when it could not renew for this long (< lease_seconds)."""
    retry_period: float = 2.0
    """How often the leader renews and a standby tries to acquire."""
    request_timeout: float = 5.0
    """Timeout of one API call, so a hung connection cannot outlive the renew deadline."""

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_seconds:
            raise ValueError("need 0 < retry_period < renew_deadline < lease_seconds")


# ---- pure decisions -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Observation:
    """The Lease record a candidate last saw, and when it first saw it (its monotonic clock)."""

    version: str
    holder: str
    lease_seconds: float
    since: float


def observe(previous: Observation | None, lease: dict[str, Any], now: float) -> Observation:
    """Restart the clock when the record changed (a new resourceVersion), else keep it."""
    version = str((lease.get("metadata") or {}).get("resourceVersion") or "")
    if previous is not None and previous.version == version:
        return previous
    spec = lease.get("spec") or {}
    return Observation(version=version, holder=spec.get("holderIdentity") or "",
                       lease_seconds=float(spec.get("leaseDurationSeconds") or 0), since=now)


def held_by_other(seen: Observation, me: str, now: float) -> bool:
    """Someone else holds the Lease and we have not seen it sit unrenewed for its duration."""
    return bool(seen.holder) and seen.holder != me and now < seen.since + seen.lease_seconds


def micro_time(at: datetime) -> str:
    """A Kubernetes MicroTime."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def claimed(spec: dict[str, Any], me: str, lease_seconds: int, at: datetime) -> dict[str, Any]:
    """The spec that renews the Lease for `me`, or takes it (a new acquireTime and, unless the
    Lease is new, one more transition)."""
    stamp = micro_time(at)
    if spec.get("holderIdentity") == me:
        return {**spec, "leaseDurationSeconds": lease_seconds, "renewTime": stamp}
    transitions = int(spec.get("leaseTransitions") or 0) + (1 if spec else 0)
    return {**spec, "holderIdentity": me, "leaseDurationSeconds": lease_seconds, "acquireTime": stamp,
            "renewTime": stamp, "leaseTransitions": transitions}


def released(spec: dict[str, Any], at: datetime) -> dict[str, Any]:
    """The spec that frees the Lease: no holder, so a standby may take it at once."""
    return {**spec, "holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": micro_time(at)}


def renew_overdue(last_renew: float, now: float, renew_deadline: float) -> bool:
    return now - last_renew >= renew_deadline


class NotLeaderError(Exception):
    """A write refused before it was sent: this replica may no longer act. The pass stops here;
    the next leader's passes redo whatever this one left undone."""


class WriteGuard:
    """Whether this replica may still write.

    Yes until `until` (on the monotonic clock: the renew deadline after the last renewal began),
    and never again once revoked. It is read from the clock at every write, not set by the loop
    that notices a lost Lease, so a write is refused on time even when that loop is busy. A standby
    may take the Lease no earlier than `lease_seconds` after our last renewal, which leaves a write
    sent just before the deadline `lease_seconds - renew_deadline` (5 s) to arrive.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until = float("-inf")
        self._revoked: str | None = None
        self._lock = threading.Lock()

    def extend(self, until: float) -> None:
        with self._lock:
            self._until = max(self._until, until)

    def revoke(self, reason: str) -> None:
        with self._lock:
            self._revoked = self._revoked or reason

    def check(self) -> None:
        """Raise NotLeaderError unless a write may be sent now."""
        with self._lock:
            if self._revoked:
                raise NotLeaderError(f"not writing: {self._revoked}")
            if self._clock() >= self._until:
                raise NotLeaderError("not writing: the lease was not renewed within its renew deadline")


# ---- I/O ----------------------------------------------------------------------------------------

class LeaseLock:
    """The Lease object as the API server's JSON: get, create, and PUT guarded by resourceVersion
    (None when another candidate wrote first)."""

    def __init__(self, api: client.ApiClient, cfg: LeaseConfig) -> None:
        self._coord, self._cfg = client.CoordinationV1Api(api), cfg

    def get(self) -> dict[str, Any] | None:
        try:
            return _json(self._coord.read_namespaced_lease(
                self._cfg.name, self._cfg.namespace, _request_timeout=self._cfg.request_timeout,
                _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, spec: dict[str, Any]) -> dict[str, Any] | None:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self._cfg.name, "namespace": self._cfg.namespace}, "spec": spec}
        try:
            return _json(self._coord.create_namespaced_lease(
                self._cfg.namespace, body, _request_timeout=self._cfg.request_timeout,
                _preload_content=False))
        except ApiException as exc:
            if exc.status == 409:
                return None  # another candidate created it first
            raise

    def replace(self, lease: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any] | None:
        """PUT `spec` onto `lease`; its metadata.resourceVersion makes a stale write fail."""
        meta = {k: v for k, v in lease["metadata"].items() if k != "managedFields"}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}
        try:
            return _json(self._coord.replace_namespaced_lease(
                self._cfg.name, self._cfg.namespace, body, _request_timeout=self._cfg.request_timeout,
                _preload_content=False))
        except ApiException as exc:
            if exc.status == 409:
                return None  # written since we read it
            raise


def _json(response: Any) -> dict[str, Any]:
    """The body exactly as the server sent it (no round trip through the client's models, which
    would rewrite MicroTime values)."""
    return json.loads(response.data)  # type: ignore[no-any-return]


class LeaderElector:
    """One candidate for one Lease. `acquire` blocks until we lead; `hold` renews until we lose."""

    def __init__(self, lock: LeaseLock, cfg: LeaseConfig,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._lock, self._cfg, self._clock, self._wall = lock, cfg, clock, wall
        self._seen: Observation | None = None
        self._ours: dict[str, Any] | None = None  # the Lease as our last successful write left it
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lease")
        self.renewed_at = float("-inf")  # when our last successful round began (our clock)
        self.guard = WriteGuard(clock)
        """What every write of this replica asks first (see the module's docstring)."""

    @property
    def identity(self) -> str:
        return self._cfg.identity

    @property
    def holder(self) -> str:
        """Who held the Lease when we last looked."""
        return self._seen.holder if self._seen else ""

    def try_acquire_or_renew(self) -> bool:
        """One round: True when we hold the Lease afterwards."""
        me, now = self._cfg.identity, self._clock()
        if self._ours is not None:
            # Fast path while leading: PUT on our own last write; a 409 means someone wrote since.
            if (written := self._lock.replace(self._ours, claimed(self._ours["spec"], me,
                                                                    self._cfg.lease_seconds,
                                                                    self._wall()))) is not None:
                return self._won(written, now)
            self._ours = None
        lease = self._lock.get()
        if lease is None:
            created = self._lock.create(claimed({}, me, self._cfg.lease_seconds, self._wall()))
            return created is not None and self._won(created, now)
        self._seen = observe(self._seen, lease, now)
        if held_by_other(self._seen, me, now):
            return False
        written = self._lock.replace(lease, claimed(lease.get("spec") or {}, me, self._cfg.lease_seconds,
                                                    self._wall()))
        return written is not None and self._won(written, now)

    def _won(self, lease: dict[str, Any], now: float) -> bool:
        self._ours = lease
        self._seen = observe(self._seen, lease, now)
        # From when the round began, not when it returned: a standby may have seen it that early.
        self.renewed_at = now
        self.guard.extend(now + self._cfg.renew_deadline)
        return True

    def release(self) -> bool:
        """Free the Lease if we still hold it as we last wrote it; True when it was freed."""
        if self._ours is None:
            return False
        ours, self._ours = self._ours, None
        return self._lock.replace(ours, released(ours["spec"], self._wall())) is not None

    async def _call(self, fn: Callable[[], bool], timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(self._pool, fn), max(timeout, 0.001))
        except TimeoutError:
            log.warning("Lease %s/%s: no answer within %.1fs", self._cfg.namespace, self._cfg.name, timeout)
        except ApiException as exc:  # e.g. 403 before the Role exists: one failed round, not the end
            log.warning("Lease %s/%s: %s %s", self._cfg.namespace, self._cfg.name, exc.status, exc.reason)
        except Exception as exc:  # noqa: BLE001 - connection trouble: likewise
            log.warning("Lease %s/%s: %s", self._cfg.namespace, self._cfg.name, exc)
        return False

    def _pause(self) -> float:
        return self._cfg.retry_period * (1 + 0.2 * random.random())

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Try every retry period until we hold the Lease (True) or `stop` is set (False)."""
        logged = ""
        while not stop.is_set():
            if await self._call(self.try_acquire_or_renew, self._cfg.renew_deadline):
                log.info("Lease %s/%s acquired by %s", self._cfg.namespace, self._cfg.name, self.identity)
                return True
            if self.holder and self.holder != logged:
                log.info("Standing by: lease %s/%s is held by %s", self._cfg.namespace, self._cfg.name,
                         self.holder)
                logged = self.holder
            try:
                await asyncio.wait_for(stop.wait(), self._pause())
            except TimeoutError:
                pass
        return False

    async def hold(self) -> str:
        """Renew every retry period after `acquire`; return why leadership ended (it never ends
        otherwise)."""
        while True:
            await asyncio.sleep(self._cfg.retry_period)
            deadline = self.renewed_at + self._cfg.renew_deadline
            if await self._call(self.try_acquire_or_renew, deadline - self._clock()):
                continue
            if self.holder and self.holder != self.identity:
                return f"lease taken by {self.holder}"
            if renew_overdue(self.renewed_at, self._clock(), self._cfg.renew_deadline):
                return f"lease not renewed for {self._cfg.renew_deadline:g}s"

    async def step_down(self, timeout: float) -> bool:
        """Release the Lease (bounded by `timeout`); True when the standby may take it at once."""
        return await self._call(self.release, timeout)


def default_lease_namespace() -> str:
    """$POD_NAMESPACE, else the service account's namespace in a pod, else the kubeconfig
    context's namespace, else "default"."""
    if ns := os.environ.get("POD_NAMESPACE"):
        return ns
    if IN_CLUSTER_NAMESPACE.is_file():
        return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
    try:
        _, context = config.list_kube_config_contexts(config_file=os.environ.get("KUBECONFIG"))
    except (config.ConfigException, OSError):
        return "default"
    return str(((context or {}).get("context") or {}).get("namespace") or "default")
