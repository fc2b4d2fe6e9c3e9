"""A de-duplicating work queue on the operator's event loop, with client-go's workqueue rules.

A key waits in the queue at most once however often it is put; it is never handed to two
workers at once: a key put while its pass runs is handed out again when that pass is `done`, so
the change that came meanwhile gets a pass of its own. Workers take keys one at a time, so a slow
pass holds up only its own deployment (a batch drained together waited for its slowest pass).

`put_soon` coalesces a burst: the child events of one deployment (a LeaderWorkerSet's status as
each of its pods starts, its Service, its router's ReplicaSet) mostly come within a second of each
other, and each pass reads the informers' stores at its start, so one pass `window` seconds after
the first event sees them all. controller-runtime gets the same effect from its rate limiter's
per-item delay; kopf batches a resource's own events for 0.1 s (settings.batching.batch_window).
"""

from __future__ import annotations

import asyncio
from collections import deque

Key = tuple[str, str]


class WorkQueue:
    """Keys waiting for a pass, keys whose pass runs, and keys due soon."""

    def __init__(self) -> None:
        self._ready: deque[Key] = deque()
        self._dirty: set[Key] = set()
        """Waiting for a pass: in `_ready`, or to be put there when its running pass is done."""
        self._running: set[Key] = set()
        self._soon: set[Key] = set()
        self._wake = asyncio.Event()

    def put(self, key: Key) -> None:
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._running:
            self._ready.append(key)
            self._wake.set()

    def put_later(self, key: Key, delay: float) -> None:
        asyncio.get_running_loop().call_later(delay, self.put, key)

    def put_soon(self, key: Key, window: float) -> None:
        """Put `key` in `window` seconds, unless it is put already or due by then: the events of a
        burst share one pass."""
        if window <= 0:
            self.put(key)
            return
        if key in self._soon or (key in self._dirty and key not in self._running):
            return  # a pass that has not started yet will read this event's change

        def due() -> None:
            self._soon.discard(key)
            self.put(key)
        self._soon.add(key)
        asyncio.get_running_loop().call_later(window, due)

    async def get(self) -> Key:
        """The next key to reconcile; it is the caller's until `done`."""
        while not self._ready:
            self._wake.clear()
            await self._wake.wait()
        key = self._ready.popleft()
        self._dirty.discard(key)
        self._running.add(key)
        return key

    def done(self, key: Key) -> None:
        self._running.discard(key)
        if key in self._dirty:
            self._ready.append(key)
            self._wake.set()

    def __len__(self) -> int:
        return len(self._ready)
