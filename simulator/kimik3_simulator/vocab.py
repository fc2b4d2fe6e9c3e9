"""Token ids for the simulator's whitespace tokens (text.py), what /tokenize and /render return.

The engine counts prompts in words and keys its prefix cache by these ids (prefix_cache.py), so a
router's prefix tree over the ids /tokenize gives agrees with the engine's cache. An id only has
to be stable per word: a word's id is a 31-bit hash of it, except `#N`, the word a token-id
prompt's id N becomes, which keeps N, so ids a client sends and ids /tokenize returns mean the
same token. /detokenize spells an id whose word it never saw as `#N`, which tokenizes back to N.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence

ID_BITS = 31
"""Hashed ids stay under 2**31: within the u32 a router parses ids into (vllm-router's
dense_token_ids) and any int32 tensor."""
REMEMBERED_IDS = 1 << 20
"""Ids whose word /detokenize can give back; later words still get ids but detokenize as #N."""


def token_id(word: str) -> int:
    digits = word[1:]
    if word[:1] == "#" and digits.isascii() and digits.isdigit() and int(digits) < 1 << 32:
        return int(digits)
    return zlib.crc32(word.encode()) >> (32 - ID_BITS)  # a C-speed hash: an 8k-word prompt takes ~1 ms


class Vocabulary:
    """Word -> id is a pure function; id -> word is remembered for the words this engine has seen."""

    def __init__(self, capacity: int = REMEMBERED_IDS) -> None:
        self.capacity = capacity
        self._words: dict[int, str] = {}

    def encode(self, words: Iterable[str]) -> list[int]:
        ids = []
        for word in words:
            tid = token_id(word)
            if len(self._words) < self.capacity:
                self._words.setdefault(tid, word)
            ids.append(tid)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self._words.get(tid, f"#{tid}") for tid in ids)
