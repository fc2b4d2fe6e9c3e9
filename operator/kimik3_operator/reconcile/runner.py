"""Run the operator: kopf's loop with our handlers, alone or as one of several replicas.

With leader election (`OperatorConfig.lease`), a replica first stands by: it serves its liveness
endpoint and metrics (`kimik3_operator_leader` 0) and tries for the Lease every retry period. Once
it holds the Lease it starts kopf in the same event loop and keeps renewing. The ends:

- SIGTERM/SIGINT: kopf stops gracefully, the reconcile passes already running finish (bounded by
  `DRAIN_SECONDS`, still renewing meanwhile), then the elector's WriteGuard is revoked and
  renewals stop; the Lease is released when every pass finished (the standby takes over on its
  next retry), else left to expire. Exit 0. A standby that is told to stop simply exits 0.
- Leadership lost (no renewal for the renew deadline, or someone else holds the Lease): the
  process exits 1 at once, like client-go's OnStoppedLeading. The pod restarts and stands by.

Either way a pass that outlives the end (a reconcile pass on a worker thread cannot be cancelled)
sends no further write: the guard refuses it (NotLeaderError) from the renew deadline on, or from
the revocation, whichever comes first, however long the pod's grace period. The chart's
terminationGracePeriodSeconds (`GRACE_SECONDS`) leaves room for the drain and the release.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Protocol

import kopf
from kopf._core.engines.peering import Identity as KopfIdentity  # not re-exported by kopf

from ..k8s import api_client
from ..k8s.identity import IDENTITY
from ..k8s.lease import LeaderElector, LeaseLock, WriteGuard
from ..metrics import LEADER, serve_metrics
from . import (
    handlers,  # noqa: F401 - registers the handlers with kopf's default registry
    login,  # noqa: F401 - kopf's requests carry our identity in their User-Agent
)
from .health import HealthServer
from .settings import OperatorConfig

log = logging.getLogger(__name__)

DRAIN_SECONDS = 20.0
"""How long a stopping leader waits for running reconcile passes before it releases the Lease."""
GRACE_SECONDS = 30
"""The pod's terminationGracePeriodSeconds in the chart: the drain, then the release (bounded by
the Lease's request timeout), with a few seconds to spare. A shorter grace is no danger (the
guard, not the kill, stops the writes) but leaves the Lease to expire instead of handing it over."""


LOG_FORMATS = {"text": kopf.LogFormat.FULL, "json": kopf.LogFormat.JSON}
"""--log-format: kopf's formatter for every logger (ours and kopf's); json is one object a line,
with the object's reference (kind, namespace, name, uid) under `k8s` in kopf's per-object lines."""


class Service(Protocol):
    """Something that runs beside kopf on the operator's loop in every replica, leader or not
    (the webhook, its certificate keeper): started after the liveness endpoint, stopped last."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def run_operator(config: OperatorConfig, *, liveness: str | None, log_level: str = "INFO", log_format: str = "text",
                 standalone: bool = True, healthy: Callable[[], bool] | None = None,
                 services: Sequence[Service] = ()) -> int:
    """Run until told to stop; the process exit code. `healthy` (the webhook's) joins the liveness
    answer."""
    kopf.configure(verbose=log_level == "DEBUG", log_format=LOG_FORMATS[log_format], log_refkey="k8s")
    logging.getLogger().setLevel(log_level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # liveness probes every few seconds
    return asyncio.run(_Replica(config, liveness, standalone, healthy, services).run())


class _Replica:
    def __init__(self, config: OperatorConfig, liveness: str | None, standalone: bool,
                 healthy: Callable[[], bool] | None = None, services: Sequence[Service] = ()) -> None:
        self.config, self.standalone, self.services = config, standalone, services
        self.stop = asyncio.Event()
        self.leading = False
        self.guard: WriteGuard | None = None
        self.healthy = healthy or (lambda: True)
        self.health = HealthServer(liveness, self._status, self.healthy) if liveness else None
        # Our own default pool (set as the loop's in `run`), so a stopping leader can wait for
        # the reconcile passes running on it; kopf's sync handlers run on kopf's own pool.
        self.pool = ThreadPoolExecutor(max_workers=min(32, (os.cpu_count() or 1) + 4),
                                       thread_name_prefix="reconcile")
        self.kopf_pool: Executor | None = None

    def _status(self) -> dict[str, str]:
        return {"role": "leader" if self.leading else "standby", "identity": IDENTITY,
                "health": "ok" if self.healthy() else "webhook stalled"}

    def _on_signal(self, signum: int) -> None:
        log.info("%s received: stopping", signal.Signals(signum).name)
        self.stop.set()

    def _trap_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum)

    async def run(self) -> int:
        asyncio.get_running_loop().set_default_executor(self.pool)
        self._trap_signals()
        if self.config.metrics_port:
            serve_metrics(self.config.metrics_port)
        LEADER.set(0)
        if self.health is not None:
            await self.health.start()
        for service in self.services:
            await service.start()
        try:
            if self.config.lease is None:
                self.leading = True
                LEADER.set(1)
                await self._kopf()
                return 0
            return await self._elected()
        finally:
            LEADER.set(0)
            for service in reversed(self.services):
                await service.stop()
            if self.health is not None:
                await self.health.stop()

    async def _elected(self) -> int:
        cfg = self.config.lease
        assert cfg is not None
        elector = LeaderElector(LeaseLock(await asyncio.to_thread(api_client), cfg), cfg)
        log.info("Leader election on lease %s/%s as %s", cfg.namespace, cfg.name, cfg.identity)
        if not await elector.acquire(self.stop):
            return 0  # stopped while standing by: nothing to hand over
        self.leading = True
        self.guard = elector.guard
        LEADER.set(1)
        holding = asyncio.create_task(elector.hold(), name="kimik3-lease")
        exit_when_lost = functools.partial(_exit_when_lost, elector.guard)
        holding.add_done_callback(exit_when_lost)
        try:
            await self._kopf()
        finally:
            idle = await _wait_idle([e for e in (self.kopf_pool, self.pool) if e], DRAIN_SECONDS)
            # Renewals stop next: from here on no write is sent, even by a pass still running.
            elector.guard.revoke("the operator is shutting down")
            holding.remove_done_callback(exit_when_lost)
            holding.cancel()
            self.leading = False
            LEADER.set(0)
            if not idle:
                log.warning("Reconcile passes still running after %ss: not releasing the lease; "
                            "the standby takes over when it expires", DRAIN_SECONDS)
            elif await elector.step_down(cfg.request_timeout):
                log.info("Lease %s/%s released", cfg.namespace, cfg.name)
        return 0

    async def _kopf(self) -> None:
        """kopf until `stop` is set. spawn_tasks + run_tasks is kopf.operator() with two changes:
        kopf installs its own signal handlers, and ours must stay (they set kopf's stop flag); and
        kopf is told our identity. Left to itself it calls `getpass.getuser()`
        (kopf/_core/engines/peering.py, detect_own_id), which raises KeyError under a uid with no
        passwd entry: the image's 65532, or any uid a platform's policy assigns. That crash-looped
        every operator pod under a real container runtime."""
        settings = kopf.OperatorSettings()
        self.kopf_pool = settings.execution.executor
        existing = asyncio.all_tasks()  # ours (health, lease): kopf must not cancel them on exit
        tasks = await kopf.spawn_tasks(
            settings=settings, standalone=self.standalone, clusterwide=not self.config.namespaces,
            namespaces=self.config.namespaces, liveness_endpoint=None, stop_flag=self.stop,
            identity=KopfIdentity(IDENTITY),
            memo=kopf.Memo(config=self.config, guard=self.guard))
        self._trap_signals()
        await kopf.run_tasks(tasks, ignored=existing)


def _exit_when_lost(guard: WriteGuard, task: asyncio.Task[str]) -> None:
    if task.cancelled():
        return
    reason = task.exception() or task.result()
    guard.revoke(f"leadership lost ({reason})")
    log.critical("Leadership lost (%s): exiting now so that only one replica acts", reason)
    LEADER.set(0)
    logging.shutdown()
    os._exit(1)


async def _wait_idle(executors: list[Executor], timeout: float) -> bool:
    """Shut the pools down and wait (bounded) for the work already on them; True when done."""
    done = threading.Event()

    def shut() -> None:
        for executor in executors:
            executor.shutdown(wait=True)
        done.set()

    threading.Thread(target=shut, name="drain", daemon=True).start()
    deadline = time.monotonic() + timeout
    while not done.is_set() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return done.is_set()
