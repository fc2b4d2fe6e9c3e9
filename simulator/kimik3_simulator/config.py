"""One simulated engine, resolved: the command line and the K3SIM_* settings turned into what the
scheduler, the NIXL hand-off and /metrics need, with vLLM 0.33.0's defaults where the command
line is silent."""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from kimik3_operator.kimi_k3 import GB, MAX_MODEL_LEN, kv_cache_family, ssm_cache_dtype
from kimik3_operator.planner.blocks import block_size as k3_block_size
from kimik3_operator.planner.catalog import CATALOG, GpuSpec, closest_labels, product_from_label
from kimik3_operator.planner.cold_start import predict as predict_cold_start
from kimik3_operator.planner.loading import LOADERS, Loading
from kimik3_operator.planner.plan import Layout
from kimik3_operator.planner.shaping import graph_ceiling

from .cmdline import ServeArgs
from .metrics import CACHE_CONFIG_DEFAULTS, EngineMetrics
from .settings import SettingsError, SimSettings
from .timing import PerfModel

log = logging.getLogger(__name__)

VLLM_VERSION = "0.33.0"
ROLE_OF_KV = {"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": "both"}
LARGE_GPU_BYTES = 160 * (1 << 30)
"""vLLM's defaults for max_num_seqs / max_num_batched_tokens step up at 160 GiB of device memory."""
PREFILL_BACKOFF = 1
"""Trailing prompt tokens a prefill engine leaves to decode: 1 for models with Mamba-like state
(KDA), so decode can derive h(N) itself (nixl base_scheduler._prefill_backoff)."""
MAX_PREFIX_CACHE_BLOCKS = 200_000
DEFAULT_KV_LEASE_SECONDS = 30


def resolve_gpu(product: str) -> GpuSpec:
    name = product if product in CATALOG else product_from_label(product)
    if name is None:
        near = closest_labels(product)
        hint = f"; closest known labels: {', '.join(near)}" if near else ""
        raise SettingsError(f"K3SIM_GPU_PRODUCT={product!r} names no GPU in the catalog ({', '.join(CATALOG)}){hint}")
    return CATALOG[name]


