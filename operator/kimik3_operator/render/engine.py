"""The vLLM container of a role: command line and environment, from typed plan values.

Leader pods run `vllm serve` with the HTTP server; worker pods of a multi-node replica run the
same engine headless. Values only known in the pod (the leader's address, the worker's index,
the pod IP) are `$(NAME)` references that the kubelet expands from the container environment
(LWS injects LWS_LEADER_ADDRESS and LWS_WORKER_INDEX; POD_IP comes from the downward API).
Flag spellings and values are those of vLLM 0.33.0 (docs/vllm-facts.md), checked by the
contract test against vLLM's own parser. What the user wrote (served name, extraArgs, env values)
goes through `literal`, so the kubelet expands only the operator's own references (kubelet.py).
"""

from __future__ import annotations

import json
from typing import Any

from ..planner import EngineSettings, RolePlan
from ..planner.memory import GPU_MEMORY_UTILIZATION
from ..planner.vision import encoder_args
from . import chat_template
from .engine_shape import shape_args
from .kubelet import literal, literals

HTTP_PORT = 8000
MASTER_PORT = 29501
DP_RPC_PORT = 13345
NIXL_SIDE_CHANNEL_BASE = 5600
"""vLLM's default; each data-parallel rank listens on base + its global rank."""
PREFIX_HASH_ALGO = "sha256_cbor"
KV_EVENTS_CONFIG = {"enable_kv_cache_events": True, "publisher": "zmq",
                    "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0", "topic": "kv-events"}
"""Each engine core's KV event publisher and its replay socket on the pod's IP (VLLM_HOST_IP) and a
port the OS picks: the rank's entry of the leader's GET /kv_event_sources then names that address,
so a router reaches the ranks of headless worker pods too, and no port plan can meet NIXL's side
channel (5600 + rank) or another rank's (distributed/kv_events.py:340-381, 437-482; docs/kv-events.md).
A wildcard with a fixed port would name no host, and a named host makes the publisher connect, not
bind. 10,000 batches stay buffered for a subscriber's replay (vLLM's default)."""
ENGINE_READY_TIMEOUT_S = 3600
"""Loading 1.6 TB of weights plus JIT warm-up takes far longer than vLLM's 600 s default; the plan's
estimate (planner/timeouts.py) replaces this when it has one."""
KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
NO_MEDIA_HOST = "media-fetch-off.invalid"
"""--allowed-media-domains when the spec allows none. vLLM reads an empty list as "every host"
(multimodal/media/connector.py, _assert_url_in_allowed_media_domains), so "none" is one host that
can never resolve: .invalid is reserved for that (RFC 6761). Only data: URLs then reach the model."""


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def kv_transfer_config(role: RolePlan) -> dict[str, Any] | None:
    """NixlConnector on both sides of a prefill/decode pair. A decode whose pull fails (the prefill
    died, its blocks expired, the handshake failed) prefills the prompt itself instead of answering
    HTTP 500: kv_load_failure_policy recompute (config/kv_transfer.py:88-91; the scheduler resets
    the request to no computed tokens, v1/core/sched/scheduler.py:3688-3701). The cost is one full
    prefill on the decode's GPUs, interleaved with its decode steps (docs/pd-handoff.md)."""
    if role.role not in KV_ROLE:
        return None
    config = {"kv_connector": "NixlConnector", "kv_role": KV_ROLE[role.role], "kv_buffer_device": "cuda"}
    if role.role == "decode":
        config["kv_load_failure_policy"] = "recompute"
    return config


def parallel_args(role: RolePlan, *, worker: bool) -> list[str]:
    layout = role.layout
    args = [
        "--tensor-parallel-size", str(layout.tensor),
        "--pipeline-parallel-size", str(layout.pipeline),
        "--data-parallel-size", str(layout.data),
    ]
    if layout.expert:
        args.append("--enable-expert-parallel")
    if role.all2all_backend:
        args += ["--all2all-backend", role.all2all_backend]
    if role.moe_backend:
        args += ["--moe-backend", role.moe_backend]
    if role.nodes_per_replica > 1:
        # One pod per node: vLLM splits tensor x pipeline x data ranks evenly over --nnodes and
        # derives each node's local data-parallel size and start rank from --node-rank
        # (engine/arg_utils.py). The leader binds the rendezvous on its own address.
        args += [
            "--nnodes", str(role.nodes_per_replica),
            "--node-rank", "$(LWS_WORKER_INDEX)" if worker else "0",
            "--master-addr", "$(LWS_LEADER_ADDRESS)" if worker else "$(POD_IP)",
            "--master-port", str(MASTER_PORT),
        ]
    if layout.data > 1:
        args += ["--data-parallel-rpc-port", str(DP_RPC_PORT)]
    if role.timeouts is not None:
        # Rendezvous and collectives must outlast the replica's load skew (planner/timeouts.py).
        seconds = str(role.timeouts.distributed_seconds)
        args += ["--distributed-timeout-seconds", seconds, "--cpu-distributed-timeout-seconds", seconds]
    if worker:
        # Nothing infers this from the node rank: without it a worker starts API servers too.
        args.append("--headless")
    return args


