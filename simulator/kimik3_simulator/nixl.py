"""vLLM 0.33.0's P/D request protocol with the NIXL connector, as the simulator speaks it.

The proxy in front (vllm-router in P/D mode) sends a request to a prefill engine with
`kv_transfer_params: {"do_remote_decode": true, ...}` and max_tokens 1; that engine prefills
(all but the last prompt token: Kimi K3's KDA state makes the decoder recompute it), keeps the
blocks, and answers with the parameters a decoder needs to pull them (pull_scheduler.py
`request_finished`). The proxy then sends the original request to a decode engine with those
parameters; with `do_remote_prefill` and a complete set of remote fields the decoder pulls the
KV instead of prefilling (`get_num_new_matched_tokens`, `update_state_after_alloc`). Engines
without a KV connector ignore kv_transfer_params altogether.

The NIXL side channel is a real listener: an engine with a KV connector listens on
VLLM_NIXL_SIDE_CHANNEL_HOST : VLLM_NIXL_SIDE_CHANNEL_PORT + data-parallel rank (vLLM's zmq
handshake listener, nixl/base_scheduler.py), and a decode connects to the `remote_host` /
`remote_port` of the kv_transfer_params it is given. One line-delimited JSON connection per pulled
request carries what NIXL carries over its side channel and its RDMA notifications:

  decode -> prefill  {"op": "handshake"}                 prefill -> {"engine_id", "compat_hash", "factors"}
  decode -> prefill  {"op": "heartbeat", "request_id"}   (no answer; extends the lease)
  decode -> prefill  {"op": "read", "request_id", "block_ids", "notify_only"}
                                                         prefill -> {"state": leased | read | expired | unknown}

The decode refuses a peer whose engine id is not the `remote_engine_id` it was given (a request sent
to the wrong rank's port, or another process now at that address) or whose compatibility hash
differs from its own, as vLLM's handshake does. A connection refused, reset or gone silent fails the
pull: vLLM's kv_load_failure_policy then fails the request (500) or, under `recompute`, the decode
prefills the prompt itself. The real engine handshakes once per remote engine and then reads over
RDMA; the simulator handshakes on every pull, which costs a loopback round trip and notices a dead
prefill the way a failed RDMA read would.

The lease and the single read (nixl/base_scheduler.py:82-88, base_worker.py:631 and 3352-3400,
pull_worker.py:650-701): a prefill keeps a finished request's blocks for kv_lease_duration seconds
(wall seconds, not scaled by K3SIM_TIME_SCALE, since the lease is a timer in vLLM too); each
heartbeat sets the expiry to at least now + 2/3 of the lease; the first read frees the blocks.
vLLM's prefill cannot refuse a read (it is a one-sided RDMA read): a read of blocks already freed,
by an earlier read or by expiry, returns whatever the blocks hold by then, the decode gets no error,
and the prefill only counts vllm:nixl_num_notifications_after_expiry. The simulator counts the same
on the prefill (and tells a second read, a read after expiry and a read of a request it never held
apart in /sim/stats), and answers the decode with the blocks' state, which real NIXL cannot: the
decode then marks its output corrupt (text.CORRUPT_WORD, `corrupt_outputs`) so tests can see the
silent failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from .config import PREFILL_BACKOFF, EngineConfig
from .metrics import EngineMetrics

log = logging.getLogger(__name__)

REMOTE_FIELDS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")

NONE, PRODUCE, CONSUME = "none", "produce", "consume"
LEASED, READ, EXPIRED, UNKNOWN = "leased", "read", "expired", "unknown"
"""What a read finds on the prefill: its lease held (the blocks are the request's), or the blocks
freed by an earlier read, by the lease's expiry, or never held here."""

LINE_LIMIT = 1 << 20
"""The longest side-channel message (block ids of a max-length prompt fit many times over)."""
CONNECT_TIMEOUT = 5.0
REPLY_TIMEOUT = 10.0
IDLE_TIMEOUT = 3600.0
"""A side-channel connection silent this long is closed by the prefill (a decode heartbeats every
lease // 6 seconds while it holds one open)."""
MAX_MESSAGES = 1_000_000
HEARTBEAT_FLOOR = 0.05
"""vLLM heartbeats every scheduler step when lease // 6 is 0; the simulator at most this often."""
MAX_HEARTBEATS = 200_000
FORGOTTEN = 100_000
"""Freed request ids the prefill remembers, to tell a second read from a read after expiry."""


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


class Leases:
    """The prefill side: blocks held for the decodes' reads, each under a lease."""

    @dataclass
    class Lease:
        rank: int
        block_ids: Any
        expires: float

    def __init__(self, config: EngineConfig, metrics: EngineMetrics,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.metrics = metrics
        self.duration = config.kv_lease_duration
        self.extension = config.kv_lease_extension
        self.clock = clock
        self.held: dict[str, Leases.Lease] = {}
        self.freed: OrderedDict[str, str] = OrderedDict()
        self.counts: Counter[str] = Counter()

    def grant(self, request_id: str, rank: int, block_ids: Any) -> None:
        self.held[request_id] = self.Lease(rank, block_ids, self.clock() + self.duration)
        self.counts["leases_granted"] += 1

    def _free(self, request_id: str, why: str) -> None:
        self.freed[request_id] = why
        self.freed.move_to_end(request_id)
        while len(self.freed) > FORGOTTEN:
            self.freed.popitem(last=False)

    def reap(self) -> None:
        """Free every lease that has run out (vLLM's _reap_expired_send_leases)."""
        now = self.clock()
        for request_id in [r for r, lease in self.held.items() if now >= lease.expires]:
            lease = self.held.pop(request_id)
            self._free(request_id, EXPIRED)
            self.counts["expired_leases"] += 1
            if self.metrics.kv_connector:
                self.metrics.of(self.metrics.nixl_kv_expired, lease.rank).inc()
            log.warning("Releasing expired KV blocks for request %s which were retrieved by 0 remote worker(s) "
                        "before lease expired.", request_id)

    def heartbeat(self, request_id: str) -> None:
        self.reap()
        self.counts["heartbeats"] += 1
        lease = self.held.get(request_id)
        if lease is not None:
            lease.expires = max(lease.expires, self.clock() + self.extension)

    def read(self, request_id: str, rank: int) -> str:
        """The decode's read and its completion notification: frees the blocks on the first read,
        counts any other (vLLM: "Potentially invalid KV blocks ...")."""
        self.reap()
        if self.held.pop(request_id, None) is not None:
            self._free(request_id, READ)
            self.counts["reads"] += 1
            return LEASED
        state = self.freed.get(request_id, UNKNOWN)
        self.counts[{READ: "second_reads", EXPIRED: "reads_after_expiry", UNKNOWN: "unknown_reads"}[state]] += 1
        if self.metrics.kv_connector:
            self.metrics.of(self.metrics.nixl_notifications_after_expiry, rank).inc()
        log.error("Potentially invalid KV blocks for unrecognized request %s were retrieved by a decode worker "
                  "(k3sim: %s). They may have expired.", request_id, "already read" if state == READ else state)
        return state

    def as_dict(self) -> dict[str, Any]:
        return {"kv_lease_duration": self.duration, "leases_held": len(self.held),
                **{k: self.counts[k] for k in ("leases_granted", "reads", "second_reads", "reads_after_expiry",
                                               "unknown_reads", "expired_leases", "heartbeats")}}


async def _send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    await writer.drain()


async def _receive(reader: asyncio.StreamReader, timeout: float) -> dict[str, Any]:
    line = await asyncio.wait_for(reader.readline(), timeout)
    if not line:
        raise ConnectionResetError("the remote engine closed the side channel")
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("not a side-channel message")
    return message


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class SideChannel:
    """The listener of each data-parallel rank: handshakes, heartbeats and reads."""

    def __init__(self, config: EngineConfig, leases: Leases, compat_hash: str) -> None:
        self.config = config
        self.leases = leases
        self.compat_hash = compat_hash
        self.servers: list[asyncio.Server] = []
        self.reaper: asyncio.Task[None] | None = None
        self.connections = 0

    @property
    def addresses(self) -> list[tuple[str, int]]:
        s = self.config.settings
        return [(s.side_channel_host, s.side_channel_port + rank) for rank in range(self.config.ranks)]

    async def start(self) -> None:
        """Listen on every rank's port; OSError if one cannot be bound (vLLM fails its start too)."""
        for rank, (host, port) in enumerate(self.addresses):
            # zmq binds IPv4 unless the address is an IPv6 literal (so `localhost` is 127.0.0.1 only)
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self.servers.append(await asyncio.start_server(partial(self._serve, rank), host, port, family=family,
                                                           limit=LINE_LIMIT))
        self.reaper = asyncio.create_task(self._reap(), name="nixl-lease-reaper")

    async def stop(self) -> None:
        if self.reaper is not None:
            self.reaper.cancel()
        for server in self.servers:
            server.close()
        for server in self.servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)

    async def _reap(self) -> None:
        period = min(1.0, max(0.05, self.leases.duration / 4))
        while True:  # until stop() cancels it, with the process
            await asyncio.sleep(period)
            self.leases.reap()

    async def _serve(self, rank: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            for _ in range(MAX_MESSAGES):
                line = await asyncio.wait_for(reader.readline(), IDLE_TIMEOUT)
                if not line:
                    break
                message = json.loads(line)
                op = message.get("op")
                if op == "handshake":
                    await _send(writer, {"engine_id": self.config.engine_ids[rank], "compat_hash": self.compat_hash,
                                         "factors": self.config.compat_factors()})
                elif op == "heartbeat":
                    self.leases.heartbeat(str(message["request_id"]))
                elif op == "read":
                    await _send(writer, {"state": self.leases.read(str(message["request_id"]), rank)})
                else:
                    break
        except (OSError, TimeoutError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.debug("side channel of rank %d: %s", rank, _why(exc))
        finally:
            writer.close()


class Pull:
    """The decode side of one request's hand-off: handshake at once, heartbeat while the request
    waits and its KV moves, then read (or only notify, for an aborted request or a full local hit)."""

    def __init__(self, params: dict[str, Any], compat_hash: str, heartbeat_interval: float,
                 wake: Callable[[], None]) -> None:
        self.engine_id = str(params["remote_engine_id"])
        self.request_id = str(params["remote_request_id"])
        self.host = str(params["remote_host"])
        self.port = params["remote_port"]
        self.block_ids = params.get("remote_block_ids")
        self.compat_hash = compat_hash
        self.interval = max(HEARTBEAT_FLOOR, heartbeat_interval)
        self.wake = wake
        self.go = asyncio.Event()
        self.notify_only = False
        self.done = False
        self.problem: str | None = None
        self.state: str | None = None
        self.heartbeats = 0
        self.task = asyncio.create_task(self._run(), name=f"nixl-pull-{self.request_id[:40]}")

    @property
    def where(self) -> str:
        return f"engine {self.engine_id} at {self.host}:{self.port}"

    def read(self) -> None:
        """The KV has had its modelled transfer time: read it (and notify the prefill)."""
        self.go.set()

    def release(self) -> None:
        """Only notify the prefill, so it frees the blocks: the request was aborted, or every token
        hit the local cache (nixl/pull_worker.py start_load_kv)."""
        if not self.go.is_set():
            self.notify_only = True
            self.go.set()

    async def _run(self) -> None:
        writer: asyncio.StreamWriter | None = None
        try:
            if not isinstance(self.port, int) or isinstance(self.port, bool) or not 0 < self.port < 65536:
                raise ValueError(f"remote_port {self.port!r} is not a port")
            try:
                reader, connected = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port, limit=LINE_LIMIT), CONNECT_TIMEOUT)
                writer = connected
                await _send(connected, {"op": "handshake"})
                peer = await _receive(reader, REPLY_TIMEOUT)
            except (OSError, TimeoutError, ValueError) as exc:
                self.problem = f"NIXL handshake with {self.where} failed: {_why(exc)}"
                return
            self.problem = self._refusal(peer)
            if self.problem is None:
                await self._transfer(reader, connected)
        except (OSError, TimeoutError, ValueError, KeyError) as exc:
            self.problem = f"NIXL transfer from {self.where} failed: {_why(exc)}"
        finally:
            self.done = True
            if writer is not None:
                writer.close()
            self.wake()

    def _refusal(self, peer: dict[str, Any]) -> str | None:
        """Why the decode refuses the engine that answered the handshake, as vLLM's handshake would."""
        if peer.get("engine_id") != self.engine_id:
            return f"NIXL handshake with {self.where} failed: the engine there is {str(peer.get('engine_id'))[:80]}"
        if peer.get("compat_hash") != self.compat_hash:
            return (f"NIXL handshake with {self.where} failed: compatibility hash "
                    f"{str(peer.get('compat_hash'))[:12]} != local {self.compat_hash[:12]}")
        return None

    async def _transfer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Heartbeat until the engine says read, then read and learn what the blocks held."""
        while not self.go.is_set() and self.heartbeats < MAX_HEARTBEATS:
            await _send(writer, {"op": "heartbeat", "request_id": self.request_id})
            self.heartbeats += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.go.wait(), self.interval)
        await self.go.wait()
        await _send(writer, {"op": "read", "request_id": self.request_id, "block_ids": self.block_ids,
                             "notify_only": self.notify_only})
        self.state = str((await _receive(reader, REPLY_TIMEOUT))["state"])


class Nixl:
    """One engine's NIXL agent: the side channel and the leases (as a prefill), the pulls (as a decode)."""

    def __init__(self, config: EngineConfig, metrics: EngineMetrics) -> None:
        self.config = config
        self.compat_hash = config.compat_hash()
        self.enabled = bool(config.kv_connector)
        self.leases = Leases(config, metrics)
        self.side_channel = SideChannel(config, self.leases, self.compat_hash)
        self.counts: Counter[str] = Counter()

    async def start(self) -> None:
        if self.enabled:
            await self.side_channel.start()

    async def stop(self) -> None:
        await self.side_channel.stop()

    def pull(self, params: dict[str, Any], wake: Callable[[], None]) -> Pull:
        self.counts["pulls"] += 1
        return Pull(params, self.compat_hash, self.config.kv_heartbeat_interval, wake)

    async def consume(self, params: dict[str, Any]) -> Pull:
        """Read a request's KV at once and wait for it: what the engine has done with a request it
        took before a fault stops it answering."""
        pull = self.pull(params, lambda: None)
        pull.read()
        await pull.task
        return pull

    def as_dict(self) -> dict[str, Any]:
        return {"listening": [f"{h}:{p}" for h, p in self.side_channel.addresses] if self.enabled else [],
                "pulls": self.counts["pulls"], "failed_pulls": self.counts["failed_pulls"],
                **self.leases.as_dict()}
