"""The liveness endpoint reports a dead webhook: the webhook's accept loop runs on the operator's
event loop (which /healthz itself proves turning), and /healthz answers 503 once the accept loop
has stopped (so the kubelet restarts the replica, and readiness takes it out of the webhook
Service meanwhile)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import aiohttp

from kimik3_operator.reconcile.health import HealthServer

from .harness import RunningWebhook


def test_the_accept_loop_is_alive_until_it_stops(webhook: Callable[..., RunningWebhook]) -> None:
    server = webhook()
    time.sleep(0.6)  # a while without a caller
    assert server.alive()
    server.shutdown()  # the accept loop ends, as a crashed one would
    assert not server.alive()


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
