"""``pvc://claim/path``: the weights are already on a volume. Nothing is copied: the files under ``dest``
(where the Job mounts ``claim/path``) are hashed once, checked against a ``SHA256SUMS`` file there if
present, and recorded in the manifest. The "commit" is the sha256 of the sorted ``path<TAB>size<TAB>sha256``
lines, so a changed file changes it. A re-run that finds every file with its recorded size and mtime
hashes nothing.

The Job needs the claim mounted read-write (the marker lives in ``dest/.kimik3``); serving pods may mount
it read-only.

A symlinked file is followed only to a file inside ``dest`` (a snapshot folder of a Hub cache links into its
blobs, both inside): one leading elsewhere fails with UnsafePath rather than be hashed and served.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from ..contract.stager import STATE_DIR
from .confine import resolved
from .digests import SUMS_NAMES, parse_sha256sums
from .errors import WeightsError
from .manifest import FileEntry, Manifest
from .source import PartialWriter, RemoteFile

MAX_SUMS_BYTES = 64 * 1024 * 1024


class PvcSource:
    fetches = False

    def __init__(self, root: Path) -> None:
        self.root = root
        self._walk: list[tuple[str, int, int]] | None = None

    def secrets(self) -> list[str]:
        return []

    def _files(self) -> list[tuple[str, int, int]]:
        if self._walk is None:
            if not self.root.is_dir():
                raise WeightsError("NotFound", f"{self.root} is not a directory (is the claim mounted?)")
            out = []
            for dirpath, dirnames, filenames in os.walk(self.root):
                rel_dir = os.path.relpath(dirpath, self.root)
                if rel_dir == ".":
                    dirnames[:] = [d for d in dirnames if d != STATE_DIR]
                dirnames.sort()
                for name in sorted(filenames):
                    rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
                    try:
                        st = os.stat(resolved(self.root, rel))  # a symlink only to a file inside dest
                    except OSError:
                        continue
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    out.append((rel, st.st_size, st.st_mtime_ns))
            self._walk = out
        return self._walk

    def resolve(self, revision: str, previous: Manifest | None) -> str | None:
        files = self._files()
        if not files:
            raise WeightsError("NoFiles", f"{self.root} holds no files")
        if previous is not None:
            recorded = {(f.path, f.size, f.mtime_ns) for f in previous.files}
            if recorded == set(files):
                return previous.commit
        return None  # known once the files are hashed

    def _sums(self) -> dict[str, str]:
        for name in SUMS_NAMES:
            if not os.path.lexists(self.root / name):
                continue
            p = resolved(self.root, name)
            if not p.is_file():
                continue
            if p.stat().st_size > MAX_SUMS_BYTES:
                raise WeightsError("InvalidListing", f"{name} is larger than {MAX_SUMS_BYTES} bytes")
            return parse_sha256sums(p.read_text(errors="replace"))
        return {}

    def list_files(self, commit: str | None) -> list[RemoteFile]:
        sums = self._sums()
        files = self._files()
        present = {p for p, _, _ in files}
        missing = sorted(set(sums) - present)
        if missing:
            raise WeightsError("MissingFile", f"{missing[0]} is in SHA256SUMS but absent"
                               + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        return [RemoteFile(p, size, "local", {"sha256": sums[p]} if p in sums else {}) for p, size, _ in files]

    def prepare(self, rf: RemoteFile) -> RemoteFile:
        return rf

    def fetch(self, rf: RemoteFile, out: PartialWriter) -> None:
        raise WeightsError("MissingFile", f"{rf.path}: pvc:// sources are verified in place, never fetched")

    def final_commit(self, entries: Sequence[FileEntry]) -> str:
        lines = "".join(f"{e.path}\t{e.size}\t{e.sha256}\n" for e in sorted(entries, key=lambda e: e.path))
        return hashlib.sha256(lines.encode()).hexdigest()
