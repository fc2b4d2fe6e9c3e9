"""Prefix caching as vLLM 0.33.0 keys and keeps it for Kimi K3, a hybrid of MLA attention and KDA
linear attention (docs/vllm-facts.md §5a).

Keys: `--prefix-caching-hash-algo` (sha256_cbor, which the operator renders, or vLLM's default
sha256 over pickle), vLLM's chain (v1/core/kv_cache_utils.py
hash_block_tokens): a full block's hash is sha256 of the canonical CBOR of (parent hash, the block's
token ids, extra keys: None here), the first block's parent NONE_HASH = sha256_cbor of
$PYTHONHASHSEED or, unset, "vllm-none-hash" (init_none_hash). Token ids are vocab.py's, what
/tokenize returns, so a text prompt and the same prompt sent as ids share blocks, and anyone with the
ids can recompute a key (tests/contract checks the chain against vLLM's own functions).

What is kept (v1/core/single_type_kv_cache_manager.py, MambaManager): MLA keeps every full block
computed. KDA keeps its recurrent state only at some block ends (align mode: the state block size is
the attention block size):
- `--prefix-cache-retention-interval 0` (vLLM's default, Selective here): the prompt's checkpoint
  only, at floor((N - 1) / B) * B for a prompt of N tokens;
- a positive interval: also every block ending at a multiple of it;
- None (Dense): every block end.
A decode that received its KV from a prefill loaded N - 1 tokens and keeps a state at N - 1 only,
when that is a block end. Both kinds share the block pool (the KDA page is padded to the attention
page), LRU-evicted.

A hit (v1/core/kv_cache_coordinator.py, the hybrid fixed point): MLA takes the longest run of cached
blocks from the start, at most floor((N - 1) / B) (a prompt always computes its last token); KDA then
takes the last block end within that run whose state is cached; the hit is that block end, or 0. So
counting cached MLA blocks over-estimates a K3 hit, often by the whole prompt.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import cbor2

from .kv_events import KDA_KIND, MEDIUM_GPU, MLA_KIND, BlockRemoved, BlockStored, KVCacheEvent, event_hash
from .vocab import token_id

MLA, KDA = "mla", "kda"
"""The two kinds of cached block (vLLM's kv_cache_spec_kind: mla_attention, mamba)."""


def sha256_cbor(value: object) -> bytes:
    """vllm/utils/hashing.py sha256_cbor: language-neutral, what a router can recompute."""
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def sha256_pickle(value: object) -> bytes:
    """vllm/utils/hashing.py sha256, vLLM's default: over Python's pickle."""
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


HASH_ALGOS: dict[str, Callable[[object], bytes]] = {"sha256_cbor": sha256_cbor, "sha256": sha256_pickle}
"""--prefix-caching-hash-algo values the simulator computes (vLLM's xxhash ones need the xxhash wheel
and seed randomly: keys no one else could recompute)."""


def none_hash(algo: str = "sha256_cbor") -> bytes:
    """The first block's parent (kv_cache_utils.init_none_hash): from $PYTHONHASHSEED as it is now,
    hashed once per seed and algorithm, not once per request."""
    return _none_hash(algo, os.getenv("PYTHONHASHSEED"))


@functools.cache
def _none_hash(algo: str, seed: str | None) -> bytes:
    return HASH_ALGOS[algo](seed if seed is not None else "vllm-none-hash")


def block_hashes(tokens: Sequence[str], block_size: int, algo: str = "sha256_cbor") -> list[bytes]:
    return id_block_hashes([token_id(t) for t in tokens], block_size, algo)


def id_block_hashes(ids: Sequence[int], block_size: int, algo: str = "sha256_cbor") -> list[bytes]:
    """The keys of a prompt's full blocks from its token ids (what the engine has already)."""
    fn = HASH_ALGOS[algo]
    out: list[bytes] = []
    parent = none_hash(algo)
    for start in range(0, len(ids) - block_size + 1, block_size):
        parent = fn((parent, tuple(ids[start:start + block_size]), None))
        out.append(parent)
    return out


@dataclass(frozen=True)
class Retention:
    """Which block ends keep a KDA state: `interval` as vLLM's --prefix-cache-retention-interval
    (0 semantic only, None every block, else also its multiples)."""

    block_size: int
    interval: int | None = 0

    def kept(self, prompt_len: int, computed: int, loaded_from_prefill: bool) -> list[int]:
        """Indexes of the full blocks (of `computed` tokens) whose end keeps a state. A decode that
        loaded N - 1 tokens from a prefill computed no state below N - 1: it keeps the one at N - 1
        (a block end only) and, past it, what it computed itself."""
        b, full = self.block_size, computed // self.block_size
        own = (prompt_len - 1) // b if loaded_from_prefill else 0  # blocks ending above N - 1 are its own
        if self.interval is None:
            kept = set(range(own, full))
        else:
            kept = {i for i in range(own, full) if self.interval and ((i + 1) * b) % self.interval == 0}
        boundary = prompt_len - 1 if loaded_from_prefill else (prompt_len - 1) // b * b
        if boundary > 0 and boundary % b == 0 and boundary // b <= full:
            kept.add(boundary // b - 1)
        return sorted(kept)


class PrefixCache:
    """One data-parallel rank's cache: MLA blocks and KDA states in one LRU pool of blocks."""

    def __init__(self, capacity_blocks: int, retention: Retention, enabled: bool = True) -> None:
        self.capacity = max(1, capacity_blocks)
        self.retention = retention
        self.enabled = enabled
        self._blocks: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        self.events: list[KVCacheEvent] | None = None
        """Set (to a list) by an engine that publishes KV events: what changed since it last took them."""

    def __len__(self) -> int:
        return len(self._blocks)

    def holds(self, kind: str, h: bytes) -> bool:
        return (kind, h) in self._blocks

    def hit(self, hashes: Sequence[bytes], prompt_len: int) -> int:
        """The true K3 hit in tokens, touching nothing (what an oracle reads)."""
        if not self.enabled:
            return 0
        b = self.retention.block_size
        mla = 0
        for h in hashes[:(prompt_len - 1) // b]:
            if (MLA, h) not in self._blocks:
                break
            mla += 1
        for i in range(mla - 1, -1, -1):
            if (KDA, hashes[i]) in self._blocks:
                return (i + 1) * b
        return 0

    def match(self, hashes: Sequence[bytes], prompt_len: int) -> int:
        """Prompt tokens already cached (hit), the blocks it uses made most recently used."""
        tokens = self.hit(hashes, prompt_len)
        blocks = tokens // self.retention.block_size
        for i in range(blocks):
            self._touch((MLA, hashes[i]))
        if blocks:
            self._touch((KDA, hashes[blocks - 1]))
        return tokens

    def insert(self, hashes: Sequence[bytes], prompt_len: int, computed: int,
               loaded_from_prefill: bool = False, ids: Sequence[int] = ()) -> None:
        """What a request that computed (or loaded) `computed` prompt tokens leaves in the cache;
        with events on, a BlockStored per run of new MLA blocks and per new KDA state (its block's
        `ids`), a BlockRemoved per evicted one, as vLLM's block pool reports them."""
        if not self.enabled:
            return
        new_mla = [i for i, h in enumerate(hashes[:computed // self.retention.block_size]) if self._touch((MLA, h))]
        new_kda = [i for i in self.retention.kept(prompt_len, computed, loaded_from_prefill)
                   if self._touch((KDA, hashes[i]))]
        if self.events is not None:
            for run in _runs(new_mla):
                self.events.append(self._stored(hashes, ids, run, 0, MLA_KIND))
            for i in new_kda:
                self.events.append(self._stored(hashes, ids, [i], 1, KDA_KIND))
        while len(self._blocks) > self.capacity:
            (kind, h), _ = self._blocks.popitem(last=False)
            if self.events is not None:
                self.events.append(BlockRemoved(block_hashes=[event_hash(h)], medium=MEDIUM_GPU,
                                                group_idx=0 if kind == MLA else 1))

    def _stored(self, hashes: Sequence[bytes], ids: Sequence[int], blocks: list[int], group: int,
                kind: str) -> BlockStored:
        b = self.retention.block_size
        first = blocks[0]
        return BlockStored(block_hashes=[event_hash(hashes[i]) for i in blocks],
                           parent_block_hash=event_hash(hashes[first - 1]) if first else None,
                           token_ids=list(ids[first * b:(blocks[-1] + 1) * b]), block_size=b, lora_id=None,
                           medium=MEDIUM_GPU, lora_name=None, group_idx=group, kv_cache_spec_kind=kind)

    def _touch(self, key: tuple[str, bytes]) -> bool:
        """Make `key` most recently used; True if it was not cached."""
        new = key not in self._blocks
        self._blocks[key] = None
        self._blocks.move_to_end(key)
        return new


def _runs(indexes: list[int]) -> list[list[int]]:
    """Consecutive runs of block indexes: one BlockStored each (a parent, then its blocks in order)."""
    runs: list[list[int]] = []
    for i in indexes:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs
