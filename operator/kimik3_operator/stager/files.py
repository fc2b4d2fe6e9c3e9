"""Staging the listed files into a destination: per file skip, verify, fetch or resume, in parallel;
the lock that keeps one stager per destination, and the space check before any byte is fetched.

Per file: trusted (recorded with the same remote identity, size and mtime) -> skip; same size -> hash
and compare, keep on match; else fetch into ``.kimik3/partial/`` resuming from the partial's length,
hashing while writing, verify, fsync, rename into place, journal it. A checksum mismatch on fresh bytes
fails with ChecksumMismatch naming the file (after one retry from zero when the bad bytes may have come
from a resumed partial).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from ..contract.stager import STATE_DIR
from .atomic import fsync_dir
from .confine import clear_for_file, ensure_dir, local_stat, open_nofollow, plain_stat, resolved, target_path
from .digests import Digests, check_digests, hash_into
from .errors import ChecksumMismatch, WeightsError
from .listing import NAME_MAX
from .manifest import LOCK_NAME, FileEntry, Manifest, journal_append, state_dir
from .progress import Tracker
from .source import PartialWriter, RemoteFile, Source

log = logging.getLogger(__name__)


class DestinationLock:
    """``dest/.kimik3/lock``, held for the whole run: one stager per destination. An flock dies with its
    process, so a killed stager never leaves the destination locked."""

    def __init__(self, dest: Path, timeout: float, tracker: Tracker) -> None:
        self.dest = dest
        self.path = state_dir(dest) / LOCK_NAME
        self.timeout = timeout
        self.tracker = tracker
        self.fd: int | None = None

    def __enter__(self) -> DestinationLock:
        self.path = ensure_dir(self.dest, STATE_DIR, heal=True) / LOCK_NAME  # a symlinked state folder is replaced
        self.fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT)
        deadline = time.monotonic() + self.timeout
        announced = False
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as exc:
                if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    log.warning("%s: this filesystem has no file locks; run one stager per destination", self.path)
                    return self
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if time.monotonic() >= deadline:
                os.close(self.fd)
                raise WeightsError("Locked", f"another stager holds {self.path} (waited {self.timeout:.0f}s)")
            if not announced:
                self.tracker.phase("Pending", "waiting for another stager of this destination")
                announced = True
            time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None


def quick_check(dest: Path, manifest: Manifest, fetches: bool = True) -> list[str]:
    """Files of ``manifest`` that are missing or whose size or mtime changed (empty: all in place)."""
    bad = []
    for f in manifest.files:
        st = local_stat(dest, f.path, fetches)
        if st is None or st.st_size != f.size or st.st_mtime_ns != f.mtime_ns:
            bad.append(f.path)
    return bad


def check_space(dest: Path, files: Iterable[RemoteFile], partial_dir: Path, fetches: bool) -> None:
    """Fail before fetching anything when the bytes still missing (minus what partials hold) do not fit:
    better than failing hours into a 1.6 TB download."""
    if not fetches:
        return
    need = 0
    for rf in files:
        st = plain_stat(dest, rf.path)
        if st is not None and st.st_size == rf.size:
            continue
        try:
            have = os.lstat(partial_dir / partial_name(rf)).st_size
        except OSError:
            have = 0
        need += max(0, rf.size - have)
    free = shutil.disk_usage(dest).free
    if need > free:
        raise WeightsError("InsufficientSpace",
                           f"{need} bytes still to fetch but {free} bytes free under {dest}; enlarge spec.model.cache")


def partial_name(rf: RemoteFile) -> str:
    """The partial download of ``rf`` in ``.kimik3/partial/``: keyed by its remote identity, so bytes of
    another version of the file are never resumed. A name that would pass the file system's 255 bytes
    (a deep path flattened) is a hash of the path instead."""
    flat = rf.path.replace("%", "%25").replace("/", "%2F")
    ident = "".join(c for c in rf.identity if c.isalnum())[:16] or "x"
    name = f"{flat}.{ident}.part"
    if len(name.encode()) > NAME_MAX:
        name = f"{hashlib.sha256(rf.path.encode()).hexdigest()}.{ident}.part"
    return name


def part_size(rf: RemoteFile) -> int:
    """The part size a multipart S3 ETag was computed with (0: not a multipart check)."""
    v = rf.expected.get("s3-multipart")
    if not v:
        return 0
    return int(v.rsplit("/", 1)[1])  # s3.py wrote it, a whole number


class FileStager:
    """Stages one listed file at a time (from any number of threads), trusting what ``trust`` recorded."""

    def __init__(self, src: Source, dest: Path, partial_dir: Path, tracker: Tracker, trust: dict[str, FileEntry],
                 verify: str) -> None:
        self.src = src
        self.dest = dest
        self.partial_dir = partial_dir
        self.tracker = tracker
        self.trust = trust
        self.verify = verify
        self.cancel = threading.Event()
        self._journal_lock = threading.Lock()

    def _record(self, entry: FileEntry) -> FileEntry:
        with self._journal_lock:
            journal_append(self.dest, entry)
        return entry

    def _local(self, rel: str) -> Path:
        """Where ``rel`` is: for a fetching source a path of real folders (made so); for pvc:// the file
        itself, symlinks inside ``dest`` followed."""
        return target_path(self.dest, rel) if self.src.fetches else resolved(self.dest, rel)

    def stage_file(self, rf: RemoteFile) -> FileEntry:
        if self.cancel.is_set():
            raise WeightsError("Cancelled", "another file failed")
        target = self._local(rf.path)
        st = local_stat(self.dest, rf.path, self.src.fetches)
        rec = self.trust.get(rf.path)
        same_remote = rec is not None and rec.identity == rf.identity and rec.size == rf.size

        if st is not None and st.st_size == rf.size:
            if self.verify == "quick" and same_remote and rec is not None and rec.mtime_ns == st.st_mtime_ns:
                self.tracker.skipped(rf.size)
                return rec
            rf = self.src.prepare(rf)
            expected = dict(rf.expected)
            if same_remote and rec is not None and "sha256" not in expected:
                expected["sha256"] = rec.sha256  # what we verified when we fetched it
            self.tracker.start_file(rf.path)
            digests = Digests(size=rf.size, algorithms=expected, part_size=part_size(rf))
            with os.fdopen(os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as f:
                hash_into(digests, f, on_bytes=self.tracker.hashed)
            try:
                verified_by = check_digests(rf.path, expected, digests.result())
            except ChecksumMismatch as exc:
                self.tracker.end_file(rf.path, done=False)
                if not self.src.fetches:
                    raise
                log.warning("%s: local copy does not match the source (%s %s != %s): fetching it again",
                            rf.path, exc.algorithm, exc.actual, exc.expected)
            else:
                self.tracker.end_file(rf.path, done=False)
                self.tracker.skipped(rf.size)
                if not rf.expected:  # nothing from the source: keep what the fetch could verify back then
                    verified_by = rec.verified_by if same_remote and rec is not None else "none"
                return self._record(FileEntry(rf.path, rf.size, digests.result()["sha256"], rf.identity,
                                              verified_by, os.stat(target).st_mtime_ns))
        elif not self.src.fetches:
            if st is None:
                raise WeightsError("MissingFile", f"{rf.path} is listed but absent")
            raise WeightsError("SizeMismatch", f"{rf.path} has {st.st_size} bytes, expected {rf.size}")
        else:
            rf = self.src.prepare(rf)
        return self._download(rf, target)

    def _download(self, rf: RemoteFile, target: Path) -> FileEntry:
        part = self.partial_dir / partial_name(rf)
        self.tracker.start_file(rf.path)
        try:
            for attempt in (1, 2):
                fd = open_nofollow(part, os.O_RDWR | os.O_CREAT)
                offset = os.fstat(fd).st_size
                if offset > rf.size:
                    os.ftruncate(fd, 0)
                    offset = 0
                with os.fdopen(fd, "r+b") as f:
                    writer = PartialWriter(f, lambda: Digests(size=rf.size, algorithms=rf.expected,
                                                              part_size=part_size(rf)), self.tracker, offset,
                                           self.cancel, limit=rf.size, path=rf.path)
                    if offset:
                        self.tracker.resumed(offset)
                    if writer.offset < rf.size or rf.size == 0:
                        self.src.fetch(rf, writer)
                    f.flush()
                    if writer.offset != rf.size:
                        raise WeightsError("SizeMismatch", f"{rf.path}: got {writer.offset} bytes, expected {rf.size}")
                    actual = writer.digests.result()
                    try:
                        verified_by = check_digests(rf.path, rf.expected, actual)
                    except ChecksumMismatch:
                        f.close()
                        part.unlink(missing_ok=True)
                        if attempt == 1 and writer.resumed:
                            log.warning("%s: checksum mismatch after resuming at byte %d: fetching it whole",
                                        rf.path, writer.resumed)
                            self.tracker.rewind(writer.offset, resumed=writer.resumed)
                            continue
                        raise
                    os.fchmod(f.fileno(), 0o644)
                    os.fsync(f.fileno())
                break
            clear_for_file(target)
            os.replace(part, target)
            fsync_dir(target.parent)
        finally:
            self.tracker.end_file(rf.path)
        return self._record(FileEntry(rf.path, rf.size, actual["sha256"], rf.identity, verified_by,
                                      os.lstat(target).st_mtime_ns))


def stage_files(stager: FileStager, files: list[RemoteFile], workers: int) -> list[FileEntry]:
    """Every file, ``workers`` at a time, biggest first (the long poles start early and small files fill
    the gaps). The first failure cancels the rest; their partials stay for the next run."""
    order = sorted(files, key=lambda f: -f.size)
    if workers == 1:
        return [stager.stage_file(rf) for rf in order]
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kimik3-weights")
    interrupted = False
    try:
        futures: list[Future[FileEntry]] = [pool.submit(stager.stage_file, rf) for rf in order]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = [f for f in futures if f in done and not f.cancelled() and f.exception() is not None]
        real = [f for f in failed if getattr(f.exception(), "reason", "") != "Cancelled"]
        if failed:
            raise (real or failed)[0].exception()  # type: ignore[misc]
        return [f.result() for f in futures]
    except BaseException as exc:
        stager.cancel.set()  # running downloads stop at their next chunk
        interrupted = not isinstance(exc, Exception)  # SIGTERM/Ctrl-C: do not wait for a stalled transfer
        raise
    finally:
        pool.shutdown(wait=not interrupted, cancel_futures=True)
