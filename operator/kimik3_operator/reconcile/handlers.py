"""kopf wiring: thin handlers that hand every trigger to the one reconcile function.

Create, spec update and resume run the pass in the handler, so kopf's retry semantics apply
(PermanentError for a spec that cannot be served as written, TemporaryError for API trouble).
Child events and the periodic resync go through a de-duplicating queue drained by one worker,
so a burst of LeaderWorkerSet updates costs one pass. There is no kopf timer: timers make kopf
add a finalizer, which would block deleting a deployment while the operator is down.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import kopf

from ..api import GROUP, KIND, PLURAL, VERSION
from ..contract.kinds import CHILD_KINDS
from ..k8s import UNREACHABLE, Cluster, NotLeaderError, TransientApiError, WriteGuard, api_client
from ..metrics import APPLIES, DEPLOYMENT_SERIES, RECONCILE_ERRORS, RECONCILE_SECONDS, RESYNCS, PhaseBook
from ..render.names import MANAGED_BY
from .autoscaler import SloScaler
from .queue import WorkQueue
from .reconciler import Outcome, reconcile
from .settings import OperatorConfig

log = logging.getLogger(__name__)

RETRYABLE: tuple[type[Exception], ...] = (TransientApiError, *UNREACHABLE)
"""A pass cut short by the API server (throttled, restarting, unreachable): retried soon."""
RETRY_SOON: tuple[type[Exception], ...] = (*RETRYABLE, NotLeaderError)
"""Those, and a pass stopped because this replica may not write (it exits or renews within seconds)."""


class State:
    """What the handlers share, kept in kopf's memo rather than module globals."""

    def __init__(self, config: OperatorConfig, guard: WriteGuard | None = None) -> None:
        self.config = config
        self.cluster = Cluster(api_client(), guard)
        self.queue = WorkQueue()
        self.phases = PhaseBook()
        self.scaler = SloScaler(config.prometheus_url)
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

    def run(self, namespace: str, name: str) -> Outcome:
        """Reconcile one deployment; passes for the same deployment never overlap."""
        with self._guard:
            lock = self._locks.setdefault((namespace, name), threading.Lock())
        with lock:
            started, result = time.monotonic(), "error"
            try:
                outcome = reconcile(self.cluster, namespace, name, tools_image=self.config.tools_image,
                                    scaler=self.scaler)
                result = outcome.error.reason if outcome.error else "ok"
            except RETRYABLE:
                RECONCILE_ERRORS.labels("TransientApiError").inc()
                raise
            finally:
                RECONCILE_SECONDS.labels(result).observe(time.monotonic() - started)
            self.phases.record((namespace, name), outcome.phase)
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
    state = await asyncio.to_thread(State, config, memo.get("guard"))
    memo["state"] = state
    state.worker = asyncio.create_task(_drain(state), name="kimik3-resync")


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    state = memo.get("state")
    if state is not None and state.worker is not None:
        state.worker.cancel()


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
@kopf.on.resume(GROUP, VERSION, PLURAL)
def on_deployment(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    try:
        outcome = _state(memo).run(namespace, name)
    except RETRY_SOON as exc:
        # kopf's own delay for other exceptions is 60 s: a pass cut by an API server restart
        # would hold back the next spec change that long.
        raise kopf.TemporaryError(str(exc), delay=5) from exc
    if outcome.error is not None and not outcome.error.depends_on_nodes:
        # The status already says why; retrying the same spec cannot help. The periodic
        # resync still revisits it, so a node-dependent problem clears on its own.
        raise kopf.PermanentError(f"{outcome.error.reason}: {outcome.error.message}")


def _on_watched_children(handler: Any) -> Any:
    """`handler` for the events of our objects of every watched child kind."""
    for child in CHILD_KINDS:
        if child.watched:
            handler = kopf.on.event(child.group, child.version, child.plural,
                                    labels={"app.kubernetes.io/managed-by": MANAGED_BY})(handler)
    return handler


@_on_watched_children
async def on_child_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    for ref in body.metadata.get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(f"{GROUP}/"):
            _state(memo).queue.put((body.metadata["namespace"], ref["name"]))


async def _drain(state: State) -> None:
    """Reconcile queued deployments; every resync interval, all of them.

    The resync is due by the clock, not when the queue falls quiet: a deployment that keeps
    failing (requeued every retry interval) or a steady stream of child events would otherwise
    postpone every other deployment's drift repair and node re-plan forever.
    """
    loop = asyncio.get_running_loop()
    due = loop.time() + state.config.resync_seconds
    while True:
        scaler_wait, _ = state.scaler.next_due()
        keys = await state.queue.take(timeout=max(0.0, min(due - loop.time(), scaler_wait))) or set()
        keys |= state.scaler.next_due()[1]  # SLO-scaled deployments whose decision is due
        resync = loop.time() >= due
        if resync:
            due = loop.time() + state.config.resync_seconds
            try:
                listed = set(await asyncio.to_thread(state.cluster.list_deployments, state.config.namespaces))
                state.forget_all_but(listed)
                keys |= listed
            except Exception:
                log.exception("Listing KimiK3Deployments for resync failed")
                resync = False
        for namespace, name in sorted(keys):
            try:
                await asyncio.to_thread(state.run, namespace, name)
            except NotLeaderError as exc:
                log.warning("Reconcile of %s/%s stopped: %s", namespace, name, exc)
                state.queue.put_later((namespace, name), state.config.retry_seconds)
            except Exception:
                log.exception("Reconcile of %s/%s failed; retrying in %ss", namespace, name,
                              state.config.retry_seconds)
                state.queue.put_later((namespace, name), state.config.retry_seconds)
        if resync:
            # What a test or a dashboard waits on to know every deployment had one more pass.
            RESYNCS.inc()
