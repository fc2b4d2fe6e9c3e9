"""The stage flow, common to every source: lock, resolve, fast path, stage the files, write the marker.

``stage()`` makes ``dest`` hold exactly the files of ``uri`` at ``revision`` and ends by writing the
completion marker ``dest/.kimik3/ready.json`` (the manifest). In order:

1. Take ``dest/.kimik3/lock`` (one stager per destination; a killed stager's lock dies with it).
2. Resolve the revision to a commit (hf: the Hub's commit sha; s3: a hash of the (key, ETag, size)
   listing; pvc: a hash of the (path, size, sha256) of the files).
3. Fast path: the marker names the same uri, commit and filters and every file still has its recorded
   size and mtime -> return without fetching or hashing anything (``verify="full"`` re-hashes instead).
4. Otherwise remove the marker first (waiters block from here on), list the files, check the listing
   (listing.py) and stage each one (files.py: skip, verify, fetch or resume).
5. Remove files the previous manifest had and the new listing has not, write the marker, drop the journal
   and the partials.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..contract.stager import STATE_DIR
from ..contract.uri import InvalidModelUri, ModelLocation, parse_model_uri
from .atomic import atomic_write_json, fsync_dir
from .confine import ensure_dir, remove_file
from .errors import WeightsError
from .files import DestinationLock, FileStager, check_space, quick_check, stage_files
from .listing import checked_listing
from .manifest import (
    JOURNAL_NAME,
    PARTIAL_DIR,
    PREVIOUS_NAME,
    FileEntry,
    Manifest,
    journal_records,
    marker_path,
    read_manifest,
    safe_relpath,
    state_dir,
)
from .progress import Progress, Tracker
from .source import Source

log = logging.getLogger(__name__)

VERIFY_MODES = ("quick", "full")


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


def parse_uri(uri: str) -> ModelLocation:
    """Where ``uri`` points (contract/uri.py: exactly the URIs admission lets through)."""
    try:
        return parse_model_uri(uri)
    except InvalidModelUri as exc:
        raise WeightsError("InvalidUri", f"{uri!r}: {exc}") from exc


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


def _utcnow() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _selected(path: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    if include and not any(fnmatch.fnmatchcase(path, p) for p in include):
        return False
    return not any(fnmatch.fnmatchcase(path, p) for p in exclude)


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
        with DestinationLock(dest_path, lock_timeout, tracker):
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
        stale = quick_check(dest, previous, src.fetches) if verify == "quick" else None
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
    listed = checked_listing(src.list_files(commit))
    seen = {rf.path for rf in listed}
    files = [rf for rf in listed if _selected(rf.path, include, exclude)]
    if not files:
        raise WeightsError("NoFiles", f"{uri} at {commit or revision} has no files to stage"
                           + (f" matching {filters}" if include or exclude else ""))

    trust: dict[str, FileEntry] = {}
    if previous is not None:
        trust.update({f.path: f for f in previous.files})
    trust.update({e.path: e for e in journal_records(dest)})

    partial_dir = ensure_dir(dest, f"{STATE_DIR}/{PARTIAL_DIR}", heal=True)
    check_space(dest, files, partial_dir, src.fetches)

    total = sum(f.size for f in files)
    tracker.plan(len(files), total)
    tracker.phase("Downloading" if src.fetches else "Verifying", "")

    entries = stage_files(FileStager(src, dest, partial_dir, tracker, trust, verify), files, workers)

    # -- files the previous manifest staged and the new listing dropped
    if previous is not None:
        keep = {e.path for e in entries}
        for old in previous.files:
            if old.path not in keep and old.path not in seen:
                try:  # a forged marker may name anything: only a safe path reached through real folders
                    remove_file(dest, safe_relpath(old.path))
                except WeightsError:
                    log.warning("not removing %r, named by the previous marker: not a path inside %s", old.path, dest)

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
