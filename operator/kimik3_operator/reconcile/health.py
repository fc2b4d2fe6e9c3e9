"""The liveness endpoint, served by us rather than by kopf.

kopf's own `liveness_endpoint` starts with kopf and stops with it, but a standby replica runs no
kopf at all and must still answer its probes, and must go on answering while it becomes the
leader. So one small aiohttp server (aiohttp comes with kopf) answers from the first second to
the last; it runs on the operator's event loop, so a wedged loop fails the probe, which is what
kopf's endpoint checked too (the operator registers no kopf probe handlers). It also answers 503
when `healthy` says no (the webhook's accept loop stopped turning), so the probe restarts a replica
whose webhook is wedged and readiness takes it out of the webhook Service meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from urllib.parse import urlsplit

from aiohttp import web


class HealthServer:
    """GET <path> -> 200 {"role": ..., "identity": ...}; the role says whether this replica acts.
    503 with the same body when `healthy()` is false."""

    def __init__(self, endpoint: str, status: Callable[[], dict[str, str]],
                 healthy: Callable[[], bool] = lambda: True) -> None:
        url = urlsplit(endpoint)
        if url.scheme != "http" or not url.port:
            raise ValueError(f"liveness endpoint must be http://HOST:PORT/PATH, got {endpoint!r}")
        self._host, self._port, self._path = url.hostname or "0.0.0.0", url.port, url.path or "/healthz"
        self._status, self._healthy = status, healthy
        self._runner: web.AppRunner | None = None

    async def _handle(self, _: web.Request) -> web.Response:
        return web.Response(text=json.dumps(self._status()) + "\n", content_type="application/json",
                            status=200 if self._healthy() else 503)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(self._path, self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, self._host, self._port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
