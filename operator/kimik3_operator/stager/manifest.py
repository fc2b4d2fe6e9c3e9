"""What a stage leaves in its destination: the manifest (the completion marker), the journal of an
unfinished run, and the paths of both.

Layout of a staged destination (vLLM is pointed at ``dest`` itself; it ignores the hidden folder):

    dest/<repository files...>
    dest/.kimik3/ready.json       completion marker = the manifest; written last, atomically
    dest/.kimik3/previous.json    the last complete manifest while a new stage is under way
    dest/.kimik3/journal.jsonl    files verified so far in an unfinished run (resume without re-hashing)
    dest/.kimik3/partial/         resumable partial downloads, named by the file's remote identity
    dest/.kimik3/lock             flock held by the one stager at a time

The folder and marker names are the operator's too (contract/stager.py): serving pods wait for the marker.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..contract.stager import MARKER_NAME, STATE_DIR
from .confine import ensure_dir, open_nofollow, read_own
from .errors import WeightsError

PREVIOUS_NAME = "previous.json"
JOURNAL_NAME = "journal.jsonl"
PARTIAL_DIR = "partial"
LOCK_NAME = "lock"
MANIFEST_FORMAT = 1


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


def read_manifest(dest: Path, *, name: str = MARKER_NAME) -> Manifest | None:
    """The completion marker of ``dest``, or None when absent or unreadable (a torn or foreign file is
    treated as absent: the stager rewrites it, the waiter keeps waiting)."""
    try:
        return Manifest.from_json(json.loads(read_own(state_dir(dest) / name)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


# ---------------------------------------------------------------- journal


def journal_records(dest: Path) -> Iterator[FileEntry]:
    try:
        text = read_own(state_dir(dest) / JOURNAL_NAME)
    except (OSError, ValueError):
        return
    for line in text.splitlines():
        try:
            yield FileEntry.from_json(json.loads(line))
        except (ValueError, KeyError, TypeError):
            continue  # a line torn by a kill: ignore it, the file is hashed again


def journal_append(dest: Path, entry: FileEntry) -> None:
    path = ensure_dir(dest, STATE_DIR, heal=True) / JOURNAL_NAME
    with os.fdopen(open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a", encoding="utf-8") as f:
        f.write(json.dumps(entry.as_json(), sort_keys=True, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())
