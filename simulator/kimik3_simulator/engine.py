"""The simulated engine core: vLLM's continuous batching as one asyncio step loop per replica.

Each data-parallel rank has its own scheduler state (waiting queue, running batch up to
--max-num-seqs, KV budget, prefix cache) the way each vLLM DP engine core does; the ranks step
together, as DP+EP ranks do, so one loop runs them all. A step takes the larger (a roofline) of
the slowest rank's prefill chunks (chunked prefill under --max-num-batched-tokens, decodes first)
and the perf model's decode step over every sequence in the step: a forward pass pays at least
its memory traffic. At the end of a step each decoding sequence emits one token, or under DSpark
the acceptance length on average (a running credit, so 2.61 emits 2, 3, 3, 2, 3, ... and the mean
is exact); a sequence whose prompt is done emits its first token. Steps chain on a modelled
clock, so event-loop wake-up jitter does not add up.

A decode engine told to pull KV (nixl.CONSUME) handshakes with the prefill over its side channel
as soon as the request arrives and heartbeats its lease while the request waits (nixl.Pull); once
scheduled it waits for the transfer off the step loop, as NIXL's async load does, reads the blocks
at the end of the modelled transfer time, then computes the one backoff token and carries on (a
read the prefill did not hold a lease for marks the request corrupt); a prefill engine asked to
produce (nixl.PRODUCE) computes all but the backoff token, emits one token and returns the
kv_transfer_params. Simplifications: no preemption (a full KV budget only holds new requests in
the queue), no prefill/decode interference beyond the roofline max of the two, no draft-model cost.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .config import MAX_PREFIX_CACHE_BLOCKS, PREFILL_BACKOFF, EngineConfig
from .kv_events import KVEventPublisher
from .metrics import EngineMetrics
from .nixl import CONSUME, LEASED, PRODUCE, Handoff, Nixl, Pull, produced_params
from .prefix_cache import PrefixCache, Retention, id_block_hashes
from .stats import LOCAL, PRODUCED, RECOMPUTED, REMOTE, SimStats
from .timing import KV_POST_SECONDS

WAITING, TRANSFER, PREFILL, DECODE, DONE = "waiting", "transfer", "prefill", "decode", "done"
CATCH_UP_SECONDS = 0.02
"""How far the modelled clock may lag the wall clock before a late step starts from now instead."""


class QueueFull(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Submission:
    key: str
    """What /sim/stats files the request under: the X-Request-Id header, else the response id."""
    internal_id: str
    tokens: list[str]
    ids: list[int]
    """The prompt's token ids (what return_token_ids gives back as prompt_token_ids)."""
    fingerprint: str
    max_tokens_param: int | None
    limit: int
    """Tokens this request will generate."""
    finish_at_limit: str
    handoff: Handoff
    rank: int | None = None
    """The data-parallel rank the client chose (X-data-parallel-rank, checked in range), else least loaded."""


@dataclass(frozen=True)
class Output:
    new_tokens: int
    finish_reason: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    error: str | None = None


@dataclass(eq=False)
class Sequence:
    sub: Submission
    rank: int
    arrival: float
    events: asyncio.Queue[Output] = field(default_factory=asyncio.Queue)
    hashes: list[bytes] = field(default_factory=list)
    phase: str = WAITING
    target: int = 0
    """Prompt tokens that must be in the KV cache before the first token."""
    computed: int = 0
    local_hit: int = 0
    external: int = 0
    transfer_until: float = 0.0
    generated: int = 0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_output_at: float = 0.0
    credit: float = 0.0
    aborted: bool = False
    problem: str = ""
    pull: Pull | None = None
    """The hand-off from the prefill (CONSUME requests)."""
    corrupt: str = ""
    """Why the KV this request decodes from was not its prompt's (a second read, a read after expiry)."""

    @property
    def prompt_len(self) -> int:
        return len(self.sub.tokens)

    @property
    def context(self) -> int:
        return self.computed + self.generated


@dataclass
class Rank:
    index: int
    cache: PrefixCache
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)
    next_block: int = 0

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.running)


