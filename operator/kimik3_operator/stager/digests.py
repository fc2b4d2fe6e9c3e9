"""Hashing while bytes stream by, and the checksums a source gives to check them against.

Every file gets a sha256 (recorded in the manifest); a source adds what it can vouch for: the Hub's
LFS sha256 or git blob id, an S3 ETag (md5 of a single-part upload, md5 of the part md5s of a
multipart one), or a ``SHA256SUMS`` file next to the files (s3:// and pvc://).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any, BinaryIO

from .errors import ChecksumMismatch

HASH_BLOCK = 8 * 1024 * 1024
SUMS_NAMES = ("SHA256SUMS", "sha256sums.txt")
"""A checksum file at the root of an s3:// prefix or a pvc:// folder, in ``sha256sum`` format."""
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def git_blob_header(size: int) -> bytes:
    return b"blob %d\x00" % size


class Digests:
    """Incremental digests over a byte stream: always sha256, plus whatever the source can check
    (git blob sha1, md5 of a single-part S3 object, composite md5 of a multipart S3 object)."""

    def __init__(self, *, size: int, algorithms: Iterable[str], part_size: int = 0) -> None:
        algos = set(algorithms)
        self._size = size
        self.sha256 = hashlib.sha256()
        self._sha1 = hashlib.sha1(git_blob_header(size)) if "git-sha1" in algos else None
        self._md5 = hashlib.md5(usedforsecurity=False) if "md5" in algos else None
        self._part_size = part_size if "s3-multipart" in algos else 0
        self._part_md5s: list[bytes] = []
        self._part = hashlib.md5(usedforsecurity=False) if self._part_size else None
        self._part_fill = 0

    def update(self, data: bytes | memoryview) -> None:
        self.sha256.update(data)
        if self._sha1 is not None:
            self._sha1.update(data)
        if self._md5 is not None:
            self._md5.update(data)
        if self._part is not None:
            view = memoryview(data)
            while view:
                take = min(len(view), self._part_size - self._part_fill)
                self._part.update(view[:take])
                self._part_fill += take
                view = view[take:]
                if self._part_fill == self._part_size:
                    self._part_md5s.append(self._part.digest())
                    self._part = hashlib.md5(usedforsecurity=False)
                    self._part_fill = 0

    def result(self) -> dict[str, str]:
        out = {"sha256": self.sha256.hexdigest()}
        if self._sha1 is not None:
            out["git-sha1"] = self._sha1.hexdigest()
        if self._md5 is not None:
            out["md5"] = self._md5.hexdigest()
        if self._part is not None:
            md5s = self._part_md5s + ([self._part.digest()] if self._part_fill else [])
            composite = hashlib.md5(b"".join(md5s), usedforsecurity=False).hexdigest()
            out["s3-multipart"] = f"{composite}-{len(md5s)}/{self._part_size}"
        return out


def hash_into(digests: Digests, f: BinaryIO, limit: int | None = None, on_bytes: Any = None) -> int:
    """Feed ``f`` (from its current position, at most ``limit`` bytes) into ``digests``."""
    done = 0
    while limit is None or done < limit:
        want = HASH_BLOCK if limit is None else min(HASH_BLOCK, limit - done)
        block = f.read(want)
        if not block:
            break
        digests.update(block)
        done += len(block)
        if on_bytes is not None:
            on_bytes(len(block))
    return done


def check_digests(path: str, expected: dict[str, str], actual: dict[str, str]) -> str:
    """Raise ChecksumMismatch on the first expected digest that differs; return the name of the strongest
    check that passed (for the manifest), ``none`` when the source gave nothing to check against."""
    order = ("sha256", "git-sha1", "md5", "s3-multipart")
    passed = "none"
    for algo in order:
        if algo in expected:
            if actual.get(algo) != expected[algo]:
                raise ChecksumMismatch(path, algo, expected[algo], actual.get(algo, "?"))
            if passed == "none":
                passed = {"sha256": "sha256", "git-sha1": "git-sha1", "md5": "md5-etag",
                          "s3-multipart": "multipart-etag"}[algo]
    return passed


def parse_sha256sums(text: str) -> dict[str, str]:
    """`sha256sum` output (`HEX  path` or `HEX *path`) as {path: hex}; other lines are ignored."""
    sums = {}
    for line in text.splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and _SHA256_HEX.match(parts[0].lower()):
            sums[parts[1].lstrip("*").removeprefix("./")] = parts[0].lower()
    return sums
