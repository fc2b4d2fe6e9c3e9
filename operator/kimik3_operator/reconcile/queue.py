"""A de-duplicating work queue on the operator's event loop (the controller-runtime idea)."""

from __future__ import annotations

import asyncio

Key = tuple[str, str]


class WorkQueue:
    """Keys put while a batch is pending collapse into one; `take` returns them all at once."""

    def __init__(self) -> None:
        self._pending: set[Key] = set()
        self._wake = asyncio.Event()

    def put(self, key: Key) -> None:
        self._pending.add(key)
        self._wake.set()

    def put_later(self, key: Key, delay: float) -> None:
        asyncio.get_running_loop().call_later(delay, self.put, key)

    async def take(self, timeout: float) -> set[Key] | None:
        """Wait up to `timeout` seconds for keys; None when the wait timed out empty."""
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except TimeoutError:
            return None
        self._wake.clear()
        keys, self._pending = self._pending, set()
        return keys
