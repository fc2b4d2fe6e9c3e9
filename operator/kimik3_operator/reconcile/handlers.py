"""kopf wiring: thin handlers that hand every trigger to the one reconcile function.

Create, spec update and resume run the pass in the handler, so kopf's retry semantics apply
(PermanentError for a spec that cannot be served as written, TemporaryError for API trouble).
Child events (from the informers every pass reads from, k8s/cache.py) and the periodic resync
go through a de-duplicating queue (queue.py) that a few workers take keys from, so a burst of
LeaderWorkerSet updates costs one pass. There is no kopf timer: timers make kopf
add a finalizer, which would block deleting a deployment while the operator is down.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from typing import Any

import kopf

from ..api import GROUP, PLURAL, VERSION
from ..k8s import UNREACHABLE, Cluster, NotLeaderError, TransientApiError, WriteGuard, api_client
from ..k8s.cache import CacheNotSynced, ClusterCache
from ..k8s.cluster import api_time
from ..metrics import (
    APPLIES,
    CHILD_EVENTS,
    DEPLOYMENT_SERIES,
    RECONCILE_API_SECONDS,
    RECONCILE_ERRORS,
    RECONCILE_PURE_CPU_SECONDS,
    RECONCILE_PURE_SECONDS,
    RECONCILE_SECONDS,
    RESYNCS,
    TRANSIENT_API_ERROR,
    PhaseBook,
)
from .autoscaler import SloScaler
from .disaggregation import DisaggregationProbe
from .failing import FailureMemory
from .pass_memo import PassMemo
from .queue import WorkQueue
from .queueing import QueueProbe
from .reconciler import Outcome, Pass, reconcile
from .settings import OperatorConfig
from .status_pace import StatusPace

log = logging.getLogger(__name__)

RETRYABLE: tuple[type[Exception], ...] = (TransientApiError, CacheNotSynced, *UNREACHABLE)
"""A pass cut short by the API server (throttled, restarting, unreachable): retried soon."""
RETRY_SOON: tuple[type[Exception], ...] = (*RETRYABLE, NotLeaderError)
"""Those, and a pass stopped because this replica may not write (it exits or renews within seconds)."""


class State:
    """What the handlers share, kept in kopf's memo rather than module globals."""

    def __init__(self, config: OperatorConfig, guard: WriteGuard | None = None,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.config = config
        self.queue = WorkQueue()
        self._loop = loop
        # Held-back status writes are made by a pass queued on the loop: without one, none is held.
        self.pace = StatusPace() if loop is not None else None
        on_child = None
        if loop is not None:
            def on_child(namespace: str, name: str, kind: str) -> None:  # from an informer's thread
                CHILD_EVENTS.labels(kind).inc()
                loop.call_soon_threadsafe(self.queue.put_soon, (namespace, name), config.coalesce_seconds)
        self.cache = ClusterCache(api_client(), config.namespaces, on_child).start()
        self.cluster = Cluster(api_client(), guard, self.cache)
        self.phases = PhaseBook()
        self.scaler = SloScaler(config.prometheus_url)
        self.probe = DisaggregationProbe(config.prometheus_url)
        self.queues = QueueProbe()
        self.failures = FailureMemory()
        self.memo = PassMemo()
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()
        self.worker: asyncio.Task[None] | None = None

    def forget_all_but(self, keys: set[tuple[str, str]]) -> None:
        """Drop what is kept per deployment (its lock, its phase, its series) for deployments that are gone."""
        with self._guard:
            self._locks = {k: v for k, v in self._locks.items() if k in keys or v.locked()}
        self.phases.keep_only(keys)
        DEPLOYMENT_SERIES.keep_only(keys)
        self.scaler.forget_all_but(keys)
        self.probe.forget_all_but(keys)
        self.queues.forget_all_but(keys)
        self.failures.forget_all_but(keys)
        if self.pace is not None:
            self.pace.forget_all_but(keys)

    def run(self, namespace: str, name: str, body: dict[str, Any] | None = None) -> Outcome:
        """Reconcile one deployment (`body`: kopf's copy, fresher than the cache's); passes for the
        same deployment never overlap."""
        with self._guard:
            lock = self._locks.setdefault((namespace, name), threading.Lock())
        with lock:
            started, cpu, result = time.monotonic(), time.thread_time(), "error"
            api_time()  # from here on, this pass's
            try:
                outcome = reconcile(Pass(self.cluster, namespace, name, tools_image=self.config.tools_image,
                                         router_images=self.config.router_images,
                                         scaler=self.scaler, body=body, memo=self.memo, pace=self.pace,
                                         probe=self.probe, queues=self.queues, failure_memory=self.failures))
                result = outcome.error.reason if outcome.error else "ok"
            except RETRYABLE:
                RECONCILE_ERRORS.labels(TRANSIENT_API_ERROR).inc()
                raise
            finally:
                took, used = time.monotonic() - started, time.thread_time() - cpu
                waited, api_cpu = api_time()
                RECONCILE_SECONDS.labels(result).observe(took)
                RECONCILE_API_SECONDS.observe(waited)
                RECONCILE_PURE_SECONDS.observe(max(0.0, took - waited))
                RECONCILE_PURE_CPU_SECONDS.observe(max(0.0, used - api_cpu))
            self.phases.record((namespace, name), outcome.phase)
            if outcome.due is not None and self._loop is not None:
                self._loop.call_soon_threadsafe(self.queue.put_later, (namespace, name), outcome.due)
            if outcome.error:
                RECONCILE_ERRORS.labels(outcome.error.reason).inc()
            for action, keys in (("apply", outcome.applied), ("delete", outcome.deleted)):
                for key in keys:
                    APPLIES.labels(key.split("/", 1)[0], action).inc()
            return outcome


def _state(memo: kopf.Memo) -> State:
    return memo["state"]  # type: ignore[no-any-return]


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = memo.get("config") or OperatorConfig.from_env()
    config.apply(settings)
    # API discovery blocks: keep it off the loop. The guard is the leader election's, if any.
    state = await asyncio.to_thread(State, config, memo.get("guard"), asyncio.get_running_loop())
    memo["state"] = state
    state.worker = asyncio.create_task(_drain(state), name="kimik3-resync")


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    state = memo.get("state")
    if state is not None:
        if state.worker is not None:
            state.worker.cancel()
        state.cache.stop()


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
@kopf.on.resume(GROUP, VERSION, PLURAL)
def on_deployment(namespace: str, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    try:
        outcome = _state(memo).run(namespace, name, copy.deepcopy(dict(body)))
    except RETRY_SOON as exc:
        # kopf's own delay for other exceptions is 60 s: a pass cut by an API server restart
        # would hold back the next spec change that long.
        raise kopf.TemporaryError(str(exc), delay=5) from exc
    if outcome.error is not None and not outcome.error.depends_on_nodes:
        # The status already says why; retrying the same spec cannot help. The periodic
        # resync still revisits it, so a node-dependent problem clears on its own.
        raise kopf.PermanentError(f"{outcome.error.reason}: {outcome.error.message}")


SCALER_HOLD_SECONDS = 1.0
"""A deployment whose scaling decision was due and queued is not queued for it again sooner."""


class ResyncRound:
    """Whether every deployment listed at a resync has had a pass that started after it: what
    RESYNCS counts, which a test or a dashboard waits on to know each had one more pass."""

    def __init__(self, every: float = 0.0) -> None:
        self._waiting: set[tuple[str, str]] = set()
        self._since: float | None = None
        self._every = every
        """Rounds begin at most this often (with nothing listed, one would end at every look)."""

    def begin(self, keys: set[tuple[str, str]], now: float) -> None:
        """A round begins unless one is still under way (a pass slower than the resync interval
        would otherwise keep every round from ending) or began less than `every` ago. Deployments
        gone meanwhile are no longer waited for: a deleted one that was not due yet would never
        have its pass, and no round would end again."""
        if self._waiting:
            self._waiting &= keys
            if not self._waiting:
                RESYNCS.inc()
            return
        if self._since is not None and now - self._since < self._every:
            return
        self._waiting, self._since = set(keys), now
        if not keys:
            RESYNCS.inc()

    def passed(self, key: tuple[str, str], started: float) -> None:
        if key in self._waiting and self._since is not None and started >= self._since:
            self._waiting.discard(key)
            if not self._waiting:
                RESYNCS.inc()


RESYNC_TICKS = 4
"""Looks per resync interval for deployments whose last pass is that old."""


async def _drain(state: State) -> None:
    """Reconcile queued deployments with `config.workers` workers; queue each deployment whose
    last pass started a resync interval ago or longer, and SLO-scaled deployments whose decision
    is due.

    The resync is due by the clock, not when the queue falls quiet: a deployment that keeps
    failing (requeued every retry interval) or a steady stream of child events would otherwise
    postpone every other deployment's drift repair and node re-plan forever. It is due per
    deployment, a resync interval after its last pass: a deployment whose children just started a
    pass has nothing to gain from another, and a fleet coming up is not queued whole behind its
    own child events every interval (bench/control_plane.py at 300 deployments: a round queued all
    300 every 30 s, up to 3,000 of a bring-up's 5,537 passes, and the events that move a
    deployment on waited behind them). So a deployment gets a pass at least every resync interval
    and a quarter. Several deployments are reconciled at once (a pass mostly waits on the API
    server), one deployment never twice at once (the queue's rule, and State.run's lock).
    """
    loop = asyncio.get_running_loop()
    resync = state.config.resync_seconds
    tick = resync / RESYNC_TICKS
    round_ = ResyncRound(every=resync - tick / 2)
    passed = asyncio.Event()
    last: dict[tuple[str, str], float] = {}
    workers = [asyncio.create_task(_worker(state, round_, passed, last), name=f"kimik3-worker-{i}")
               for i in range(state.config.workers)]
    try:
        due = loop.time() + tick
        while True:
            scaler_wait, scaling = state.scaler.next_due(hold=SCALER_HOLD_SECONDS)
            for key in sorted(scaling):
                state.queue.put(key)
            try:  # a pass may have set a scaling decision due sooner: look again after each
                await asyncio.wait_for(passed.wait(), max(0.0, min(due - loop.time(), scaler_wait)))
            except TimeoutError:
                pass
            passed.clear()
            if (now := loop.time()) >= due:
                due = now + tick
                listed = set(state.cache.deployment_keys())
                state.forget_all_but(listed)
                for gone in set(last) - listed:
                    del last[gone]
                round_.begin(listed, now)
                for key in sorted(listed):
                    # Half a tick of slack: a pass that started just after the last look is due at this one.
                    if now - last.get(key, float("-inf")) >= resync - tick / 2:
                        state.queue.put(key)
    finally:
        for worker in workers:
            worker.cancel()


async def _worker(state: State, round_: ResyncRound, passed: asyncio.Event,
                  last: dict[tuple[str, str], float]) -> None:
    loop = asyncio.get_running_loop()
    while True:
        key = await state.queue.get()
        started = last[key] = loop.time()
        try:
            await asyncio.to_thread(state.run, *key)
        except NotLeaderError as exc:
            log.warning("Reconcile of %s/%s stopped: %s", *key, exc)
            state.queue.put_later(key, state.config.retry_seconds)
        except Exception:
            log.exception("Reconcile of %s/%s failed; retrying in %ss", *key, state.config.retry_seconds)
            state.queue.put_later(key, state.config.retry_seconds)
        finally:
            state.queue.done(key)
            round_.passed(key, started)
            passed.set()
