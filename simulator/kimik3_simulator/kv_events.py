"""KV cache events as vLLM 0.33.0 publishes them (vllm/distributed/kv_events.py,
vllm/config/kv_events.py): what a precise prefix router subscribes to.

`--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
"replay_endpoint": "tcp://*:5567"}'` gives every data-parallel rank a ZMQ PUB socket at the
endpoint's port + the rank (and a ROUTER replay socket the same way). Each engine step's events go
out as one multipart message (topic, 8-byte big-endian sequence number, msgpack payload): an
EventBatch `[ts, events, data_parallel_rank]` (msgspec, array_like) whose events are tagged maps
(`{"type": "BlockStored", ...}`, defaults omitted). The sequence starts at 0 with the process. A
subscriber that sees a gap asks the replay socket (DEALER: `[b"", start_seq]`), which answers each
buffered batch from that number as `[b"", topic, seq, payload]` and ends with `[b"", b"", -1, b""]`.

The classes here mirror vLLM's field for field (the contract test decodes what the simulator
publishes with vLLM's own classes: tests/contract/test_simulator_kv_events.py). Block hashes are
the low 64 bits of each sha256_cbor digest, as VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES (on by default)
makes them. Per KV cache group: group 0 is K3's MLA attention (`mla_attention`), group 1 its KDA
state (`mamba`), which publishes only at the block ends where a state is kept (prefix_cache.py).

Simplification: the leader publishes for every rank it simulates, from its own address; in vLLM a
rank that runs on a worker node publishes from that node (docs/simulator-faults.md lists what the
simulator leaves out).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq
import zmq.asyncio

log = logging.getLogger(__name__)

MEDIUM_GPU = "GPU"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
MLA_KIND, KDA_KIND = "mla_attention", "mamba"
"""kv_cache_spec_kind of K3's two KV cache groups: MLA attention, and the KDA state vLLM manages
with its mamba-style spec."""


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base class of the events (vLLM's, tagged by class name)."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


def event_hash(digest: bytes) -> int:
    """What an event carries for a block hash (vllm/v1/core/kv_cache_utils.py maybe_convert_block_hash)."""
    return int.from_bytes(digest, "big") & (2**64 - 1)


class KVEventsError(ValueError):
    """--kv-events-config that vLLM would refuse."""


@dataclass(frozen=True)
class KVEventsConfig:
    """vllm/config/kv_events.py's fields and defaults."""

    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @staticmethod
    def parse(text: str | None) -> KVEventsConfig | None:
        if text is None:
            return None
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise KVEventsError(f"--kv-events-config is not JSON: {exc}") from None
        fields = set(KVEventsConfig.__dataclass_fields__)
        if not isinstance(raw, dict) or set(raw) - fields:
            raise KVEventsError(f"--kv-events-config takes the keys {sorted(fields)}")
        publisher = raw.get("publisher") or ("zmq" if raw.get("enable_kv_cache_events") else "null")
        if publisher not in ("null", "zmq"):
            raise KVEventsError(f"unknown KV events publisher {publisher!r}: null or zmq")
        return KVEventsConfig(**{**raw, "publisher": publisher})

    @property
    def publishes(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"

    def for_rank(self, rank: int) -> KVEventsConfig:
        """The rank's resolved config (ZmqEventPublisher.offset_endpoint_port: port + rank)."""
        return KVEventsConfig(**{**self.__dict__, "endpoint": offset(self.endpoint, rank),
                                 "replay_endpoint": offset(self.replay_endpoint, rank)})

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


EPHEMERAL = "tcp://*:0"
"""Bind the node's IP on a port the OS picks; a port of 0 is not offset by the rank."""


def _binds(endpoint: str) -> bool:
    """ZmqEventPublisher._is_bind_endpoint: wildcards and ipc/inproc bind; a named host connects."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def offset(endpoint: str | None, rank: int) -> str | None:
    if not endpoint or rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{rank}"
    host, _, port = endpoint.rpartition(":")
    return f"{host}:{int(port) + rank}" if port.isdigit() and int(port) else endpoint


class RankPublisher:
    """One rank's PUB socket, its replay ROUTER and the buffer replays come from.

    Sockets are set up as ZmqEventPublisher._socket_setup does (distributed/kv_events.py:437-482): a
    PUB endpoint binds when it is a wildcard (`*`, `::`) or ipc/inproc and *connects* otherwise (a
    named host is where a collector listens); the replay socket always binds. `tcp://*:0` binds the
    node's IP (VLLM_HOST_IP, `node_ip` here) on a port the OS picks, and the rank's resolved config,
    which /kv_event_sources lists, then names that address: how a router finds ranks that run on
    other pods without a port plan. Other wildcards stay as given (a consumer supplies the host); the
    simulator binds them on its own --host so tests stay on loopback."""

    def __init__(self, ctx: zmq.asyncio.Context, config: KVEventsConfig, rank: int, host: str,
                 node_ip: str) -> None:
        config = config.for_rank(rank)
        self.rank = rank
        self.topic = config.topic.encode()
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self.seq = 0
        self.encoder = msgspec.msgpack.Encoder()
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, config.hwm)
        self.pub.setsockopt(zmq.LINGER, 0)
        endpoint = config.endpoint
        if _binds(endpoint):
            endpoint = self._bind(self.pub, endpoint, host, node_ip)
        else:
            self.pub.connect(endpoint)
        self.replay: zmq.asyncio.Socket | None = None
        replay = config.replay_endpoint
        if replay:
            self.replay = ctx.socket(zmq.ROUTER)
            self.replay.setsockopt(zmq.SNDHWM, 2 * (config.buffer_steps + 1))
            self.replay.setsockopt(zmq.LINGER, 0)
            replay = self._bind(self.replay, replay, host, node_ip)
        self.config = KVEventsConfig(**{**config.__dict__, "enable_kv_cache_events": True, "publisher": "zmq",
                                        "endpoint": endpoint, "replay_endpoint": replay})

    @staticmethod
    def _bind(sock: zmq.asyncio.Socket, endpoint: str, host: str, node_ip: str) -> str:
        """Bind; returns the endpoint the rank's config names (ZmqEventPublisher._bind)."""
        if endpoint != EPHEMERAL:
            sock.bind(endpoint.replace("://*:", f"://{host}:") if host else endpoint)
            return endpoint
        if node_ip in ("0.0.0.0", "::"):
            raise KVEventsError("tcp://*:0 needs a node IP; set VLLM_HOST_IP")
        if ":" in node_ip:
            sock.setsockopt(zmq.IPV6, 1)
        uri = f"tcp://[{node_ip}]" if ":" in node_ip else f"tcp://{node_ip}"
        sock.bind(f"{uri}:0")
        port = sock.getsockopt_string(zmq.LAST_ENDPOINT).rpartition(":")[2]
        return f"{uri}:{port}"

    async def publish(self, events: list[KVCacheEvent]) -> None:
        payload = self.encoder.encode(EventBatch(ts=time.time(), events=events, data_parallel_rank=self.rank))
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        await self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))

    async def serve_replays(self) -> None:
        if self.replay is None:
            return
        while True:
            frames = await self.replay.recv_multipart()
            if len(frames) != 3:
                log.warning("invalid KV event replay request on rank %d: %d frames", self.rank, len(frames))
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self.buffer):
                if seq >= first:
                    await self.replay.send_multipart((client, b"", self.topic, seq.to_bytes(8, "big"), payload))
            await self.replay.send_multipart((client, b"", b"", END_SEQ, b""))

    def close(self) -> None:
        for sock in (self.pub, self.replay):
            if sock is not None:
                sock.close(linger=0)


