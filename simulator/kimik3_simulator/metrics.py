"""`/metrics` as vLLM 0.33.0 exports it: the same families, types, label names and buckets.

Mirrors vllm/v1/metrics/loggers.py (PrometheusStatLogger with the default observability config),
v1/metrics/buckets.py, v1/spec_decode/metrics.py (SpecDecodingProm), v1/metrics/perf.py
(PerfMetricsProm) and the NIXL connector's stats.py (NixlPromMetrics); tests/contract compares the
exposition with what vLLM's own classes register. Labels are `model_name` (the first served name)
and `engine` (the data-parallel rank), one child per rank created up front as vLLM does. Families
vLLM registers but the simulator has nothing to count for (multimodal cache, preemptions, the MFU
estimates...) are exported at zero so a dashboard or a recording rule sees every series it expects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                               7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                               10.0, 20.0, 40.0, 80.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
NIXL_TIME_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_BYTES_BUCKETS = tuple(2 ** (10 + i) for i in range(1, 25, 2))
NIXL_DESCRIPTOR_BUCKETS = (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000)

REQUEST_PHASES = {
    "e2e": ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
    "queue": ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."),
    "inference": ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request."),
    "prefill": ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."),
    "decode": ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."),
}
"""The request-latency histograms, one per phase of a request's life, all on the same buckets."""
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
WAITING_REASONS = ("capacity", "deferred")
KV_FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
LABELS = ["model_name", "engine"]
M = TypeVar("M", Counter, Gauge, Histogram)

CACHE_CONFIG_DEFAULTS: dict[str, str] = {
    "block_size": "16", "user_specified_block_size": "False", "kv_cache_layout": "None",
    "prefix_match_unit": "None", "gpu_memory_utilization": "0.92", "cache_dtype": "auto",
    "is_attention_free": "False", "num_gpu_blocks_override": "None", "sliding_window": "None",
    "enable_prefix_caching": "True", "prefix_caching_hash_algo": "sha256",
    "prefix_cache_retention_interval": "0", "kv_cache_dtype_skip_layers": "[]",
    "mamba_page_size_padded": "None", "skip_page_size_padded": "None", "mamba_block_size": "None",
    "mamba_cache_dtype": "auto", "mamba_ssm_cache_dtype": "auto", "mamba_cache_mode": "none",
    "enable_mamba_shared_prefix_checkpoint": "False", "replayssm_buffer_len": "16", "use_replayssm": "False",
    "use_kda_recoverssm": "False", "num_gpu_blocks": "None", "num_cpu_blocks": "None",
    "simple_cpu_offload_num_blocks": "None", "effective_attention_block_size": "None",
    "kv_cache_size_tokens": "None", "kv_cache_max_concurrency": "None", "hash_block_size": "None",
    "cache_hit_alignment_tokens": "None", "kv_sharing_fast_prefill": "False", "swa_bounded_replay": "True",
    "kv_cache_memory_bytes": "None", "kv_offloading_size": "None", "kv_offloading_backend": "native",
    "_block_size_resolved": "True",
}
"""vLLM's CacheConfig().metrics_info(): the labels of vllm:cache_config_info, before the engine's own values."""


