"""The periodic resync keeps its clock: a deployment that fails on every pass (and is requeued
every retry interval) must not postpone the other deployments' passes."""

from __future__ import annotations

import asyncio
from collections import Counter

from kimik3_operator.reconcile.handlers import _drain
from kimik3_operator.reconcile.queue import WorkQueue
from kimik3_operator.reconcile.settings import OperatorConfig


class _Cluster:
    def list_deployments(self, namespaces: tuple[str, ...]) -> list[tuple[str, str]]:
        return [("ns", "broken"), ("ns", "fine")]


class _State:
    def __init__(self) -> None:
        self.config = OperatorConfig(resync_seconds=0.2, retry_seconds=0.02)
        self.queue = WorkQueue()
        self.cluster = _Cluster()
        self.runs: Counter[str] = Counter()

    def run(self, namespace: str, name: str) -> None:
        self.runs[name] += 1
        if name == "broken":
            raise RuntimeError("fails every pass")


def test_a_failing_deployment_does_not_starve_the_resync() -> None:
    state = _State()

    async def main() -> None:
        state.queue.put(("ns", "broken"))
        task = asyncio.create_task(_drain(state))  # type: ignore[arg-type]
        await asyncio.sleep(1.1)
        task.cancel()

    asyncio.run(main())
    assert state.runs["broken"] > 10  # retried every 20 ms
    assert 4 <= state.runs["fine"] <= 6  # and still resynced every 200 ms with the others
