"""What the loader writes into the cache volume, and the small I/O helpers every source shares.

Layout of a staged destination (vLLM is pointed at ``dest`` itself; it ignores the hidden folder):

    dest/<repository files...>
    dest/.kimik3/ready.json       completion marker = the manifest; written last, atomically
    dest/.kimik3/journal.jsonl    files verified so far in an unfinished run (resume without re-hashing)
    dest/.kimik3/partial/         resumable partial downloads, named by the file's remote identity
    dest/.kimik3/lock             flock held by the one stager at a time

Everything here is plain standard library: no kopf, no Kubernetes client, no Hub or S3 client.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Iterable, Iterator

STATE_DIR = ".kimik3"
MARKER_NAME = "ready.json"
PREVIOUS_NAME = "previous.json"  # the last complete manifest while a new stage is under way
JOURNAL_NAME = "journal.jsonl"
PARTIAL_DIR = "partial"
LOCK_NAME = "lock"
MANIFEST_FORMAT = 1
HASH_BLOCK = 8 * 1024 * 1024


class WeightsError(Exception):
    """A staging or waiting failure with a stable, machine-readable reason (CamelCase, like a condition reason)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class ChecksumMismatch(WeightsError):
    def __init__(self, path: str, algorithm: str, expected: str, actual: str) -> None:
        super().__init__(
            "ChecksumMismatch",
            f"{path}: {algorithm} is {actual}, the source says {expected}; the partial download was discarded",
        )
        self.path = path
        self.algorithm = algorithm
        self.expected = expected
        self.actual = actual


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


@dataclass(frozen=True)
class FileEntry:
    """One staged file in the manifest."""

    path: str
    size: int
    sha256: str
    identity: str
    verified_by: str  # sha256 | git-sha1 | md5-etag | multipart-etag | sha256sums | none
    mtime_ns: int

    def as_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "identity": self.identity,
                "verifiedBy": self.verified_by, "mtimeNs": self.mtime_ns}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FileEntry:
        return cls(path=d["path"], size=int(d["size"]), sha256=d["sha256"], identity=d.get("identity", ""),
                   verified_by=d.get("verifiedBy", "none"), mtime_ns=int(d.get("mtimeNs", 0)))


@dataclass(frozen=True)
class Manifest:
    """The completion marker: what was staged, from where, at which commit."""

    uri: str
    revision: str
    commit: str
    files: tuple[FileEntry, ...]
    filters: dict[str, list[str]]
    completed_at: str
    format: int = MANIFEST_FORMAT

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def as_json(self) -> dict[str, Any]:
        return {"format": self.format, "uri": self.uri, "revision": self.revision, "commit": self.commit,
                "filters": self.filters, "completedAt": self.completed_at, "fileCount": len(self.files),
                "totalBytes": self.total_bytes, "files": [f.as_json() for f in self.files]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Manifest:
        return cls(uri=d["uri"], revision=d.get("revision", ""), commit=d["commit"],
                   files=tuple(FileEntry.from_json(f) for f in d.get("files", [])),
                   filters={k: list(v) for k, v in (d.get("filters") or {}).items()},
                   completed_at=d.get("completedAt", ""), format=int(d.get("format", MANIFEST_FORMAT)))


@dataclass(frozen=True)
class StageResult:
    """What one ``stage`` call did. ``skipped_bytes`` were already in place (nothing fetched for them);
    ``resumed_bytes`` came from partial files of an earlier, interrupted run; ``fetched_bytes`` crossed the
    network in this call."""

    commit: str
    files: int
    bytes: int
    skipped_bytes: int
    fetched_bytes: int = 0
    resumed_bytes: int = 0
    dest: str = ""
    uri: str = ""
    revision: str = ""
    fast_path: bool = False
    unverified_files: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {"commit": d["commit"], "files": d["files"], "bytes": d["bytes"], "skippedBytes": d["skipped_bytes"],
                "fetchedBytes": d["fetched_bytes"], "resumedBytes": d["resumed_bytes"], "dest": d["dest"],
                "uri": d["uri"], "revision": d["revision"], "fastPath": d["fast_path"],
                "unverifiedFiles": list(d["unverified_files"])}


# ---------------------------------------------------------------- paths


def state_dir(dest: Path) -> Path:
    return dest / STATE_DIR


def marker_path(dest: Path) -> Path:
    return state_dir(dest) / MARKER_NAME


_BAD_PART = re.compile(r"^\.\.?$")


def safe_relpath(path: str) -> str:
    """A listed path, checked: relative, no ``..``, not inside our state folder. Anything else is refused
    (a malicious or broken listing must never write outside ``dest``)."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or "\\" in path or "\x00" in path:
        raise WeightsError("UnsafePath", f"refusing to stage {path!r}: not a relative path")
    parts = p.parts
    if any(_BAD_PART.match(part) for part in parts):
        raise WeightsError("UnsafePath", f"refusing to stage {path!r}: '.' or '..' component")
    if parts[0] == STATE_DIR:
        raise WeightsError("UnsafePath", f"refusing to stage {path!r}: {STATE_DIR}/ is the loader's own state")
    return str(p)


# ---------------------------------------------------------------- atomic I/O


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write via a temporary file in the same folder and rename: a reader sees the old or the new content,
    never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_json(path: Path, obj: Any, *, durable: bool = True) -> None:
    atomic_write_bytes(path, (json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n").encode(),
                       durable=durable)


def read_manifest(dest: Path, *, name: str = MARKER_NAME) -> Manifest | None:
    """The completion marker of ``dest``, or None when absent or unreadable (a torn or foreign file is
    treated as absent: the stager rewrites it, the waiter keeps waiting)."""
    try:
        return Manifest.from_json(json.loads((state_dir(dest) / name).read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


# ---------------------------------------------------------------- journal


def journal_records(dest: Path) -> Iterator[FileEntry]:
    try:
        text = (state_dir(dest) / JOURNAL_NAME).read_text()
    except OSError:
        return
    for line in text.splitlines():
        try:
            yield FileEntry.from_json(json.loads(line))
        except (ValueError, KeyError, TypeError):
            continue  # a line torn by a kill: ignore it, the file is hashed again


def journal_append(dest: Path, entry: FileEntry) -> None:
    path = state_dir(dest) / JOURNAL_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry.as_json(), sort_keys=True, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------- hashing


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
