"""What the simulator needs that the `vllm serve` command line does not carry: K3SIM_* variables.

A host-side pod runner sets these from what the pod would have had (the node's labels, the pod's
labels); tests set them directly. Every variable is optional.

  K3SIM_GPU_PRODUCT       GPU of the node: a catalog name (GB300, B200, H200, MI355X, ...) or a node
                          label value as the GPU table spells it (NVIDIA-GB300, AMD_Instinct_MI355X;
                          exact, ignoring case: gpus.py). Default GB300, the GPU the
                          perf model is calibrated on.
  K3SIM_ROLE              prefill | decode | aggregated, as /sim/stats reports it. Default: from
                          --kv-transfer-config's kv_role (kv_producer: prefill, kv_consumer: decode,
                          kv_both: both), or aggregated without one. What an engine does with a request
                          follows the request's kv_transfer_params, as in vLLM, whatever the role.
  K3SIM_DSPARK_ACCEPTANCE Mean tokens a speculative step emits (acceptance length, 1 to 1 + k).
                          Default 2.61, the pessimistic end of DSpark's published 2.61-4.73, which is
                          also the planner's default when a workload gives none.
  K3SIM_TIME_SCALE        Wall seconds per modelled second: 0.1 runs ten times faster. Default 1.0,
                          the perf model's own predictions.
  K3SIM_STARTUP_SECONDS   Model-load time before /health answers 200 (scaled). Default 0.
                          `predicted`: the planner's cold-start prediction for this engine's
                          command line and GPU (planner/cold_start.py) after the image is on the
                          node: reading its pods' share of the weights, compiling from a warm
                          cache, capturing its CUDA graphs.
  K3SIM_READ_BYTES_PER_S  What the node reads the weights at, for `predicted` (spec.model.readThroughput
                          in bytes per second). Default: the planner's default.
  K3SIM_STARTUP_TIME_SCALE
                          Wall seconds per modelled second of start-up alone. Default K3SIM_TIME_SCALE:
                          a predicted quarter of an hour can pass in seconds while requests keep their
                          modelled timing.
  K3SIM_CROSSES_RDMA      1/0: the replica's collectives cross RDMA (slower fixed step latency).
                          Default: the replica has more GPUs than the GPU's NVLink domain.
  K3SIM_KV_FABRIC_GBPS    GB/s each GPU moves KV at for a P/D hand-off. Default: the GPU's NIC.
  K3SIM_OUTPUT_TOKENS     Tokens an answer has before the model stops by itself (max_tokens still
                          caps it; ignore_eos removes it). Default 256.
  K3SIM_THINKING_TOKENS   Think-channel tokens of a chat answer whose request asks K3 to think
                          (chat_template_kwargs thinking or enable_thinking true), before the close
                          marker and the answer. Default 24.
  K3SIM_HANDSHAKE_DIR     Accepted and ignored. It named a folder that stood in for NIXL's side
                          channel; engines now listen on the side channel itself (nixl.py).
  K3SIM_COMPAT_EXTRA      Extra text folded into the compatibility hash (e.g. the pod's
                          serving.kimik3.dev/compat-hash label, to model what the image pins).
  K3SIM_STATS_HISTORY     Requests /sim/stats remembers. Default 2000.
  K3SIM_MAX_QUEUED        Waiting requests beyond which new ones get 503 (memory bound; vLLM's own
                          --max-num-queued-reqs applies too). Default 10000.
  K3SIM_LOG_LEVEL         Python log level. Default INFO.
  K3SIM_FAULTS            Faults the engine has from its start (faults.py; docs/simulator-faults.md):
                          comma-separated `kind[:N]`, e.g. `exit_at_start:3`, `oom`, `hang`, `stall:8`,
                          `5xx:3`, `reset:1`, or the JSON object / list POST /sim/fault takes. Unset: none.
  K3SIM_FAULT_ADMIN       1: POST /sim/fault (loopback peers only) arms and clears faults at run time.
                          Unset or 0: the route refuses every request (403), so a production-like run
                          cannot be disturbed.
  K3SIM_OOM_CAP_BYTES     How far the `oom` fault grows the process's memory (bytes) before it exits
                          137 itself, if nothing killed it first. Default 512 MiB.

vLLM's own VLLM_NIXL_SIDE_CHANNEL_HOST / _PORT are read as vLLM reads them: an engine with a NIXL
connector listens on host:port + data-parallel rank (one port per rank, default localhost:5600) and
a prefill engine advertises them in its kv_transfer_params; a decode engine pulls from the address
it is given (nixl.py). Processes sharing one address need their own port base.
VLLM_USE_RUST_FRONTEND (an integer, 0 or unset: the Python frontend; envs.py:1456-1458 of vLLM
0.33.0) picks which of vLLM's two HTTP frontends the simulator answers as (frontend.py); the
operator renders it on leader pods. With the Rust frontend,
VLLM_HTTP_MAX_REQUEST_BODY_SIZE caps a request body as vllm-rs caps it (413 above it; 32 MiB when
unset, envs.py:111); the Python frontend caps none, and the simulator then keeps a guard of its own
(server.py, MAX_BODY_BYTES).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from kimik3_operator.api.vllm_env import RUST_FRONTEND_BODY_BYTES
from kimik3_operator.kimi_k3 import PUBLISHED

from .faults import FaultError, parse_faults

DEFAULT_GPU = "GB300"
DEFAULT_ACCEPTANCE = PUBLISHED.acceptance_range[0]
ROLES = ("prefill", "decode", "aggregated")
PREDICTED = "predicted"


class SettingsError(ValueError):
    pass


@dataclass(frozen=True)
class SimSettings:
    gpu_product: str = DEFAULT_GPU
    role: str | None = None
    acceptance: float = DEFAULT_ACCEPTANCE
    time_scale: float = 1.0
    startup_seconds: float | None = 0.0
    """None: the cold-start prediction (config.py)."""
    read_bytes_per_s: float | None = None
    startup_time_scale: float | None = None
    """None: time_scale."""
    crosses_rdma: bool | None = None
    kv_fabric_gb_s: float | None = None
    output_tokens: int = 256
    thinking_tokens: int = 24
    compat_extra: str = ""
    stats_history: int = 2000
    max_queued: int = 10000
    log_level: str = "INFO"
    side_channel_host: str = "localhost"
    side_channel_port: int = 5600
    rust_frontend: bool = False
    max_body_bytes: int | None = None
    """The Rust frontend's VLLM_HTTP_MAX_REQUEST_BODY_SIZE; None: no cap of vLLM's."""
    faults: str = ""
    """K3SIM_FAULTS as given; faults.parse_faults reads it (checked here, at start)."""
    fault_admin: bool = False
    oom_cap_bytes: int = 512 << 20


def _number(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = env.get(name)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not low <= value <= high:
        raise SettingsError(f"{name}={raw} is outside [{low}, {high}]")
    return value


def _flag(env: Mapping[str, str], name: str) -> bool | None:
    raw = env.get(name, "").strip().lower()
    if raw == "":
        return None
    if raw in ("1", "true", "yes"):
        return True
    if raw in ("0", "false", "no"):
        return False
    raise SettingsError(f"{name}={raw!r} is not 1 or 0")


def _vllm_bool(env: Mapping[str, str], name: str) -> bool:
    """vLLM's `bool(int(os.getenv(name, "0")))`: anything but an integer stops vLLM at startup."""
    raw = env.get(name, "0")
    try:
        return bool(int(raw))
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer (vLLM reads it with int())") from None