def build_1_2_5_buckets(max_value: int) -> list[float]:
    """vLLM's request-token buckets: 1, 2, 5, 10, 20, 50, ... up to max_model_len."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return out
            out.append(value)
        exponent += 1


class EngineMetrics:
    """Every vLLM family, with one child per data-parallel rank; `per[...]` are those children."""

    def __init__(self, *, model_name: str, engines: int, max_model_len: int, spec_tokens: int,
                 kv_connector: bool, kv_consumer: bool, cache_config: Mapping[str, str]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.engines = [str(i) for i in range(engines)]
        self.model_name = model_name
        reg = self.registry
        request_tokens = build_1_2_5_buckets(max_model_len)

        self._per_engine: list[Counter | Gauge | Histogram] = []
        """Families labelled by model_name and engine only: one child per rank each."""

        def gauge(name: str, doc: str, extra: Iterable[str] = ()) -> Gauge:
            return self._keep(Gauge(name, doc, LABELS + list(extra), registry=reg), extra)

        def counter(name: str, doc: str, extra: Iterable[str] = ()) -> Counter:
            return self._keep(Counter(name, doc, LABELS + list(extra), registry=reg), extra)

        def histogram(name: str, doc: str, buckets: Iterable[float]) -> Histogram:
            return self._keep(Histogram(name, doc, LABELS, buckets=list(buckets), registry=reg), ())

        self.spec_tokens = spec_tokens
        if spec_tokens:
            self.spec_drafts = counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.")
            self.spec_draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
            self.spec_accepted = counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.")
            self.spec_accepted_per_pos = counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                                 "Accepted tokens per draft position.", ["position"])
        self.kv_connector = kv_connector
        if kv_connector:
            self.nixl_xfer_time = histogram("vllm:nixl_xfer_time_seconds",
                                            "Histogram of transfer duration for NIXL KV Cache transfers.",
                                            NIXL_TIME_BUCKETS[1:])
            self.nixl_post_time = histogram("vllm:nixl_post_time_seconds",
                                            "Histogram of transfer post time for NIXL KV Cache transfers.",
                                            NIXL_TIME_BUCKETS)
            self.nixl_bytes = histogram("vllm:nixl_bytes_transferred",
                                        "Histogram of bytes transferred per NIXL KV Cache transfers.",
                                        NIXL_BYTES_BUCKETS)
            self.nixl_descriptors = histogram("vllm:nixl_num_descriptors",
                                              "Histogram of number of descriptors per NIXL KV Cache transfers.",
                                              NIXL_DESCRIPTOR_BUCKETS)
            self.nixl_failed_transfers = counter("vllm:nixl_num_failed_transfers",
                                                 "Number of failed NIXL KV Cache transfers.")
            self.nixl_failed_notifications = counter("vllm:nixl_num_failed_notifications",
                                                     "Number of failed NIXL KV Cache notifications.")
            self.nixl_kv_expired = counter("vllm:nixl_num_kv_expired_reqs",
                                           "Number of requests that had their KV expire.")
            self.nixl_notifications_after_expiry = counter(
                "vllm:nixl_num_notifications_after_expiry",
                "Number of completion notifications for requests that were no longer tracked.")
        for name in ("flops", "read_bytes", "write_bytes"):
            counter(f"vllm:estimated_{name}_per_gpu_total", f"Estimated {name} per GPU (MFU estimates).")

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.waiting_by_reason = gauge("vllm:num_requests_waiting_by_reason",
                                       "Number of waiting requests by reason.", ["reason"])
        self.kv_fetch = (gauge("vllm:num_requests_kv_fetch_by_stage",
                               "Number of waiting requests by async KV load stage.", ["stage"])
                         if kv_consumer else None)
        self.sleep_state = gauge("vllm:engine_sleep_state", "Engine sleep state.", ["sleep_state"])
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits",
                                   "Prefix cache hits, in terms of number of cached tokens.")
        counter("vllm:external_prefix_cache_queries", "External prefix cache queries from KV connector.")
        counter("vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector.")
        counter("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.")
        counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.")
        counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_by_source = counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
                                        ["source"])
        self.prompt_cached = counter("vllm:prompt_tokens_cached",
                                     "Number of cached prompt tokens (local + external).")
        self.prompt_cached_by_source = counter("vllm:prompt_tokens_cached_by_source",
                                               "Prefix-cache hit tokens by the cache tier that supplied them.",
                                               ["source"])
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = counter("vllm:request_success", "Count of successfully processed requests.",
                               ["finished_reason"])
        self.admission_rejections = Counter("vllm:admission_rejections",
                                            "Number of admission attempts rejected by a queue limit, by reason.",
                                            ["model_name", "reason"], registry=reg)
        self.prompt_tokens_hist = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                            request_tokens)
        self.generation_tokens_hist = histogram("vllm:request_generation_tokens",
                                                "Number of generation tokens processed.", request_tokens)
        self.iteration_tokens = histogram("vllm:iteration_tokens_total",
                                          "Histogram of number of tokens per engine_step.", ITERATION_TOKENS_BUCKETS)
        self.max_generation_tokens = histogram("vllm:request_max_num_generation_tokens",
                                               "Histogram of maximum number of requested generation tokens.",
                                               request_tokens)
        self.params_n = histogram("vllm:request_params_n", "Histogram of the n request parameter.",
                                  REQUEST_PARAMS_N_BUCKETS)
        self.params_max_tokens = histogram("vllm:request_params_max_tokens",
                                           "Histogram of the max_tokens request parameter.", request_tokens)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TIME_TO_FIRST_TOKEN_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             INTER_TOKEN_LATENCY_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.", INTER_TOKEN_LATENCY_BUCKETS)
        self.phase_time = {phase: histogram(name, doc, REQUEST_LATENCY_BUCKETS)
                           for phase, (name, doc) in REQUEST_PHASES.items()}
        self.num_preemptions = histogram("vllm:request_num_preemptions",
                                         "Histogram of the number of times a request was preempted.",
                                         REQUEST_NUM_PREEMPTIONS_BUCKETS)
        self.prefill_kv_computed = histogram("vllm:request_prefill_kv_computed_tokens",
                                             "Histogram of new KV tokens computed during prefill "
                                             "(excluding cached tokens).", request_tokens)
        self._create_children()
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                     [*cache_config, "engine"], registry=reg)
        for engine in self.engines:
            info.labels(**cache_config, engine=engine).set(1)

    def _keep(self, metric: M, extra: Iterable[str]) -> M:
        if not list(extra):
            self._per_engine.append(metric)
        return metric

    def _create_children(self) -> None:
        """vLLM creates every labelled child at start, so series exist (at 0) before traffic."""
        for engine in self.engines:
            for metric in self._per_engine:
                metric.labels(self.model_name, engine)
            for reason in WAITING_REASONS:
                self.waiting_by_reason.labels(self.model_name, engine, reason)
            if self.kv_fetch is not None:
                for stage in KV_FETCH_STAGES:
                    self.kv_fetch.labels(self.model_name, engine, stage)
            for state in SLEEP_STATES:
                self.sleep_state.labels(self.model_name, engine, state).set(1 if state == "awake" else 0)
            for source in PROMPT_SOURCES:
                self.prompt_by_source.labels(self.model_name, engine, source)
            for source in CACHE_HIT_SOURCES:
                self.prompt_cached_by_source.labels(self.model_name, engine, source)
            for reason in FINISH_REASONS:
                self.success.labels(self.model_name, engine, reason)
            if self.spec_tokens:
                for pos in range(self.spec_tokens):
                    self.spec_accepted_per_pos.labels(self.model_name, engine, str(pos))
        for reason in ADMISSION_REASONS:
            self.admission_rejections.labels(self.model_name, reason)

    def of(self, metric: Counter | Gauge | Histogram, engine: int, *extra: str) -> Any:
        """The child of `metric` for data-parallel rank `engine`."""
        return metric.labels(self.model_name, str(engine), *extra)
