"""The vLLM container of a role: command line and environment, from typed plan values.

Leader pods run `vllm serve` with the HTTP server; worker pods of a multi-node replica run the
same engine headless. Values only known in the pod (the leader's address, the worker's index,
the pod IP) are `$(NAME)` references that the kubelet expands from the container environment
(LWS injects LWS_LEADER_ADDRESS and LWS_WORKER_INDEX).
"""

from __future__ import annotations

import json
from typing import Any

from ..planner import EngineSettings, RolePlan

HTTP_PORT = 8000
MASTER_PORT = 29501


def engine_args(role: RolePlan, engine: EngineSettings, *, worker: bool) -> list[str]:
    """`vllm serve` arguments for the leader (worker=False) or a headless worker."""
    layout = role.layout
    args = [
        "vllm", "serve", engine.model_path,
        "--served-model-name", engine.served_name,
        "--host", "0.0.0.0", "--port", str(HTTP_PORT),
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
    if engine.max_model_len is not None:
        args += ["--max-model-len", str(engine.max_model_len)]
    args.append("--enable-prefix-caching" if engine.prefix_caching else "--no-enable-prefix-caching")
    if engine.prefix_caching and engine.retention_interval is not None:
        args += ["--prefix-cache-retention-interval", str(engine.retention_interval)]
    if engine.speculative_config is not None:
        args += ["--speculative-config", json.dumps(dict(engine.speculative_config), separators=(",", ":"))]
    if role.nodes_per_replica > 1:
        args += [
            "--nnodes", str(role.nodes_per_replica),
            "--node-rank", "$(LWS_WORKER_INDEX)" if worker else "0",
            "--master-addr", "$(LWS_LEADER_ADDRESS)",
            "--master-port", str(MASTER_PORT),
        ]
    if worker:
        args.append("--headless")
    args += list(engine.extra_args)
    return args


def engine_env(role: RolePlan, engine: EngineSettings, *, worker: bool) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    if engine.rust_frontend and not worker:
        # Headless workers serve no HTTP, so the Rust frontend applies to leaders only.
        env.append({"name": "VLLM_USE_RUST_FRONTEND", "value": "1"})
    env += [{"name": n, "value": v} for n, v in engine.env]
    return env
