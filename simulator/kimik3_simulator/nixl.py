"""vLLM 0.33.0's P/D request protocol with the NIXL connector, as the simulator speaks it.

The proxy in front (vllm-router in P/D mode) sends a request to a prefill engine with
`kv_transfer_params: {"do_remote_decode": true, ...}` and max_tokens 1; that engine prefills
(all but the last prompt token: Kimi K3's KDA state makes the decoder recompute it), keeps the
blocks, and answers with the parameters a decoder needs to pull them (pull_scheduler.py
`request_finished`). The proxy then sends the original request to a decode engine with those
parameters; with `do_remote_prefill` and a complete set of remote fields the decoder pulls the
KV instead of prefilling (`get_num_new_matched_tokens`, `update_state_after_alloc`). Engines
without a KV connector ignore kv_transfer_params altogether.

The NIXL side channel (handshake and compatibility check) is stood in for by K3SIM_HANDSHAKE_DIR:
each engine publishes `<engine_id>.json` with its compatibility hash, and a decoder checks the
engine it is told to pull from. A missing or incompatible engine fails the request, which is what
vLLM's default kv_load_failure_policy (fail) does when the handshake or the transfer fails.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import PREFILL_BACKOFF, EngineConfig

log = logging.getLogger(__name__)

SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")
REMOTE_FIELDS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")

NONE, PRODUCE, CONSUME = "none", "produce", "consume"


@dataclass(frozen=True)
class Handoff:
    """What a request's kv_transfer_params ask of this engine."""

    kind: str
    params: dict[str, Any] | None = None
    problem: str = ""

    @property
    def remote_engine_id(self) -> str | None:
        return str(self.params["remote_engine_id"]) if self.kind == CONSUME and self.params else None

    def remote_tokens(self, prompt_len: int) -> int:
        """Prompt tokens a decoder loads from the prefiller (the prefiller stopped short by the backoff)."""
        return prompt_len - PREFILL_BACKOFF if prompt_len > PREFILL_BACKOFF else prompt_len


def classify(params: Any, connector: bool) -> Handoff:
    if not connector or not isinstance(params, dict) or not params:
        return Handoff(NONE)
    if params.get("do_remote_prefill"):
        if params.get("remote_block_ids") and all(p in params for p in REMOTE_FIELDS):
            return Handoff(CONSUME, params)
        problem = f"Got invalid KVTransferParams: {params}. This request will not utilize KVTransfer"
        log.warning(problem)
        return Handoff(NONE, params, problem)
    if params.get("do_remote_decode"):
        return Handoff(PRODUCE, params)
    return Handoff(NONE, params)


def produced_params(config: EngineConfig, *, rank: int, internal_id: str, computed_tokens: int,
                    block_ids: list[list[int]]) -> dict[str, Any]:
    """A prefill engine's answer, field for field as NixlPullConnectorScheduler.request_finished builds it."""
    serve = config.serve
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": block_ids,
        "remote_engine_id": config.engine_ids[rank],
        "remote_request_id": internal_id,
        "remote_host": config.settings.side_channel_host,
        "remote_port": config.settings.side_channel_port + rank,
        "tp_size": max(serve.tensor, serve.decode_context_parallel),
        "dcp_size": serve.decode_context_parallel,
        "pp_size": serve.pipeline,
        "remote_num_tokens": computed_tokens,
        "remote_blocks_expiry_time": None,
        "remote_registration_generation": 0,
        "transfer_mode": config.transfer_mode,
    }


class Handshakes:
    """The shared folder standing in for NIXL's side channel (None: every remote engine is trusted)."""

    def __init__(self, folder: str | None, config: EngineConfig) -> None:
        self.folder = Path(folder) if folder else None
        self.config = config
        self.compat_hash = config.compat_hash()

    def publish(self) -> None:
        if self.folder is None or not self.config.kv_connector:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        for engine_id in self.config.engine_ids:
            record = {"engine_id": engine_id, "compat_hash": self.compat_hash,
                      "factors": self.config.compat_factors(), "pid": os.getpid()}
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-")
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            os.replace(tmp, self.folder / f"{engine_id}.json")

    def withdraw(self) -> None:
        if self.folder is None:
            return
        for engine_id in self.config.engine_ids:
            (self.folder / f"{engine_id}.json").unlink(missing_ok=True)

    def check(self, remote_engine_id: str) -> str | None:
        """Why a pull from `remote_engine_id` fails, or None when it may go ahead."""
        if self.folder is None:
            return None
        if not SAFE_ID.fullmatch(remote_engine_id):
            return f"NIXL handshake with engine {remote_engine_id[:80]!r} failed: not an engine id"
        try:
            record = json.loads((self.folder / f"{remote_engine_id}.json").read_text())
        except (OSError, ValueError):
            return f"NIXL handshake with engine {remote_engine_id} failed: no such engine"
        if record.get("compat_hash") != self.compat_hash:
            return (f"NIXL handshake with engine {remote_engine_id} failed: compatibility hash "
                    f"{record.get('compat_hash', '')[:12]} != local {self.compat_hash[:12]}")
        return None
