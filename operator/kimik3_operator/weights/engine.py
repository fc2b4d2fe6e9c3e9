"""The staging engine, common to every source: fast path, skip, resume, verify, marker.

``stage()`` makes ``dest`` hold exactly the files of ``uri`` at ``revision`` and ends by writing the
completion marker ``dest/.kimik3/ready.json`` (the manifest). In order:

1. Take ``dest/.kimik3/lock`` (one stager per destination; a killed stager's lock dies with it).
2. Resolve the revision to a commit (hf: the Hub's commit sha; s3: a hash of the (key, ETag, size)
   listing; pvc: a hash of the (path, size, sha256) of the files).
3. Fast path: the marker names the same uri, commit and filters and every file still has its recorded
   size and mtime -> return without fetching or hashing anything (``verify="full"`` re-hashes instead).
4. Otherwise remove the marker first (waiters block from here on), list the files, and per file:
   trusted (recorded with the same remote identity, size and mtime) -> skip; same size -> hash and
   compare, keep on match; else fetch into ``.kimik3/partial/`` resuming from the partial's length,
   hashing while writing, verify, fsync, rename into place, journal it.
5. Remove files the previous manifest had and the new listing has not, write the marker, drop the journal
   and the partials.

A checksum mismatch on fresh bytes fails with ChecksumMismatch naming the file (after one retry from zero
when the bad bytes may have come from a resumed partial).
"""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import logging
import os
import shutil
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Mapping, Protocol, Sequence

from .model import (
    JOURNAL_NAME,
    LOCK_NAME,
    PARTIAL_DIR,
    PREVIOUS_NAME,
    ChecksumMismatch,
    Digests,
    FileEntry,
    Manifest,
    RemoteFile,
    StageResult,
    WeightsError,
    atomic_write_json,
    check_digests,
    fsync_dir,
    hash_into,
    journal_append,
    journal_records,
    marker_path,
    read_manifest,
    safe_relpath,
    state_dir,
)
from .progress import Progress, Tracker
from .uri import parse_uri

log = logging.getLogger("kimik3_operator.weights")

VERIFY_MODES = ("quick", "full")