@dataclass
class StepPlan:
    decodes: list[Sequence]
    chunks: list[tuple[Sequence, int]]
    seconds: float

    @property
    def empty(self) -> bool:
        return not self.decodes and not self.chunks


class Engine:
    def __init__(self, config: EngineConfig, metrics: EngineMetrics, stats: SimStats, nixl: Nixl,
                 publisher: KVEventPublisher | None = None) -> None:
        self.config = config
        self.perf = config.perf
        self.metrics = metrics
        self.stats = stats
        self.nixl = nixl
        self.scale = config.settings.time_scale
        cache_blocks = min(config.num_gpu_blocks, MAX_PREFIX_CACHE_BLOCKS)
        retention = Retention(self.perf.block_size, config.serve.retention_interval)
        self.ranks = [Rank(r, PrefixCache(cache_blocks, retention, config.serve.prefix_caching))
                      for r in range(config.ranks)]
        self.publisher = publisher
        if publisher is not None:
            for rank in self.ranks:
                rank.cache.events = []
        self.wake = asyncio.Event()
        self.clock: float | None = None
        self.stopping = False

    # ---- the API side -----------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return sum(r.load for r in self.ranks)

    def submit(self, sub: Submission) -> Sequence:
        queued = sum(len(r.waiting) for r in self.ranks)
        limit = self.config.serve.max_num_queued_reqs
        if limit is not None and queued >= limit:
            self.metrics.admission_rejections.labels(self.metrics.model_name, "max_num_queued_reqs").inc()
            raise QueueFull("max_num_queued_reqs")
        if queued >= self.config.settings.max_queued:
            raise QueueFull("K3SIM_MAX_QUEUED")
        rank = sub.rank if sub.rank is not None else min(self.ranks, key=lambda r: (r.load, r.index)).index
        seq = Sequence(sub=sub, rank=rank, arrival=asyncio.get_running_loop().time(), hashes=self._hashes(sub.ids))
        if sub.handoff.kind == CONSUME and sub.handoff.params is not None:
            seq.pull = self.nixl.pull(sub.handoff.params, self.wake.set)
        self.ranks[rank].waiting.append(seq)
        self.wake.set()
        return seq

    def _hashes(self, ids: list[int]) -> list[bytes]:
        """A prompt's block keys, as this engine's cache keys them."""
        return id_block_hashes(ids, self.perf.block_size, self.config.serve.prefix_caching_hash_algo)

    def prefix_hits(self, ids: list[int]) -> dict[str, int]:
        """Each rank's true hit for a prompt of these ids now (PrefixCache.hit: nothing is touched)."""
        hashes = self._hashes(ids)
        return {str(rank.index): rank.cache.hit(hashes, len(ids)) for rank in self.ranks}

    def abort(self, seq: Sequence) -> None:
        if seq.phase != DONE:
            seq.aborted = True
            self.wake.set()

    # ---- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            self._reap_aborted(now)
            self._finish_transfers(now)
            fresh = self._admit(now)
            plan = self._plan()
            self._publish_gauges()
            if plan.empty:
                if self.stopping and not self.in_flight:
                    return
                self.clock = None
                transfers = [s.transfer_until for r in self.ranks for s in r.running
                             if s.phase == TRANSFER and s.pull is not None and not s.pull.go.is_set()]
                self.wake.clear()
                timeout = max(0.0, min(transfers) - now) if transfers else None
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout)
                except TimeoutError:
                    pass
                continue
            start = now if self.clock is None else max(self.clock, now - CATCH_UP_SECONDS)
            start = max([start, *(s.arrival for s in fresh)])
            self.clock = start + plan.seconds * self.scale
            if self.clock > loop.time():
                await asyncio.sleep(self.clock - loop.time())
            self._apply(plan, loop.time())
            await self._publish_events()

    async def _publish_events(self) -> None:
        """A step's KV events, one batch per rank (vLLM publishes once per engine step)."""
        if self.publisher is None:
            return
        for rank in self.ranks:
            events = rank.cache.events
            if events:
                rank.cache.events = []
                await self.publisher.publish(rank.index, events)

    def _reap_aborted(self, now: float) -> None:
        for rank in self.ranks:
            for seq in [s for s in [*rank.waiting, *rank.running] if s.aborted]:
                self._finish(rank, seq, now, "abort")

    def _finish_transfers(self, now: float) -> None:
        m = self.metrics
        for rank in self.ranks:
            for seq in list(rank.running):
                pull = seq.pull
                if seq.phase != TRANSFER or pull is None:
                    continue
                if seq.transfer_until <= now:
                    pull.read()
                if not pull.done:
                    continue
                if pull.problem:
                    self._failed_load(rank, seq, now, pull.problem)
                    continue
                if pull.state != LEASED:
                    seq.corrupt = (f"read the KV blocks of request {pull.request_id} from engine {pull.engine_id} "
                                   f"after they were freed ({pull.state})")
                seq.computed += seq.external
                seq.phase = PREFILL
                moved = self.perf.kv_transfer(seq.external)
                m.of(m.nixl_xfer_time, rank.index).observe(moved.seconds * self.scale)
                m.of(m.nixl_post_time, rank.index).observe(KV_POST_SECONDS * self.scale)
                m.of(m.nixl_bytes, rank.index).observe(moved.bytes)
                m.of(m.nixl_descriptors, rank.index).observe(moved.descriptors)

    def _failed_load(self, rank: Rank, seq: Sequence, now: float, problem: str) -> None:
        """The pull failed: under kv_load_failure_policy recompute vLLM's scheduler resets the request
        and it prefills here (v1/core/sched/scheduler.py:3688-3701), else the request fails (500)."""
        m = self.metrics
        m.of(m.nixl_failed_transfers, rank.index).inc()
        self.nixl.counts["failed_pulls"] += 1
        seq.problem = problem
        seq.external = 0
        seq.computed = seq.local_hit
        seq.phase = PREFILL
        if not self.config.recompute_failed_loads:
            self._finish(rank, seq, now, "error")

    def _admit(self, now: float) -> list[Sequence]:
        fresh: list[Sequence] = []
        for rank in self.ranks:
            used = sum(self.perf.sequence_bytes(s.context) for s in rank.running)
            while rank.waiting and len(rank.running) < self.config.max_num_seqs:
                seq = rank.waiting[0]
                need = self.perf.sequence_bytes(seq.prompt_len)
                if rank.running and used + need > self.config.kv_capacity_bytes:
                    break
                rank.waiting.popleft()
                used += need
                self._schedule(rank, seq, now)
                if seq.phase == DONE:
                    continue
                rank.running.append(seq)
                fresh.append(seq)
        return fresh

    def _schedule(self, rank: Rank, seq: Sequence, now: float) -> None:
        m, n = self.metrics, seq.prompt_len
        seq.scheduled_at = now
        seq.local_hit = rank.cache.match(seq.hashes, n)
        seq.computed = seq.local_hit
        seq.target = n
        m.of(m.prefix_queries, rank.index).inc(n)
        m.of(m.prefix_hits, rank.index).inc(seq.local_hit)
        m.of(m.prompt_cached_by_source, rank.index, "device").inc(seq.local_hit)
        handoff = seq.sub.handoff
        if handoff.kind == PRODUCE and n > PREFILL_BACKOFF:
            seq.target = n - PREFILL_BACKOFF  # the prefiller stops short; the decoder recomputes the rest
        seq.phase = PREFILL
        if handoff.kind != CONSUME or seq.pull is None:
            return
        if seq.pull.done and seq.pull.problem:  # the handshake already failed while the request waited
            self._failed_load(rank, seq, now, seq.pull.problem)
            return
        seq.external = max(0, handoff.remote_tokens(n) - seq.local_hit)
        if seq.external:
            seq.phase = TRANSFER
            seq.transfer_until = now + self.perf.kv_transfer(seq.external).seconds * self.scale
        else:
            seq.pull.release()  # every token hit the local cache: the prefill is only told to free

    def _plan(self) -> StepPlan:
        decodes: list[Sequence] = []
        chunks: list[tuple[Sequence, int]] = []
        prefill_s = 0.0
        per_decode = 1 + self.perf.spec_tokens
        for rank in self.ranks:
            mine = [s for s in rank.running if s.phase == DECODE]
            decodes += mine
            budget = self.config.max_num_batched_tokens - per_decode * len(mine)
            rank_s = 0.0
            for seq in rank.running:
                if seq.phase != PREFILL or budget <= 0:
                    continue
                take = min(seq.target - seq.computed, budget)
                budget -= take
                chunks.append((seq, take))
                rank_s += self.perf.prefill_s(seq.computed + take, seq.computed)
            prefill_s = max(prefill_s, rank_s)
        batch = decodes + [s for s, _ in chunks]
        context = sum(s.context for s in batch) / len(batch) if batch else 0
        # Roofline: a step is bound by the larger of the prefill chunks' compute and the memory
        # traffic of a forward pass over every sequence in it (weights, KV, KDA state).
        return StepPlan(decodes, chunks, max(prefill_s, self.perf.decode_step_s(len(batch), context)))

    def _apply(self, plan: StepPlan, now: float) -> None:
        m = self.metrics
        step_tokens = [0] * len(self.ranks)
        for seq in plan.decodes:
            if seq.phase != DECODE:
                continue
            n = self._accepted(seq, seq.sub.limit - seq.generated)
            step_tokens[seq.rank] += n
            m.of(m.itl, seq.rank).observe(now - seq.last_output_at)
            self._emit(seq, n, now)
        for seq, take in plan.chunks:
            if seq.phase != PREFILL:
                continue
            seq.computed += take
            step_tokens[seq.rank] += take
            if seq.computed >= seq.target:
                self._prefilled(seq, now)
        for rank in self.ranks:
            if step_tokens[rank.index]:
                m.of(m.iteration_tokens, rank.index).observe(step_tokens[rank.index])

    def _accepted(self, seq: Sequence, room: int) -> int:
        """Tokens one step emits for `seq` (at most `room`), and the spec-decode counters vLLM keeps."""
        k = self.perf.spec_tokens
        if not k:
            return 1
        seq.credit += self.config.acceptance
        n = max(1, min(int(seq.credit), 1 + k))
        seq.credit -= n
        n = min(n, room)
        m = self.metrics
        m.of(m.spec_drafts, seq.rank).inc()
        m.of(m.spec_draft_tokens, seq.rank).inc(k)
        m.of(m.spec_accepted, seq.rank).inc(n - 1)
        for pos in range(n - 1):
            m.of(m.spec_accepted_per_pos, seq.rank, str(pos)).inc()
        return n

    def _prefilled(self, seq: Sequence, now: float) -> None:
        rank, m = self.ranks[seq.rank], self.metrics
        rank.cache.insert(seq.hashes, seq.prompt_len, seq.computed,
                          loaded_from_prefill=seq.sub.handoff.kind == CONSUME and seq.external > 0, ids=seq.sub.ids)
        local = seq.prompt_len - seq.local_hit - seq.external
        m.of(m.prompt_tokens, rank.index).inc(seq.prompt_len)
        for source, count in (("local_compute", local), ("local_cache_hit", seq.local_hit),
                              ("external_kv_transfer", seq.external)):
            m.of(m.prompt_by_source, rank.index, source).inc(count)
        m.of(m.prompt_cached, rank.index).inc(seq.local_hit + seq.external)
        m.of(m.ttft, rank.index).observe(now - seq.arrival)
        seq.first_token_at = now
        seq.phase = DECODE
        self._emit(seq, 1, now)

    def _emit(self, seq: Sequence, n: int, now: float) -> None:
        seq.generated += n
        seq.last_output_at = now
        self.metrics.of(self.metrics.generation_tokens, seq.rank).inc(n)
        if seq.generated >= seq.sub.limit:
            self._finish(self.ranks[seq.rank], seq, now, seq.sub.finish_at_limit, emitted=n)
        else:
            seq.events.put_nowait(Output(n))

    def _finish(self, rank: Rank, seq: Sequence, now: float, reason: str, emitted: int = 0) -> None:
        if seq in rank.running:
            rank.running.remove(seq)
        elif seq in rank.waiting:
            rank.waiting.remove(seq)
        seq.phase = DONE
        if seq.pull is not None:
            seq.pull.release()  # an aborted request still tells the prefill to free its blocks
        params = None
        if seq.sub.handoff.kind == PRODUCE and reason in ("stop", "length"):
            params = produced_params(self.config, rank=rank.index, internal_id=seq.sub.internal_id,
                                     computed_tokens=seq.computed, block_ids=self._blocks(rank, seq.computed))
            self.nixl.leases.grant(seq.sub.internal_id, rank.index, params["remote_block_ids"])
        seq.events.put_nowait(Output(emitted, reason, params, error=seq.problem if reason == "error" else None))
        self._observe_finished(rank, seq, now, reason)

    def _blocks(self, rank: Rank, tokens: int) -> list[list[int]]:
        """Block ids the prefiller holds for the decoder: MLA pages, then the KDA state page."""
        count = math.ceil(tokens / self.perf.block_size) + 1
        ids = [(rank.next_block + i) % self.config.num_gpu_blocks for i in range(count)]
        rank.next_block = (rank.next_block + count) % self.config.num_gpu_blocks
        return [ids[:-1], ids[-1:]]

    def _observe_finished(self, rank: Rank, seq: Sequence, now: float, reason: str) -> None:
        m, r = self.metrics, rank.index
        m.of(m.success, r, reason).inc()
        scheduled = seq.scheduled_at if seq.scheduled_at is not None else now
        first = seq.first_token_at if seq.first_token_at is not None else now
        for phase, seconds in (("e2e", now - seq.arrival), ("queue", scheduled - seq.arrival),
                               ("inference", now - scheduled), ("prefill", first - scheduled), ("decode", now - first)):
            m.of(m.phase_time[phase], r).observe(seconds)
        m.of(m.num_preemptions, r).observe(0)
        m.of(m.prefill_kv_computed, r).observe(max(0, seq.prompt_len - seq.local_hit - seq.external))
        m.of(m.prompt_tokens_hist, r).observe(seq.prompt_len)
        m.of(m.generation_tokens_hist, r).observe(seq.generated)
        m.of(m.max_generation_tokens, r).observe(seq.generated)  # the most any of n samples generated
        m.of(m.params_n, r).observe(1)
        if seq.sub.max_tokens_param:
            m.of(m.params_max_tokens, r).observe(seq.sub.max_tokens_param)
        m.of(m.tpot, r).observe((now - first) / (seq.generated - 1) if seq.generated > 1 else 0.0)
        handoff = seq.sub.handoff
        path = PRODUCED if handoff.kind == PRODUCE else LOCAL if handoff.kind != CONSUME \
            else RECOMPUTED if seq.problem and reason != "error" else REMOTE
        self.stats.record(seq.sub.key, {
            "request_id": seq.sub.key, "internal_id": seq.sub.internal_id, "path": path, "rank": r,
            "prompt_tokens": seq.prompt_len, "prompt_fingerprint": seq.sub.fingerprint,
            "local_cache_hit_tokens": seq.local_hit, "external_kv_tokens": seq.external,
            "computed_prompt_tokens": max(0, seq.computed - seq.local_hit - seq.external),
            "completion_tokens": seq.generated, "finish_reason": reason,
            "remote_engine_id": handoff.remote_engine_id, "problem": seq.problem or handoff.problem or None,
            "corrupt_kv": seq.corrupt or None,
            "ttft_seconds": None if seq.first_token_at is None else round(seq.first_token_at - seq.arrival, 6),
            "e2e_seconds": round(now - seq.arrival, 6),
        })

    def _publish_gauges(self) -> None:
        m = self.metrics
        for rank in self.ranks:
            transfers = sum(1 for s in rank.running if s.phase == TRANSFER)
            running = len(rank.running) - transfers
            m.of(m.running, rank.index).set(running)
            m.of(m.waiting, rank.index).set(len(rank.waiting) + transfers)
            m.of(m.waiting_by_reason, rank.index, "capacity").set(len(rank.waiting))
            m.of(m.waiting_by_reason, rank.index, "deferred").set(transfers)
            if m.kv_fetch is not None:
                m.of(m.kv_fetch, rank.index, "in_progress").set(transfers)
            used = sum(self.perf.sequence_bytes(s.context) for s in rank.running)
            m.of(m.kv_usage, rank.index).set(min(1.0, used / self.config.kv_capacity_bytes))
