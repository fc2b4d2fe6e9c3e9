"""How long a replica may take to start, from how much each of its pods reads off the weights claim.

vLLM 0.33.0 waits at three places while a replica loads and wires itself, each with a default far
below what reading ~1.6 TB takes:
- torch.distributed's rendezvous and every NCCL collective, `--distributed-timeout-seconds`
  (vllm/config/parallel.py:364-368; passed to init_process_group by v1/worker/gpu_worker.py:1710-1720;
  PyTorch's default is 600 s). Pods of one group start minutes apart (a cold node pulls the serving
  image, LWS creates workers after the leader) and the first collective after loading waits for the
  slowest rank's load: both must fit.
- the gloo CPU groups (DP coordination, KV-size agreement across ranks),
  `--cpu-distributed-timeout-seconds` (config/parallel.py:370-372; gloo's default 1,800 s).
- the API server waiting for its engine cores to report ready, `VLLM_ENGINE_READY_TIMEOUT_S`
  (envs.py:813; v1/engine/core_client.py:762-771; default 600 s): load, compile, CUDA graph capture.
vLLM 0.33.0 has no RPC timeout on start-up (the V0 `VLLM_RPC_TIMEOUT` is gone; the remote engines'
handshake, v1/engine/utils.py wait_for_engine_startup, waits without a deadline). Its per-step RPC
deadline, VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (v1/executor/multiproc_executor.py:414), applies to
serving steps, not to loading, and is left at its default. NCCL's own IB timeouts are transport
retries, set with the RDMA settings, not here.

The raised collective timeout has a price: a collective that hangs while serving is noticed only
after it. So it covers the load-time skew the estimate predicts, not an hour for everyone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cold_start import ColdStart

LOAD_MARGIN = 2.0
"""The estimate is a floor; the slowest node of a group (a busy file server, a cold page cache)
sets the pace."""
POD_START_SKEW_S = 900
"""Between the first and the last pod of a group starting: pulling a ~20 GB serving image on a cold
node, and LWS creating the workers after the leader."""
WARM_UP_S = 1200
"""After loading: torch.compile, DeepGEMM/FlashInfer/Triton JIT on a cold cache (compile_cache.py
keeps them across restarts), profiling and CUDA graph capture."""
PROBE_MARGIN_S = 600
"""The startup probe outlasts vLLM's own deadline, so a too-slow start ends with vLLM's error
message, not a kill."""
FLOOR_S = 1800
ROUND_S = 300


@dataclass(frozen=True)
class StartupTimeouts:
    load_seconds: int
    """Estimated time for one pod to read its share of the weights."""
    distributed_seconds: int
    """--distributed-timeout-seconds and --cpu-distributed-timeout-seconds."""
    engine_ready_seconds: int
    """VLLM_ENGINE_READY_TIMEOUT_S."""
    startup_probe_seconds: int
    """What the leader's startup probe allows before the kubelet restarts it."""


def _round_up(seconds: float) -> int:
    return max(FLOOR_S, math.ceil(seconds / ROUND_S) * ROUND_S)


def startup_timeouts(cold: ColdStart) -> StartupTimeouts:
    """The deadlines around the cold-start prediction (cold_start.py): its load with LOAD_MARGIN and
    the pods' start skew for the collectives, the cold compile budget on top for the engine."""
    distributed = _round_up(LOAD_MARGIN * cold.load_seconds + POD_START_SKEW_S)
    ready = _round_up(distributed + WARM_UP_S)
    return StartupTimeouts(load_seconds=cold.load_seconds, distributed_seconds=distributed,
                           engine_ready_seconds=ready, startup_probe_seconds=ready + PROBE_MARGIN_S)
