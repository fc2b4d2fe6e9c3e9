"""What a source (hf.py, s3.py, pvc.py) offers the stager, and the partial file it writes into.

A source lists files (RemoteFile) and writes the bytes of one file into a PartialWriter from the
offset the partial file already holds; the stager decides what to skip, resume, verify and keep.
Sources import this module and nothing of the stage flow, which picks the source (flow.py).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

from .digests import Digests, hash_into
from .errors import WeightsError
from .manifest import FileEntry, Manifest
from .progress import Tracker


@dataclass(frozen=True)
class RemoteFile:
    """One file as the source lists it.

    ``identity`` names the exact remote content (LFS sha256, git blob id, S3 ETag): it keys partial downloads
    and lets a re-run trust a file verified before without hashing it again. ``expected`` maps algorithm ->
    hex digest the downloaded bytes must match: ``sha256``, ``git-sha1`` (git blob id), ``md5`` (single-part
    S3 ETag) or ``s3-multipart`` (``<md5-of-md5s>-<parts>/<part size>``).
    """

    path: str
    size: int
    identity: str
    expected: dict[str, str] = field(default_factory=dict)


class Source(Protocol):
    """What a source (hf, s3, pvc) provides to the stager."""

    fetches: bool  # False: the files are already in place (pvc), only verified

    def resolve(self, revision: str, previous: Manifest | None) -> str | None:
        """The commit ``revision`` names now, or None when only known after hashing (pvc)."""

    def list_files(self, commit: str | None) -> list[RemoteFile]: ...

    def prepare(self, rf: RemoteFile) -> RemoteFile:
        """Last-moment details before hashing or fetching one file (e.g. an S3 part size)."""

    def fetch(self, rf: RemoteFile, out: PartialWriter) -> None:
        """Write the bytes of ``rf`` from ``out.offset`` on into ``out``."""

    def final_commit(self, entries: Sequence[FileEntry]) -> str: ...

    def secrets(self) -> list[str]: ...


class PartialWriter:
    """The resumable partial file of one download. Hashes what is written; a source that must start over
    (a server ignoring Range) seeks to 0 and truncates, which resets the digests.

    A write that would take the file past ``limit`` (the size the source listed) fails before a byte of it
    is written: a source streaming more than it announced never fills the shared cache."""

    def __init__(self, f: BinaryIO, digests_factory: Callable[[], Digests], tracker: Tracker, offset: int,
                 cancel: threading.Event | None = None, *, limit: int | None = None, path: str = "") -> None:
        self._f = f
        self._cancel = cancel
        self.limit = limit
        self.path = path
        self._factory = digests_factory
        self._tracker = tracker
        self.digests = digests_factory()
        self._f.seek(0)
        hash_into(self.digests, self._f, limit=offset)
        self._f.seek(offset)
        self.offset = offset
        self.resumed = offset
        self.fetched = 0

    # file-like surface used by sources (and huggingface_hub's http_get)
    def write(self, data: bytes) -> int:
        if self._cancel is not None and self._cancel.is_set():
            raise WeightsError("Cancelled", "another file failed")
        if self.limit is not None and self.offset + len(data) > self.limit:
            raise WeightsError("SizeMismatch", f"{self.path}: the source sends more than the {self.limit} bytes "
                                               "it listed; stopped before writing past them")
        n = self._f.write(data)
        self.digests.update(data)
        self.offset += len(data)
        self.fetched += len(data)
        self._tracker.fetched(len(data))
        return n if n is not None else len(data)

    def tell(self) -> int:
        return self.offset

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        target = {os.SEEK_SET: pos, os.SEEK_CUR: self.offset + pos, os.SEEK_END: self.offset + pos}[whence]
        if target != self.offset:
            self.truncate(target)
        return self.offset

    def truncate(self, size: int | None = None) -> int:
        size = self.offset if size is None else size
        if size >= self.offset:
            return self.offset
        self._f.flush()
        self._f.truncate(size)
        lost_resumed = max(0, self.resumed - size)
        self._tracker.rewind(self.offset - size, resumed=lost_resumed)
        self.resumed -= lost_resumed
        self.digests = self._factory()
        self._f.seek(0)
        hash_into(self.digests, self._f, limit=size)
        self._f.seek(size)
        self.offset = size
        return size

    def restart(self) -> None:
        self.truncate(0)

    def flush(self) -> None:
        self._f.flush()
