"""The Prometheus queries the scalers read, per role, over vLLM's own metric names.

The series of one role are told apart by the labels every serving pod carries, as a scrape copies
them onto the series (contract.names.SERIES_LABELS): the chart's PodMonitor relabels them so, and
so does the e2e pod runner's file-based discovery. Metric names: vLLM 0.33.0 vllm/v1/metrics/loggers.py
(docs/vllm-facts.md "Metrics"; counters gain `_total`, histograms `_bucket`).
"""

from __future__ import annotations

from ..api.spec import ScalingMetric
from ..contract.names import SERIES_LABELS
from .names import LABEL_DEPLOYMENT, LABEL_POOL, LABEL_ROLE, Owner, deployment_label

LATENCY_HISTOGRAMS = {"ttft": "vllm:time_to_first_token_seconds", "itl": "vllm:inter_token_latency_seconds"}
QUANTILE = 0.9

ADAPTER_METRICS: dict[ScalingMetric, str] = {
    "RequestsInFlight": "vllm_requests_in_flight",
    "RequestsWaiting": "vllm_num_requests_waiting",
    "KvCacheUsage": "vllm_kv_cache_usage_perc",
    "PromptTokensPerSecond": "vllm_prompt_tokens_per_second",
    "GenerationTokensPerSecond": "vllm_generation_tokens_per_second",
}
"""The pods metrics of the custom metrics API an HPA-mode role follows: what a metrics adapter
(prometheus-adapter; rules in charts/kimik3-operator/files/prometheus-adapter-rules.yaml) must
serve, per serving pod, for the same metric."""


def selector(owner: Owner, pool: str, role: str) -> str:
    """The label matchers of one role's engine series (values are DNS labels: nothing to escape)."""
    pairs = {"namespace": owner.namespace, SERIES_LABELS[LABEL_DEPLOYMENT]: deployment_label(owner),
             SERIES_LABELS[LABEL_POOL]: pool, SERIES_LABELS[LABEL_ROLE]: role}
    return ",".join(f'{k}="{v}"' for k, v in pairs.items())


def load_query(metric: ScalingMetric, matchers: str, window_seconds: int) -> str:
    """The role's total of `metric` over the window (a sum over its engines: the target is per
    replica). Gauges are averaged over the window, not read at one instant: the requests in flight
    dip for the seconds a router is replaced (its engine lists change with every replica), and a
    scaler reading that dip would remove the replica it just added."""
    window = f"[{window_seconds}s]"
    return {
        # Two sums, not one selector over both names: avg_over_time drops the names, and the two
        # series of one engine would collide ("vector cannot contain metrics with the same labelset").
        "RequestsInFlight": (f"sum(avg_over_time(vllm:num_requests_running{{{matchers}}}{window}))"
                             f" + sum(avg_over_time(vllm:num_requests_waiting{{{matchers}}}{window}))"),
        "RequestsWaiting": f"sum(avg_over_time(vllm:num_requests_waiting{{{matchers}}}{window}))",
        "KvCacheUsage": f"sum(avg_over_time(vllm:kv_cache_usage_perc{{{matchers}}}{window}))",
        "PromptTokensPerSecond": f"sum(rate(vllm:prompt_tokens_total{{{matchers}}}{window}))",
        "GenerationTokensPerSecond": f"sum(rate(vllm:generation_tokens_total{{{matchers}}}{window}))",
    }[metric]


def trend_query(metric: ScalingMetric, matchers: str, window_seconds: int, range_seconds: int, *,
                earlier: bool = False) -> str:
    """How fast the role's load changed, per second: deriv()'s least-squares slope of the load
    query over `range_seconds`, evaluated four times a window, ending now or, `earlier`, where
    that range begins."""
    offset = f" offset {range_seconds}s" if earlier else ""
    return (f"deriv(({load_query(metric, matchers, window_seconds)})"
            f"[{range_seconds}s:{max(5, window_seconds // 4)}s]{offset})")


def latency_query(name: str, matchers: str, window_seconds: int) -> str:
    """The role's p90 of a latency histogram over the window, across its engines."""
    return (f"histogram_quantile({QUANTILE}, sum by (le) "
            f"(rate({LATENCY_HISTOGRAMS[name]}_bucket{{{matchers}}}[{window_seconds}s])))")


def prompt_tokens_query(source: str, matchers: str, window_seconds: int) -> str:
    """A role's prompt tokens from one source (vllm:prompt_tokens_by_source's `source` label:
    local_compute | local_cache_hit | external_kv_transfer) over the window, across its engines."""
    return f'sum(increase(vllm:prompt_tokens_by_source_total{{{matchers},source="{source}"}}[{window_seconds}s]))'