def _node_ip(host: str) -> str:
    """VLLM_HOST_IP unset: vLLM guesses the node's IP from its interfaces (utils/network_utils.py
    get_ip); the simulator takes its --host when that names one, else loopback."""
    return host if host and host not in ("0.0.0.0", "::") else "127.0.0.1"


class KVEventPublisher:
    """Every rank's publisher; the engine hands it each step's events per rank."""

    def __init__(self, config: KVEventsConfig, ranks: int, host: str = "", node_ip: str = "") -> None:
        self.config = config
        self.ctx = zmq.asyncio.Context()
        self.ranks = [RankPublisher(self.ctx, config, r, host, node_ip or _node_ip(host)) for r in range(ranks)]
        self.tasks: list[asyncio.Task[None]] = []
        self.counts = {"batches": 0, "events": 0}

    def start(self) -> None:
        self.tasks = [asyncio.create_task(r.serve_replays()) for r in self.ranks]

    async def publish(self, rank: int, events: list[KVCacheEvent]) -> None:
        if events:
            self.counts["batches"] += 1
            self.counts["events"] += len(events)
            await self.ranks[rank].publish(events)

    def sources(self) -> dict[str, dict[str, Any]]:
        """GET /kv_event_sources: each rank's resolved publisher config, by rank."""
        return {str(r.rank): r.config.as_dict() for r in self.ranks}

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for r in self.ranks:
            r.close()
        self.ctx.term()
