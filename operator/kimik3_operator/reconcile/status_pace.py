"""How often one deployment's status is written while only its counts and messages move.

A bring-up moves the status many times within seconds: the staging pod starts, the LeaderWorkerSet
reports its groups updated, then ready, the router's pods come up one by one. Written each time,
that was 7.3 status writes per deployment (bench/control_plane.py, 300 deployments), each a
server-side apply of the whole status that the API server merges and sends to every watcher of
the resource (kopf's and the operator's own informers among them).

So a change of the story is written at once: the phase, a condition's status or reason, the
observed generation (what `kubectl wait`, dashboards, Events and the tests follow); so is every
status of a pass in which the SLO scaler decided (its memory, the last scale and since when a
target is breached, lives in the status and must not be lost to a held-back write). A change of
counts, messages or progress alone is written once PACE_SECONDS have passed since this
deployment's last status write: the pass that found it asks to be run again then (Outcome.
due), and that pass writes what is true at that moment, if it still differs. Kubernetes'
own controllers write each change; the kubelet's status manager batches the same way for the same
reason.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ..api import KimiK3DeploymentStatus

PACE_SECONDS = 5.0

Key = tuple[str, str]


def story(status: KimiK3DeploymentStatus) -> tuple[object, ...]:
    """What a status says, without its counts and messages."""
    return (status.phase, status.observed_generation,
            tuple(sorted((c.type, c.status, c.reason) for c in status.conditions)))


class StatusPace:
    """The time of each deployment's last status write by this process."""

    def __init__(self, seconds: float = PACE_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds, self._clock = seconds, clock
        self._lock = threading.Lock()
        self._written: dict[Key, float] = {}

    def wait(self, key: Key, previous: KimiK3DeploymentStatus | None, status: KimiK3DeploymentStatus) -> float:
        """Seconds until `status` may replace `previous`; 0 to write it now."""
        if previous is None or story(previous) != story(status):
            return 0.0
        with self._lock:
            last = self._written.get(key)
        return 0.0 if last is None else max(0.0, last + self.seconds - self._clock())

    def wrote(self, key: Key) -> None:
        with self._lock:
            self._written[key] = self._clock()

    def forget_all_but(self, keys: set[Key]) -> None:
        with self._lock:
            self._written = {k: v for k, v in self._written.items() if k in keys}
