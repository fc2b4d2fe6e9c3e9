"""The liveness endpoint reports a wedged webhook: the webhook's accept loop beats on every turn,
and /healthz answers 503 once it has stopped beating (so the kubelet restarts the replica, and
readiness takes it out of the webhook Service meanwhile)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import aiohttp

from kimik3_operator.reconcile.health import HealthServer
from kimik3_operator.webhook import WebhookServer


def test_the_accept_loop_beats_until_it_stops(webhook: Callable[..., WebhookServer]) -> None:
    server = webhook()
    time.sleep(0.6)  # more than one poll interval without a caller
    assert server.alive(stale_seconds=0.6)
    server.shutdown()  # the loop stops turning, as a wedged one would
    time.sleep(0.7)
    assert not server.alive(stale_seconds=0.6)


def test_healthz_answers_503_while_the_webhook_is_wedged() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    wedged = False

    async def main() -> list[int]:
        health = HealthServer(f"http://127.0.0.1:{port}/healthz", lambda: {"role": "standby"}, lambda: not wedged)
        await health.start()
        try:
            codes = []
            async with aiohttp.ClientSession() as session:
                for state in (False, True):
                    nonlocal wedged
                    wedged = state
                    async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                        codes.append(response.status)
            return codes
        finally:
            await health.stop()

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [200, 503]