def engine_args(role: RolePlan, engine: EngineSettings, *, worker: bool, scale_out: bool = False,
                kv_events: bool = False) -> list[str]:
    """`vllm serve` arguments for the leader (worker=False) or a headless worker; `scale_out`: the
    leader serves token ids to a prefix-aware router (Plan.router_tokenizes); `kv_events`: every
    engine core publishes its KV events to a router that follows them (Plan.publishes_kv_events)."""
    args = [
        "vllm", "serve", engine.model_path,
        "--served-model-name", literal(engine.served_name),
        "--host", "0.0.0.0", "--port", str(HTTP_PORT),
        *parallel_args(role, worker=worker),
        "--gpu-memory-utilization", str(GPU_MEMORY_UTILIZATION),
        "--kv-cache-dtype", engine.kv_cache_dtype,
        "--mamba-ssm-cache-dtype", engine.kda_state_dtype,
        # One KV cache manager for MLA pages and KDA state: prefix caching across both, and NIXL
        # refuses hybrid models without it.
        "--enable-hybrid-kv-cache-manager",
        # An unknown VLLM_* variable (a typo in engine.env) stops the engine instead of a warning.
        "--fail-on-environ-validation",
    ]
    if engine.max_model_len is not None:
        args += ["--max-model-len", str(engine.max_model_len)]
    if role.loading is not None:
        args += role.loading.args()
    args += shape_args(role)
    args.append("--enable-prefix-caching" if engine.prefix_caching else "--no-enable-prefix-caching")
    if engine.prefix_caching:
        # Dense is None, spelt out: vLLM 0.33.0's default is 0, semantic checkpoints only
        # (config/cache.py prefix_cache_retention_interval), so leaving the flag out is not dense.
        args += ["--prefix-cache-retention-interval", str(engine.retention_interval),
                 # Keys anyone can recompute from token ids (CBOR, not Python's pickle): what KV events
                 # carry and a precise prefix router matches (docs/vllm-facts.md §5a).
                 "--prefix-caching-hash-algo", PREFIX_HASH_ALGO]
    if engine.speculative_config is not None:
        args += ["--speculative-config", _json(dict(engine.speculative_config))]
    if kv_events:
        args += ["--kv-events-config", _json(KV_EVENTS_CONFIG)]
    transfer = kv_transfer_config(role)
    if transfer is not None:
        args += ["--kv-transfer-config", _json(transfer)]
    if engine.tool_calling:
        args += ["--tool-call-parser", "kimi_k3", "--enable-auto-tool-choice"]
    if engine.reasoning:
        args += ["--reasoning-parser", "kimi_k3"]
    if engine.mm_limits:
        args += ["--limit-mm-per-prompt", _json(dict(engine.mm_limits))]
    args += encoder_args(role.vision_encoder, role.layout.tensor)
    if python_frontend(engine, worker=worker):
        args += ["--allowed-media-domains", *(engine.media_domains or (NO_MEDIA_HOST,))]
    if scale_out and not worker:
        args.append("--enable-scale-out")
    args += ["--shutdown-timeout", str(engine.shutdown_timeout)]
    args += chat_template.args(engine, worker=worker)
    args += tracing_args(engine)
    args += literals(engine.extra_args)
    return args


def tracing_args(engine: EngineSettings) -> list[str]:
    """engine.tracing on every pod, leaders and headless workers (whose engine cores export the
    detailed spans): vLLM validates the endpoint only when OpenTelemetry is installed, which its
    0.33.0 wheel requires (opentelemetry-sdk, -exporter-otlp), config/observability.py."""
    tracing = engine.tracing
    if tracing is None:
        return []
    args = ["--otlp-traces-endpoint", tracing.endpoint]
    if tracing.detailed:
        args += ["--collect-detailed-traces", *tracing.detailed]
    return args


