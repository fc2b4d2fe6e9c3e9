"""Deployment-wide vLLM settings from the spec: model paths, cache, retention, speculation.

Model and draft are mounted at the same paths on every pod: the paths enter vLLM's NIXL
compatibility check, so prefill and decode must agree on them to the byte.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..api import KimiK3DeploymentSpec
from ..api.reasons import INVALID_SPEC
from ..api.rust_frontend_flags import RUST_FRONTEND_VALUES, rust_frontend_refused_value
from ..api.spec import Engine, Speculative
from ..api.vllm_env import RUST_FRONTEND_BODY_BYTES, VLLM_VERSION
from .catalog import GpuSpec
from .plan import EngineSettings, PlanningError, TracingSettings
from .weights import DRAFT_PATH, MODEL_PATH


def default_kv_cache_dtype(gpus: Iterable[GpuSpec]) -> str:
    """fp8 MLA KV where every pool is NVIDIA Blackwell, else auto (BF16). Kimi K3's NVIDIA MLA layer
    stores and reads a plain per-tensor fp8 cache on both paths (vllm models/kimi_k3/nvidia/mla.py:
    1-20, the prefill dispatch by cache dtype, and :493-504, the fp8 view of the cache), and the
    Dynamo Kimi K3 recipes serve Blackwell with --kv-cache-dtype fp8 (docs/vllm-facts.md,
    "Pitfalls"); llm-d's wide-EP DeepSeek decode does the same (guides/wide-ep-lws/modelserver/gpu/
    vllm-deepseek-v4/base/decode.yaml). Hopper and AMD keep BF16: no peer recipe serves K3's MLA in
    fp8 there, and the ROCm fp8 paths are outside K3's MLA layer (mla.py:31). One value for the
    whole deployment, since prefill and decode must agree on it."""
    gpus = list(gpus)
    return "fp8" if gpus and all(g.vendor == "nvidia" and g.blackwell for g in gpus) else "auto"


def engine_settings(spec: KimiK3DeploymentSpec, kv_default: str = "auto") -> EngineSettings:
    """`kv_default` is the --kv-cache-dtype when the spec leaves it out (default_kv_cache_dtype)."""
    engine = spec.engine
    check_rust_frontend_values(engine)
    retention = engine.prefix_caching.retention
    interval = {"Interval": retention.interval_tokens, "Selective": 0, "Dense": None}[retention.policy]
    draft = DRAFT_PATH if engine.speculative and engine.speculative.method == "DSpark" else None
    return EngineSettings(
        model_path=MODEL_PATH,
        served_name=spec.model.served_name,
        max_model_len=engine.max_model_len,
        kv_cache_dtype=engine.kv_cache_dtype or kv_default,
        kda_state_dtype=engine.kda_state_dtype,
        prefix_caching=engine.prefix_caching.enabled,
        retention_policy=retention.policy,
        retention_interval=interval,
        retention_requested=interval,
        speculative_config=speculative_config(engine.speculative, draft),
        rust_frontend=engine.rust_frontend,
        draft_path=draft,
        tool_calling=engine.tool_calling,
        reasoning=engine.reasoning,
        mm_limits=mm_limits(engine),
        media_domains=tuple(engine.multimodal.allowed_media_domains) if engine.multimodal else (),
        media_fetch_timeout=engine.multimodal.fetch_timeout_seconds if engine.multimodal else None,
        max_request_body=max_request_body(spec),
        shutdown_timeout=engine.shutdown_timeout_seconds,
        extra_args=tuple(engine.extra_args),
        env=tuple((e.name, e.value) for e in engine.env),
        chat_template=(engine.chat_template.name, engine.chat_template.key) if engine.chat_template else None,
        tracing=TracingSettings(engine.tracing.endpoint, engine.tracing.protocol, engine.tracing.sampling_ratio,
                                tuple(engine.tracing.detailed)) if engine.tracing else None,
    )


ROUTER_ADDS_BYTES = 2 * 1024 * 1024
"""Room for what the router adds to a body it passes on (kv_transfer_params, re-serialized JSON)."""


def max_request_body(spec: KimiK3DeploymentSpec) -> int | None:
    """VLLM_HTTP_MAX_REQUEST_BODY_SIZE for the Rust frontend's leaders, when the body the routers'
    fronts take (spec.router.admission.maxRequestBytes) plus what the router adds is more than vLLM's
    own cap: the engines must take every request the endpoint took. None keeps vLLM's default (and
    the pod template of every deployment at the default 30Mi)."""
    if not spec.engine.rust_frontend or spec.router.replicas == 0:
        return None
    needed = spec.router.admission.body_bytes + ROUTER_ADDS_BYTES
    return needed if needed > RUST_FRONTEND_BODY_BYTES else None


def check_rust_frontend_values(engine: Engine) -> None:
    """A value the Rust frontend would exit on (api/rust_frontend_flags.py, RUST_FRONTEND_VALUES):
    refused here, since admission's CEL cannot read a value that is the next item of extraArgs."""
    refused = rust_frontend_refused_value(list(engine.extra_args)) if engine.rust_frontend else None
    if refused is not None:
        option, value = refused
        raise PlanningError(INVALID_SPEC, (
            f"engine.extraArgs: {option} {value!r} is not implemented by the Rust frontend of vLLM {VLLM_VERSION} "
            f"(it exits at start; it takes {', '.join(RUST_FRONTEND_VALUES[option])}): change the value or set "
            "engine.rustFrontend: false"))


def mm_limits(engine: Engine) -> tuple[tuple[str, int], ...]:
    mm = engine.multimodal
    if mm is None:
        return ()
    return (("image", mm.max_images_per_prompt),) if mm.max_images_per_prompt is not None else ()


def speculative_config(spec: Speculative | None, draft: str | None) -> dict[str, object] | None:
    if spec is None:
        return None
    if spec.method == "DSpark":
        return {"method": "dspark", "model": draft, "num_speculative_tokens": spec.num_speculative_tokens}
    return {"method": "mtp", "num_speculative_tokens": spec.num_speculative_tokens}