def _faults(raw: str) -> str:
    try:
        parse_faults(raw)
    except FaultError as exc:
        raise SettingsError(f"K3SIM_FAULTS={raw[:200]!r}: {exc}") from None
    return raw.strip()


def settings_from_env(env: Mapping[str, str] | None = None) -> SimSettings:
    env = os.environ if env is None else env
    role = env.get("K3SIM_ROLE") or None
    if role is not None and role not in ROLES:
        raise SettingsError(f"K3SIM_ROLE={role!r} is not one of {', '.join(ROLES)}")
    fabric = env.get("K3SIM_KV_FABRIC_GBPS")
    return SimSettings(
        gpu_product=env.get("K3SIM_GPU_PRODUCT") or DEFAULT_GPU,
        role=role,
        acceptance=_number(env, "K3SIM_DSPARK_ACCEPTANCE", DEFAULT_ACCEPTANCE, 1.0, 64.0),
        time_scale=_number(env, "K3SIM_TIME_SCALE", 1.0, 1e-4, 1e4),
        startup_seconds=(None if env.get("K3SIM_STARTUP_SECONDS") == PREDICTED
                         else _number(env, "K3SIM_STARTUP_SECONDS", 0.0, 0.0, 86400.0)),
        read_bytes_per_s=(_number(env, "K3SIM_READ_BYTES_PER_S", 0.0, 1e7, 1e13)
                          if env.get("K3SIM_READ_BYTES_PER_S") else None),
        startup_time_scale=(_number(env, "K3SIM_STARTUP_TIME_SCALE", 1.0, 1e-5, 1e4)
                            if env.get("K3SIM_STARTUP_TIME_SCALE") else None),
        crosses_rdma=_flag(env, "K3SIM_CROSSES_RDMA"),
        kv_fabric_gb_s=_number(env, "K3SIM_KV_FABRIC_GBPS", 0.0, 1e-3, 1e6) if fabric else None,
        output_tokens=int(_number(env, "K3SIM_OUTPUT_TOKENS", 256, 1, 1 << 20)),
        thinking_tokens=int(_number(env, "K3SIM_THINKING_TOKENS", 24, 0, 1 << 20)),
        compat_extra=env.get("K3SIM_COMPAT_EXTRA", ""),
        stats_history=int(_number(env, "K3SIM_STATS_HISTORY", 2000, 1, 1_000_000)),
        max_queued=int(_number(env, "K3SIM_MAX_QUEUED", 10000, 1, 1_000_000)),
        log_level=env.get("K3SIM_LOG_LEVEL", "INFO").upper(),
        side_channel_host=env.get("VLLM_NIXL_SIDE_CHANNEL_HOST") or "localhost",
        side_channel_port=int(_number(env, "VLLM_NIXL_SIDE_CHANNEL_PORT", 5600, 1, 65535)),
        rust_frontend=_vllm_bool(env, "VLLM_USE_RUST_FRONTEND"),
        faults=_faults(env.get("K3SIM_FAULTS", "")),
        fault_admin=bool(_flag(env, "K3SIM_FAULT_ADMIN")),
        oom_cap_bytes=int(_number(env, "K3SIM_OOM_CAP_BYTES", 512 << 20, 1 << 20, 1 << 40)),
        max_body_bytes=(int(_number(env, "VLLM_HTTP_MAX_REQUEST_BODY_SIZE", RUST_FRONTEND_BODY_BYTES, 1, 1 << 40))
                        if _vllm_bool(env, "VLLM_USE_RUST_FRONTEND") else None),
    )