def tracing_env(role: RolePlan, engine: EngineSettings) -> list[dict[str, Any]]:
    """What the OpenTelemetry SDK reads beside the flag (vllm/tracing/otel.py: the protocol picks
    the exporter; the SDK's TracerProvider reads the sampler and the service name)."""
    tracing = engine.tracing
    if tracing is None:
        return []
    return [{"name": "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "value": tracing.protocol},
            {"name": "OTEL_TRACES_SAMPLER", "value": "parentbased_traceidratio"},
            {"name": "OTEL_TRACES_SAMPLER_ARG", "value": f"{tracing.sampling_ratio:g}"},
            {"name": "OTEL_SERVICE_NAME", "value": f"kimi-k3-{role.role}"}]


def python_frontend(engine: EngineSettings, *, worker: bool) -> bool:
    """The pod serves HTTP with vLLM's Python frontend, whose media policy the operator sets. The
    Rust frontend (leaders with engine.rustFrontend) exits at start on --allowed-media-domains ("not
    implemented in Rust frontend yet": vllm-rs, v1/utils.py passes it every non-default argument)
    and keeps its own policy; headless workers serve no HTTP."""
    return not worker and not engine.rust_frontend


def sequence_parallel_moe(role: RolePlan) -> bool:
    """K3 turns on sequence-parallel MoE with EP, TP > 1, no pipeline, and DP > 1 or MegaMoE."""
    layout = role.layout
    return (layout.expert and layout.tensor > 1 and layout.pipeline == 1
            and (layout.data > 1 or role.moe_backend == "deep_gemm_mega_moe"))


def engine_env(role: RolePlan, engine: EngineSettings, *, worker: bool, vendor: str = "nvidia") -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        # Otherwise vLLM guesses its address from the default route.
        {"name": "VLLM_HOST_IP", "value": "$(POD_IP)"},
        {"name": "VLLM_ENGINE_READY_TIMEOUT_S", "value": str(
            role.timeouts.engine_ready_seconds if role.timeouts else ENGINE_READY_TIMEOUT_S)},
    ]
    if engine.rust_frontend and not worker:
        # Headless workers serve no HTTP, so the Rust frontend applies to leaders only.
        env.append({"name": "VLLM_USE_RUST_FRONTEND", "value": "1"})
        if engine.max_request_body is not None and "VLLM_HTTP_MAX_REQUEST_BODY_SIZE" not in dict(engine.env):
            # The engines take every body the routers' fronts took (engine.env's own value wins).
            env.append({"name": "VLLM_HTTP_MAX_REQUEST_BODY_SIZE", "value": str(engine.max_request_body)})
    if engine.speculative_config is not None and engine.speculative_config.get("method") == "dspark":
        env.append({"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "1"})  # DSpark runs only on Model Runner V2
    if role.role in KV_ROLE:
        # NIXL binds and advertises its side channel on this address; localhost would never pair.
        env += [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "$(POD_IP)"},
                {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_SIDE_CHANNEL_BASE)},
                # KDA's conv state crosses NIXL only in the DS (dim, state) layout; both sides set it.
                {"name": "VLLM_SSM_CONV_STATE_LAYOUT", "value": "DS"}]
    if role.role == "decode" and sequence_parallel_moe(role):
        # Shard the dense and shared-expert MLPs over TP under sequence-parallel MoE, which vLLM
        # documents for decode instances of a P/D deployment.
        env.append({"name": "VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT", "value": "1"})
    if python_frontend(engine, worker=worker):
        # vLLM checks only the first URL's host against --allowed-media-domains; a redirect from an
        # allowed host could lead anywhere (multimodal/media/connector.py, load_from_url).
        env.append({"name": "VLLM_MEDIA_URL_ALLOW_REDIRECTS", "value": "0"})
        if engine.media_fetch_timeout is not None:
            env.append({"name": "VLLM_IMAGE_FETCH_TIMEOUT", "value": str(engine.media_fetch_timeout)})
    if role.loading is not None:
        # engine.env may set these itself (e.g. INSTANTTENSOR_BACKEND=BUFFERED): then only its value,
        # since a name twice in a container's env is refused by the LeaderWorkerSet's list map.
        given = {n for n, _ in engine.env}
        env += [{"name": n, "value": v} for n, v in role.loading.loader.env if n not in given]
    if vendor == "amd":
        # K3's MXFP4 SiTU experts run on AITER only when it is on; otherwise vLLM emulates them.
        env.append({"name": "VLLM_ROCM_USE_AITER", "value": "1"})
    env += tracing_env(role, engine)
    env += [{"name": n, "value": literal(v)} for n, v in engine.env]
    return env


def nixl_ports(role: RolePlan) -> list[dict[str, Any]]:
    """One side-channel port per data-parallel rank; every pod lists all of them since its ranks
    depend on its LWS worker index."""
    if role.role not in KV_ROLE:
        return []
    return [{"name": f"nixl-{rank}", "containerPort": NIXL_SIDE_CHANNEL_BASE + rank, "protocol": "TCP"}
            for rank in range(role.layout.data)]
