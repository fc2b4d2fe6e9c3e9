"""Does a P/D deployment really disaggregate? The verdict behind the `Disaggregating` condition.

The failure users of every P/D stack report most is a deployment that is healthy but does not
disaggregate: the decode engines prefill every prompt themselves (the router sends requests
straight to decode, the KV transfer fails and vLLM recomputes, the NIXL side channel is
unreachable) and the prefill engines idle. Nothing crashes; it is only slow and costly.

vLLM 0.33.0 counts every prompt token an engine scheduled by where its KV came from:
`vllm:prompt_tokens_by_source{source=local_compute|local_cache_hit|external_kv_transfer}`
(vllm/v1/metrics/stats.py, PromptTokenStats; loggers.py). On a decode engine, external_kv_transfer
is what NIXL brought from a prefill engine and local_compute what it prefilled itself. Healthy, a
decode engine recomputes only the connector's backoff per request: the last prompt token for a
model with recurrent state (KDA), the drafter's lookahead with multi-module MTP
(nixl/base_scheduler.py, `_prefill_backoff`). Tokens found in its own prefix cache
(local_cache_hit) are neither and are left out. docs/disaggregation.md has the reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..api.reasons import (
    DECODE_RECOMPUTES_PROMPTS,
    METRICS_UNAVAILABLE,
    NO_KV_TRANSFERS,
    NO_METRICS,
    NO_TRAFFIC,
    PROMPTS_TRANSFERRED,
)

MIN_TRANSFERRED_SHARE = 0.8
"""Below this share of the prompt tokens a decode role did not find in its own prefix cache
arriving from prefill, it recomputes prompts. Healthy it is above 95% for prompts of 20 tokens or
more (a backoff of 1); 0.8 leaves room for short prompts and a drafter's lookahead, and still
catches one request in five prefilled on decode."""

Status = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class PromptSources:
    """A decode role's prompt tokens over the window, by source; None when Prometheus has no series."""

    local_compute: float | None
    external_kv_transfer: float | None


@dataclass(frozen=True)
class Verdict:
    status: Status
    reason: str
    message: str


RANK = {DECODE_RECOMPUTES_PROMPTS: 0, NO_KV_TRANSFERS: 0, METRICS_UNAVAILABLE: 1, NO_METRICS: 1,
        PROMPTS_TRANSFERRED: 2, NO_TRAFFIC: 3}
"""Which pool's verdict the deployment's condition takes: a pool that recomputes prompts, else one
that cannot be judged, else one that transfers (a pool without traffic is no news beside it)."""


def judge_pool(pool: str, seen: PromptSources, window_seconds: int) -> Verdict:
    """One decode role's verdict, with the measured share in its message."""
    within = f"in the last {window_seconds} s"
    if seen.local_compute is None and seen.external_kv_transfer is None:
        return Verdict("Unknown", NO_METRICS, f"pool {pool}: Prometheus has no vllm:prompt_tokens_by_source series "
                                              "of its decode engines (are they scraped?)")
    local, external = seen.local_compute or 0.0, seen.external_kv_transfer or 0.0
    total = local + external
    if total < 1:
        return Verdict("False", NO_TRAFFIC, f"pool {pool}: no prompt reached its decode engines {within}")
    share = external / total
    if external < 1:
        return Verdict("False", NO_KV_TRANSFERS,
                       f"pool {pool}: its decode engines prefilled every prompt themselves {within} and no KV "
                       "arrived from prefill: requests reach decode without a prefill (sent to a decode engine "
                       "directly, or a router not in PrefillDecode mode), or every KV transfer failed")
    percent = f"{100 * share:.0f}%"
    if share < MIN_TRANSFERRED_SHARE:
        return Verdict("False", DECODE_RECOMPUTES_PROMPTS,
                       f"pool {pool}: only {percent} of the prompt tokens its decode engines did not have cached "
                       f"arrived from prefill {within}; they computed the rest themselves (requests sent to a "
                       "decode engine directly, or KV transfers that failed and were recomputed)")
    return Verdict("True", PROMPTS_TRANSFERRED,
                   f"pool {pool}: {percent} of the prompt tokens its decode engines did not have cached "
                   f"arrived from prefill {within}")


def judge(pools: dict[str, Verdict]) -> Verdict:
    """The deployment's verdict from its decode pools' (by pool name): the most telling one's
    status and reason, every pool's message."""
    worst = min(pools.values(), key=lambda v: RANK[v.reason])
    return Verdict(worst.status, worst.reason, "; ".join(pools[name].message for name in sorted(pools)))