@dataclass(frozen=True)
class EngineConfig:
    serve: ServeArgs
    settings: SimSettings
    gpu: GpuSpec
    perf: PerfModel
    role: str
    """prefill | decode | both (kv_both) | aggregated: what /sim/stats reports; P/D behaviour is
    chosen per request from its kv_transfer_params, as vLLM's NIXL connector does."""
    engine_ids: tuple[str, ...]
    """NIXL engine id of each data-parallel rank (vLLM appends _dp<rank> under data parallelism)."""
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    acceptance: float
    kv_capacity_bytes: float
    """Per GPU of one data-parallel rank: what the KV cache and KDA state may use."""
    num_gpu_blocks: int
    startup_seconds: float = 0.0
    """Modelled seconds from the process starting to /health answering (K3SIM_STARTUP_SECONDS)."""

    @property
    def startup_wall_seconds(self) -> float:
        s = self.settings
        return self.startup_seconds * (s.startup_time_scale if s.startup_time_scale is not None else s.time_scale)

    @property
    def ranks(self) -> int:
        return self.serve.data

    @property
    def kv_connector(self) -> str | None:
        return (self.serve.kv_transfer or {}).get("kv_connector") if self.serve.kv_role else None

    @property
    def recompute_failed_loads(self) -> bool:
        """kv_load_failure_policy recompute: a pull that fails is prefilled here instead of failing
        the request (vLLM's default is fail: config/kv_transfer.py:88-91)."""
        return (self.serve.kv_transfer or {}).get("kv_load_failure_policy") == "recompute"

    @property
    def kv_lease_duration(self) -> float:
        """Seconds a prefill keeps a finished request's blocks for the decode's read: the connector's
        kv_connector_extra_config.kv_lease_duration, default 30 (nixl/base_scheduler.py:82-88)."""
        extra = (self.serve.kv_transfer or {}).get("kv_connector_extra_config") or {}
        value = extra.get("kv_lease_duration", DEFAULT_KV_LEASE_SECONDS) if isinstance(extra, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise SettingsError(f"kv_connector_extra_config.kv_lease_duration={value!r} is not a number of seconds")
        return float(value)

    @property
    def kv_lease_extension(self) -> float:
        """What one heartbeat extends a lease to, from now: 2/3 of the lease in whole seconds, as
        vLLM computes it (`kv_lease_duration * 2 // 3`, nixl/base_worker.py:631; 0 below 2 s)."""
        return float(self.kv_lease_duration * 2 // 3)

    @property
    def kv_heartbeat_interval(self) -> float:
        """How often a decode heartbeats the prefills it waits on: `kv_lease_duration // 6`
        (nixl/base_scheduler.py:88; 0, every scheduler step, below 6 s)."""
        return float(self.kv_lease_duration // 6)

    @property
    def transfer_mode(self) -> str:
        return "push" if self.kv_connector == "NixlPushConnector" else "pull"

    @property
    def spec_tokens(self) -> int:
        return self.perf.spec_tokens

    def compat_factors(self) -> dict[str, Any]:
        """What vLLM's NIXL handshake hashes (nixl/metadata.py compute_nixl_compatibility_hash) that a
        command line shows: version, model path, KV cache dtype, hybrid KV manager, speculative
        config and transfer mode; plus K3SIM_COMPAT_EXTRA."""
        spec = self.serve.speculative or {}
        return {"vllm_version": VLLM_VERSION, "model": self.serve.model, "cache_dtype": self.serve.kv_cache_dtype,
                "is_hma_enabled": True,
                "speculative_config": {k: spec.get(k) for k in ("method", "model", "num_speculative_tokens")}
                if spec else None,
                "transfer_mode": self.transfer_mode, "extra": self.settings.compat_extra}

    def compat_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.compat_factors(), sort_keys=True).encode()).hexdigest()

    def cache_config_info(self) -> dict[str, str]:
        info = dict(CACHE_CONFIG_DEFAULTS)
        info.update(block_size=str(self.perf.block_size), gpu_memory_utilization=str(self.serve.gpu_memory_utilization),
                    cache_dtype=self.serve.kv_cache_dtype, enable_prefix_caching=str(self.serve.prefix_caching),
                    prefix_cache_retention_interval=str(self.serve.retention_interval),
                    mamba_ssm_cache_dtype=self.serve.mamba_ssm_cache_dtype,
                    mamba_cache_mode="align" if self.serve.prefix_caching else "none",
                    mamba_block_size=str(self.perf.block_size) if self.serve.prefix_caching else "None",
                    num_gpu_blocks=str(self.num_gpu_blocks),
                    user_specified_block_size=str(self.serve.block_size is not None))
        return info


def _role(serve: ServeArgs, settings: SimSettings) -> str:
    if settings.role:
        return settings.role
    return ROLE_OF_KV.get(serve.kv_role or "", "aggregated")


def engine_config(serve: ServeArgs, settings: SimSettings) -> EngineConfig:
    gpu = resolve_gpu(settings.gpu_product)
    layout = Layout(tensor=serve.tensor, pipeline=serve.pipeline, data=serve.data, expert=serve.expert)
    crosses_rdma = settings.crosses_rdma if settings.crosses_rdma is not None else layout.gpus > gpu.nvlink_domain
    kv_dtype = kv_cache_family(serve.kv_cache_dtype)
    ssm_dtype = ssm_cache_dtype(serve.mamba_ssm_cache_dtype)
    spec_tokens = serve.speculative_tokens
    block = k3_block_size(serve.tensor, kv_dtype, ssm_dtype, spec_tokens)
    perf = PerfModel(gpu=gpu, layout=layout, crosses_rdma=crosses_rdma, kv_dtype=kv_dtype, ssm_dtype=ssm_dtype,
                     spec_tokens=spec_tokens, block_size=block,
                     fabric_gb_s=settings.kv_fabric_gb_s or gpu.nic_gb_s)
    max_model_len = serve.max_model_len or MAX_MODEL_LEN
    acceptance = settings.acceptance
    if settings.rust_frontend and serve.allowed_media_domains:
        # vllm-rs exits at start on it (v1/utils.py hands it every non-default `vllm serve` argument)
        raise SettingsError("The following arguments are not implemented in Rust frontend yet: - allowed_media_domains")
    if spec_tokens and not 1.0 <= acceptance <= 1 + spec_tokens:
        raise SettingsError(f"K3SIM_DSPARK_ACCEPTANCE={acceptance} must lie in [1, 1 + {spec_tokens}]")
    capacity = perf.kv_capacity_bytes(serve.max_model_len)
    if capacity <= 0:
        log.warning("%s x %s leaves no memory for the KV cache; simulating one max-length sequence per rank",
                    gpu.product, layout)
        capacity = perf.sequence_bytes(max_model_len)
    if serve.num_gpu_blocks_override is not None:
        if serve.num_gpu_blocks_override < 1:
            raise SettingsError(f"--num-gpu-blocks-override {serve.num_gpu_blocks_override}: at least 1 block")
        capacity = serve.num_gpu_blocks_override * block * perf.kv_token_bytes()
    large = gpu.usable_bytes >= LARGE_GPU_BYTES
    base_id = str((serve.kv_transfer or {}).get("engine_id") or uuid.uuid4())
    budget = serve.max_num_batched_tokens or (16384 if large else 8192)
    config = EngineConfig(
        serve=serve, settings=settings, gpu=gpu, perf=perf, role=_role(serve, settings),
        engine_ids=tuple(f"{base_id}_dp{r}" if serve.data > 1 else base_id for r in range(serve.data)),
        max_model_len=max_model_len,
        max_num_seqs=serve.max_num_seqs or 1024,
        max_num_batched_tokens=budget,
        acceptance=acceptance if spec_tokens else 1.0,
        kv_capacity_bytes=capacity,
        num_gpu_blocks=serve.num_gpu_blocks_override or max(1, int(capacity // (block * perf.kv_token_bytes()))),
        startup_seconds=(settings.startup_seconds if settings.startup_seconds is not None
                         else predicted_startup(serve, gpu, layout, budget, settings.read_bytes_per_s)),
    )
    config.kv_lease_duration  # noqa: B018 - refused at start, as vLLM's config would be
    return config


def predicted_startup(serve: ServeArgs, gpu: GpuSpec, layout: Layout, budget: int,
                      read_bytes_per_s: float | None) -> float:
    """The planner's cold start of this engine (cold_start.py) from the process's start, read off
    its own command line: the loader (vLLM's default reads like safetensors), the expert filter,
    the layout, the CUDA-graph sizes. The image is on the node by then, so its pull is not counted."""
    loader = next((row for row in LOADERS.values() if row.load_format == serve.load_format), LOADERS["Safetensors"])
    how = Loading(loader, "spec", expert_filter=serve.ep_weight_filter and layout.expert)
    ceiling = graph_ceiling(serve.max_cudagraph_capture_size, budget, gpu)
    pod_bytes = how.pod_read_bytes(layout, max(1, layout.gpus // max(1, serve.nnodes)))
    cold = predict_cold_start(pod_bytes, ceiling, read_bytes_per_s)
    return float(cold.ready_seconds - cold.image_pull_seconds)


def engine_metrics(config: EngineConfig) -> EngineMetrics:
    serve = config.serve
    connector = bool(config.kv_connector)
    return EngineMetrics(model_name=serve.served_model_name, engines=config.ranks, max_model_len=config.max_model_len,
                         spec_tokens=config.spec_tokens, kv_connector=connector,
                         kv_consumer=connector and serve.kv_role in ("kv_consumer", "kv_both"),
                         cache_config=config.cache_config_info())


def describe(config: EngineConfig) -> str:
    layout = config.perf.layout
    return (f"{config.role} engine for {config.serve.served_model_name} on {config.gpu.product}: "
            f"TP{layout.tensor} PP{layout.pipeline} DP{layout.data}{' EP' if layout.expert else ''}"
            f"{' over RDMA' if config.perf.crosses_rdma else ''}, block {config.perf.block_size}, "
            f"{config.num_gpu_blocks} KV blocks per rank ({config.kv_capacity_bytes / GB:.1f} GB per GPU)"
            f"{f', DSpark k={config.spec_tokens} acceptance {config.acceptance}' if config.spec_tokens else ''}"
            f", time scale {config.settings.time_scale}, start-up {config.startup_seconds:.0f} s modelled"
            f" ({config.startup_wall_seconds:.1f} s)")
