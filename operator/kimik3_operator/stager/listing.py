"""What a source's listing must be before the stager acts on it: each failure a clear InvalidListing,
never an exception from deep inside a write (or a write that should never have started).

A listing comes from a server (the Hub, an S3 endpoint) or from a walk of a volume: sizes are whole,
non-negative numbers; every path is safe (manifest.safe_relpath), each of its names fits a file system
name (255 bytes) and the whole path fits a path (4096 bytes); no path is listed twice, and no path is
both a file and a folder of other files.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from .errors import WeightsError
from .manifest import safe_relpath
from .source import RemoteFile

NAME_MAX = 255
PATH_MAX = 4096
_DIGITS = re.compile(r"^[0-9]{1,20}$")


def parse_size(value: Any, path: str) -> int:
    """A listed size as an int: a non-negative whole number (an int, or a string of digits)."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and _DIGITS.match(value.strip()):
        size = int(value.strip())
    else:
        raise WeightsError("InvalidListing", f"{str(path)[:200]!r}: the size {str(value)[:40]!r} is not a whole number")
    if size < 0:
        raise WeightsError("InvalidListing", f"{str(path)[:200]!r}: negative size {size}")
    return size


def checked_listing(listed: Iterable[RemoteFile]) -> list[RemoteFile]:
    """``listed`` with safe, normalised paths; InvalidListing (or UnsafePath) on the first problem."""
    out: list[RemoteFile] = []
    seen: set[str] = set()
    for rf in listed:
        if not isinstance(rf.path, str):
            raise WeightsError("InvalidListing", f"a listed path is not text: {str(rf.path)[:80]!r}")
        rel = safe_relpath(rf.path)
        size = parse_size(rf.size, rel)
        if len(rel.encode()) > PATH_MAX:
            raise WeightsError("InvalidListing", f"{rel[:200]!r}...: the path is longer than {PATH_MAX} bytes")
        long_name = next((n for n in rel.split("/") if len(n.encode()) > NAME_MAX), None)
        if long_name is not None:
            raise WeightsError("InvalidListing", f"{rel[:200]!r}: the name {long_name[:60]!r}... is longer than "
                                                 f"{NAME_MAX} bytes")
        if rel in seen:
            raise WeightsError("InvalidListing", f"{rel} is listed twice")
        seen.add(rel)
        out.append(rf if (rel, size) == (rf.path, rf.size) else RemoteFile(rel, size, rf.identity, dict(rf.expected)))
    folders = {p.rsplit("/", 1)[0] for p in seen if "/" in p}
    folders |= {f.rsplit("/", i)[0] for f in list(folders) for i in range(1, f.count("/") + 1)}
    clash = sorted(seen & folders)
    if clash:
        raise WeightsError("InvalidListing", f"{clash[0]} is listed both as a file and as a folder of other files")
    return out
