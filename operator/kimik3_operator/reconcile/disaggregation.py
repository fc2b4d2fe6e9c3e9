"""The `Disaggregating` condition's measurements: every decode role's prompt tokens by source, read
from Prometheus (planner/disaggregation.py judges them).

A deployment is measured at most every CHECK_SECONDS, over the last WINDOW_SECONDS, whatever its
passes: a burst of child events asks nothing of Prometheus, and between checks its passes show the
last verdict (so its status, and the writes that follow a changed status, move at that pace too).
The verdict is kept in memory only: a new leader measures on its first pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..api.reasons import METRICS_UNAVAILABLE, NO_METRICS
from ..planner import Plan
from ..planner.disaggregation import PromptSources, Verdict, judge, judge_pool
from ..prometheus import NO_URL, Prometheus, PrometheusError
from ..render.names import Owner
from ..render.promql import prompt_tokens_query, selector

log = logging.getLogger(__name__)

CHECK_SECONDS = 30.0
WINDOW_SECONDS = 120
"""Long enough to hold a few requests of a lightly used deployment at a 30 s scrape interval,
short enough that a fix (or a breakage) shows within a few minutes."""

Key = tuple[str, str]


def decode_pools(plan: Plan) -> list[str]:
    """The pools with a decode role: the deployment disaggregates only where decode engines run."""
    return [pool.name for pool, role in plan.role_plans() if role.role == "decode"]


class DisaggregationProbe:
    def __init__(self, prometheus_url: str | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.prometheus_url = prometheus_url
        self._clock = clock
        self._last: dict[Key, tuple[float, Verdict]] = {}
        self._clients: dict[str, Prometheus] = {}

    def verdict(self, owner: Owner, plan: Plan) -> Verdict | None:
        """The deployment's verdict, measured again when the last one is CHECK_SECONDS old; None
        when it has no decode role (no condition)."""
        key = (owner.namespace, owner.name)
        pools = decode_pools(plan)
        if not pools:
            self._last.pop(key, None)
            return None
        now = self._clock()
        if (last := self._last.get(key)) is not None and now - last[0] < CHECK_SECONDS:
            return last[1]
        url = (plan.scaling.prometheus_url if plan.scaling else None) or self.prometheus_url
        if url is None:
            verdict = Verdict("Unknown", NO_METRICS, NO_URL)
        else:
            client = self._clients.setdefault(url, Prometheus(url))
            try:
                verdict = judge({pool: judge_pool(pool, self._sources(client, owner, pool), WINDOW_SECONDS)
                                 for pool in pools})
            except PrometheusError as exc:
                log.warning("Disaggregating of %s/%s: %s", owner.namespace, owner.name, exc)
                verdict = Verdict("Unknown", METRICS_UNAVAILABLE, str(exc))
        self._last[key] = (now, verdict)
        return verdict

    @staticmethod
    def _sources(client: Prometheus, owner: Owner, pool: str) -> PromptSources:
        matchers = selector(owner, pool, "decode")
        local, external = (client.scalar(prompt_tokens_query(source, matchers, WINDOW_SECONDS))
                           for source in ("local_compute", "external_kv_transfer"))
        return PromptSources(local_compute=local, external_kv_transfer=external)

    def forget_all_but(self, keys: set[Key]) -> None:
        self._last = {k: v for k, v in self._last.items() if k in keys}
