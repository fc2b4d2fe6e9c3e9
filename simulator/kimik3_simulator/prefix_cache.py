"""Prefix caching the way vLLM keys it: chained hashes of full KV blocks of prompt token ids, LRU-evicted.

A block's hash covers its token ids (vocab.py, what /tokenize returns, so a text prompt and the
same prompt sent as ids share blocks, and a router's prefix tree over ids agrees with the cache)
and the hash of the block before it, so a hit is always a prefix. Only full blocks are cached,
and a prompt always computes at least its last token, so a repeated prompt of N tokens hits
floor((N - 1) / block) blocks. Kimi K3's KDA state makes real hits sparser (vLLM keeps KDA
checkpoints only at retention boundaries); the simulator treats every block boundary as one.
Each data-parallel rank has its own cache, bounded in blocks.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from .vocab import token_id


def block_hashes(tokens: Sequence[str], block_size: int) -> list[bytes]:
    ids = array("L", map(token_id, tokens))
    out: list[bytes] = []
    parent = b""
    for start in range(0, len(ids) - block_size + 1, block_size):
        digest = hashlib.blake2b(parent, digest_size=16)
        digest.update(ids[start:start + block_size].tobytes())
        parent = digest.digest()
        out.append(parent)
    return out


class PrefixCache:
    def __init__(self, capacity_blocks: int, enabled: bool = True) -> None:
        self.capacity = max(1, capacity_blocks)
        self.enabled = enabled
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, hashes: Sequence[bytes], prompt_len: int, block_size: int) -> int:
        """Prompt tokens already cached, leaving at least the last token to compute."""
        if not self.enabled:
            return 0
        usable = (prompt_len - 1) // block_size
        hit = 0
        for h in hashes[:usable]:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            hit += 1
        return hit * block_size

    def insert(self, hashes: Sequence[bytes]) -> None:
        if not self.enabled:
            return
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