class Source(Protocol):
    """What a source (hf, s3, pvc) provides to the engine."""

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
    (a server ignoring Range) seeks to 0 and truncates, which resets the digests."""

    def __init__(self, f: BinaryIO, digests_factory: Callable[[], Digests], tracker: Tracker, offset: int,
                 cancel: threading.Event | None = None) -> None:
        self._f = f
        self._cancel = cancel
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


# ---------------------------------------------------------------- helpers


def _utcnow() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _selected(path: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    if include and not any(fnmatch.fnmatchcase(path, p) for p in include):
        return False
    return not any(fnmatch.fnmatchcase(path, p) for p in exclude)


def _partial_name(rf: RemoteFile) -> str:
    flat = rf.path.replace("%", "%25").replace("/", "%2F")
    ident = "".join(c for c in rf.identity if c.isalnum())[:16] or "x"
    return f"{flat}.{ident}.part"


class _DestLock:
    def __init__(self, dest: Path, timeout: float, tracker: Tracker) -> None:
        self.path = state_dir(dest) / LOCK_NAME
        self.timeout = timeout
        self.tracker = tracker
        self.fd: int | None = None

    def __enter__(self) -> _DestLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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


def quick_check(dest: Path, manifest: Manifest) -> list[str]:
    """Files of ``manifest`` that are missing or whose size or mtime changed (empty: all in place)."""
    bad = []
    for f in manifest.files:
        try:
            st = os.stat(dest / f.path)
        except OSError:
            bad.append(f.path)
            continue
        if st.st_size != f.size or st.st_mtime_ns != f.mtime_ns:
            bad.append(f.path)
    return bad


def make_source(uri: str, *, token: str | None, env: Mapping[str, str], dest: Path) -> Source:
    u = parse_uri(uri)
    if u.scheme == "hf":
        from .hf import HfSource

        return HfSource(u.authority, token=token, endpoint=env.get("HF_ENDPOINT") or None)
    if u.scheme == "s3":
        from .s3 import S3Source

        return S3Source(u.authority, u.path, env=env)
    from .pvc import PvcSource

    return PvcSource(dest)


# ---------------------------------------------------------------- the engine


def stage(
    source_uri: str,
    revision: str,
    dest: str | os.PathLike[str],
    token: str | None = None,
    progress: Callable[[Progress], None] | None = None,
    *,
    verify: str = "quick",
    workers: int = 4,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    progress_interval: float = 1.0,
    lock_timeout: float = 24 * 3600.0,
    source: Source | None = None,
) -> StageResult:
    """Stage ``source_uri`` at ``revision`` into ``dest``; see the module docstring.

    ``token`` is the Hub token (hf://); S3 credentials come from ``env`` (default ``os.environ``) the way
    the AWS SDKs read them. ``progress`` receives a Progress snapshot at most every ``progress_interval``
    seconds and on every phase change. Raises WeightsError (with ``.reason``) on failure; partial downloads
    and the journal are kept so the next call resumes.
    """
    if verify not in VERIFY_MODES:
        raise WeightsError("InvalidArgument", f"verify must be one of {VERIFY_MODES}, not {verify!r}")
    env = os.environ if env is None else env
    dest_path = Path(dest)
    tracker = Tracker(progress, interval=progress_interval)
    tracker.update(uri=source_uri, revision=revision)
    filters = {"include": sorted(include), "exclude": sorted(exclude)}
    try:
        dest_path.mkdir(parents=True, exist_ok=True)
        src = source or make_source(source_uri, token=token, env=env, dest=dest_path)
        with _DestLock(dest_path, lock_timeout, tracker):
            result = _stage_locked(src, source_uri, revision, dest_path, tracker, verify=verify,
                                   workers=max(1, workers), include=include, exclude=exclude, filters=filters)
    except WeightsError as exc:
        tracker.phase("Failed", exc.message, reason=exc.reason)
        raise
    except Exception as exc:  # an unexpected failure still ends the progress stream with a reason
        tracker.phase("Failed", f"{type(exc).__name__}: {exc}", reason="InternalError")
        raise
    except BaseException:  # SIGTERM (the CLI turns it into SystemExit) or Ctrl-C: partials are kept
        tracker.phase("Failed", "interrupted; the next run resumes", reason="Interrupted")
        raise
    tracker.phase("Complete", "", commit=result.commit, fast_path=result.fast_path,
                  unverified_files=result.unverified_files)
    return result


def _stage_locked(src: Source, uri: str, revision: str, dest: Path, tracker: Tracker, *, verify: str, workers: int,
                  include: Sequence[str], exclude: Sequence[str], filters: dict[str, list[str]]) -> StageResult:
    previous = read_manifest(dest)
    tracker.phase("Resolving", f"resolving {revision or '(default)'}")
    commit = src.resolve(revision, previous)
    if commit:
        tracker.update(commit=commit)

    # -- fast path: same source, commit and filters, every file where the marker left it
    if (previous is not None and commit is not None and previous.uri == uri and previous.commit == commit
            and previous.filters == filters):
        stale = quick_check(dest, previous) if verify == "quick" else None
        if stale == []:
            total = previous.total_bytes
            tracker.update(files_total=len(previous.files), files_done=len(previous.files), bytes_total=total,
                           bytes_done=total, bytes_skipped=total, fast_path=True)
            unverified = tuple(f.path for f in previous.files if f.verified_by == "none")
            return StageResult(commit=commit, files=len(previous.files), bytes=total, skipped_bytes=total,
                               dest=str(dest), uri=uri, revision=revision, fast_path=True,
                               unverified_files=unverified)
        if stale:
            log.warning("marker matches but %d file(s) changed on disk (e.g. %s): re-checking", len(stale), stale[0])

    # -- slow path: invalidate the marker before touching anything (waiters block from here on). It is kept
    # as previous.json: what a run killed from here on still needs to trust files and drop stale ones.
    mp = marker_path(dest)
    prev_path = state_dir(dest) / PREVIOUS_NAME
    if mp.exists():
        os.replace(mp, prev_path)
        fsync_dir(mp.parent)
    elif previous is None:
        previous = read_manifest(dest, name=PREVIOUS_NAME)

    tracker.phase("Listing", "listing files")
    listed = src.list_files(commit)
    files: list[RemoteFile] = []
    seen: set[str] = set()
    for rf in listed:
        rel = safe_relpath(rf.path)
        if rel in seen:
            raise WeightsError("InvalidListing", f"{rel} is listed twice")
        seen.add(rel)
        if _selected(rel, include, exclude):
            files.append(rf if rel == rf.path else RemoteFile(rel, rf.size, rf.identity, dict(rf.expected)))
    if not files:
        raise WeightsError("NoFiles", f"{uri} at {commit or revision} has no files to stage"
                           + (f" matching {filters}" if include or exclude else ""))

    trust: dict[str, FileEntry] = {}
    if previous is not None:
        trust.update({f.path: f for f in previous.files})
    trust.update({e.path: e for e in journal_records(dest)})

    partial_dir = state_dir(dest) / PARTIAL_DIR
    _check_space(dest, files, partial_dir, src.fetches)

    total = sum(f.size for f in files)
    tracker.plan(len(files), total)
    tracker.phase("Downloading" if src.fetches else "Verifying", "")

    engine = _FileStager(src, dest, partial_dir, tracker, trust, verify)
    entries = _run_all(engine, files, workers)

    # -- files the previous manifest staged and the new listing dropped
    if previous is not None:
        keep = {e.path for e in entries}
        for old in previous.files:
            if old.path not in keep and old.path not in seen:
                try:
                    (dest / safe_relpath(old.path)).unlink()
                except (OSError, WeightsError):
                    pass

    final = commit or src.final_commit(entries)
    tracker.update(commit=final)
    manifest = Manifest(uri=uri, revision=revision, commit=final, files=tuple(sorted(entries, key=lambda e: e.path)),
                        filters=filters, completed_at=_utcnow())
    atomic_write_json(mp, manifest.as_json())
    (state_dir(dest) / JOURNAL_NAME).unlink(missing_ok=True)
    prev_path.unlink(missing_ok=True)
    shutil.rmtree(partial_dir, ignore_errors=True)

    snap = tracker.snapshot()
    return StageResult(commit=final, files=len(entries), bytes=total, skipped_bytes=snap.bytes_skipped,
                       fetched_bytes=snap.bytes_fetched, resumed_bytes=snap.bytes_resumed, dest=str(dest), uri=uri,
                       revision=revision, fast_path=False,
                       unverified_files=tuple(e.path for e in manifest.files if e.verified_by == "none"))


def _check_space(dest: Path, files: Iterable[RemoteFile], partial_dir: Path, fetches: bool) -> None:
    if not fetches:
        return
    need = 0
    for rf in files:
        try:
            if os.stat(dest / rf.path).st_size == rf.size:
                continue
        except OSError:
            pass
        try:
            have = os.stat(partial_dir / _partial_name(rf)).st_size
        except OSError:
            have = 0
        need += max(0, rf.size - have)
    free = shutil.disk_usage(dest).free
    if need > free:
        raise WeightsError("InsufficientSpace",
                           f"{need} bytes still to fetch but {free} bytes free under {dest}; enlarge spec.model.cache")


def _run_all(engine: _FileStager, files: list[RemoteFile], workers: int) -> list[FileEntry]:
    # biggest first: the long poles start early and small files fill the gaps
    order = sorted(files, key=lambda f: -f.size)
    if workers == 1:
        return [engine.stage_file(rf) for rf in order]
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kimik3-weights")
    interrupted = False
    try:
        futures: list[Future[FileEntry]] = [pool.submit(engine.stage_file, rf) for rf in order]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = [f for f in futures if f in done and not f.cancelled() and f.exception() is not None]
        real = [f for f in failed if getattr(f.exception(), "reason", "") != "Cancelled"]
        if failed:
            raise (real or failed)[0].exception()  # type: ignore[misc]
        return [f.result() for f in futures]
    except BaseException as exc:
        engine.cancel.set()  # running downloads stop at their next chunk; their partials stay for resume
        interrupted = not isinstance(exc, Exception)  # SIGTERM/Ctrl-C: do not wait for a stalled transfer
        raise
    finally:
        pool.shutdown(wait=not interrupted, cancel_futures=True)


class _FileStager:
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

    def stage_file(self, rf: RemoteFile) -> FileEntry:
        if self.cancel.is_set():
            raise WeightsError("Cancelled", "another file failed")
        target = self.dest / rf.path
        try:
            st: os.stat_result | None = os.stat(target)
        except OSError:
            st = None
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
            digests = Digests(size=rf.size, algorithms=expected, part_size=_part_size(rf))
            with open(target, "rb") as f:
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
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        part = self.partial_dir / _partial_name(rf)
        self.tracker.start_file(rf.path)
        try:
            for attempt in (1, 2):
                try:
                    offset = part.stat().st_size
                except OSError:
                    offset = 0
                if offset > rf.size:
                    part.unlink()
                    offset = 0
                with open(part, "r+b" if offset else "w+b") as f:
                    writer = PartialWriter(f, lambda: Digests(size=rf.size, algorithms=rf.expected,
                                                              part_size=_part_size(rf)), self.tracker, offset,
                                           self.cancel)
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
                    os.fsync(f.fileno())
                break
            target.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(part, 0o644)
            os.replace(part, target)
            fsync_dir(target.parent)
        finally:
            self.tracker.end_file(rf.path)
        return self._record(FileEntry(rf.path, rf.size, actual["sha256"], rf.identity, verified_by,
                                      os.stat(target).st_mtime_ns))


def _part_size(rf: RemoteFile) -> int:
    v = rf.expected.get("s3-multipart")
    if not v:
        return 0
    return int(v.rsplit("/", 1)[1])
