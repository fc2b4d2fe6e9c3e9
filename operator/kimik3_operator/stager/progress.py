"""Progress of one staging run: a thread-safe tracker, and the JSON sinks the CLI writes.

A progress record is one flat JSON object (camelCase, like Kubernetes status) and always stays under
4 KiB, so it fits a container termination message (``terminationMessagePath``) as well as a status field:

    {"phase": "Downloading", "uri": "hf://moonshotai/Kimi-K3", "revision": "main", "commit": "4f1c...",
     "filesTotal": 120, "filesDone": 37, "bytesTotal": 1560000000000, "bytesDone": 481000000000,
     "bytesSkipped": 0, "bytesResumed": 4000000000, "bytesFetched": 477000000000, "bytesHashed": 0,
     "bytesPerSecond": 812000000, "etaSeconds": 1328, "percent": 30.8,
     "currentFiles": ["model-00038-of-00120.safetensors"],
     "message": "", "time": "2026-05-01T10:00:00Z"}

Phases (contract.stager.PHASES): Resolving -> Listing -> Downloading (or Verifying for pvc://) -> Complete,
or Failed. A run that finds the marker already matching goes Resolving -> Complete with ``fastPath: true``.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from ..contract.stager import MAX_RECORD_BYTES
from .atomic import atomic_write_bytes


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Progress:
    """A snapshot handed to the ``progress`` callback."""

    phase: str = "Pending"
    uri: str = ""
    revision: str = ""
    commit: str = ""
    files_total: int = 0
    files_done: int = 0
    bytes_total: int = 0
    bytes_done: int = 0  # in place: skipped + resumed + fetched
    bytes_skipped: int = 0
    bytes_resumed: int = 0
    bytes_fetched: int = 0
    bytes_hashed: int = 0  # read back from disk to verify files already present
    bytes_per_second: int = 0
    eta_seconds: int | None = None
    current_files: tuple[str, ...] = ()
    message: str = ""
    reason: str = ""
    fast_path: bool = False
    unverified_files: tuple[str, ...] = ()
    time: str = field(default_factory=_now)

    @property
    def percent(self) -> float:
        return round(100.0 * self.bytes_done / self.bytes_total, 1) if self.bytes_total else (
            100.0 if self.phase == "Complete" else 0.0)

    def as_json(self, redact: Callable[[str], str] = lambda s: s) -> dict[str, Any]:
        """The record, every text masked by ``redact`` before it is cut to its bound (a secret cut first
        would no longer be found, and its beginning would be printed)."""
        r = redact
        d: dict[str, Any] = {
            "phase": self.phase, "uri": r(self.uri)[:512], "revision": r(self.revision)[:256], "commit": self.commit,
            "filesTotal": self.files_total, "filesDone": self.files_done, "bytesTotal": self.bytes_total,
            "bytesDone": self.bytes_done, "bytesSkipped": self.bytes_skipped, "bytesResumed": self.bytes_resumed,
            "bytesFetched": self.bytes_fetched, "bytesHashed": self.bytes_hashed,
            "bytesPerSecond": self.bytes_per_second, "etaSeconds": self.eta_seconds, "percent": self.percent,
            "currentFiles": [r(f)[-120:] for f in self.current_files[:4]], "message": r(self.message)[:1024],
            "fastPath": self.fast_path, "time": self.time,
        }
        if self.reason:
            d["reason"] = self.reason
        if self.unverified_files:
            d["unverifiedFiles"] = [r(f)[-120:] for f in self.unverified_files[:10]]
            d["unverifiedCount"] = len(self.unverified_files)
        return d


class Tracker:
    """Accumulates counters from worker threads and calls ``callback`` at most every ``interval`` seconds
    (always on a phase change and at the end)."""

    def __init__(self, callback: Callable[[Progress], None] | None, *, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._callback = callback
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._emit_lock = threading.Lock()
        self._p = Progress()
        self._current: dict[str, None] = {}
        self._last_emit = float("-inf")
        self._t0 = clock()
        self._rate_window: list[tuple[float, int]] = []

    # -- updates
    def update(self, *, force: bool = True, **changes: Any) -> None:
        with self._lock:
            self._p = replace(self._p, **changes)
        self._maybe_emit(force=force)

    def phase(self, phase: str, message: str = "", **changes: Any) -> None:
        self.update(phase=phase, message=message, **changes)

    def plan(self, files_total: int, bytes_total: int) -> None:
        self.update(files_total=files_total, bytes_total=bytes_total)

    def skipped(self, size: int) -> None:
        with self._lock:
            self._p = replace(self._p, files_done=self._p.files_done + 1, bytes_skipped=self._p.bytes_skipped + size,
                              bytes_done=self._p.bytes_done + size)
        self._maybe_emit()

    def resumed(self, n: int) -> None:
        with self._lock:
            self._p = replace(self._p, bytes_resumed=self._p.bytes_resumed + n, bytes_done=self._p.bytes_done + n)
        self._maybe_emit()

    def fetched(self, n: int) -> None:
        with self._lock:
            self._p = replace(self._p, bytes_fetched=self._p.bytes_fetched + n, bytes_done=self._p.bytes_done + n)
            self._rate_window.append((self._clock(), self._p.bytes_fetched))
        self._maybe_emit()

    def rewind(self, n: int, *, resumed: int = 0) -> None:
        """Bytes counted as in place are gone again (a server ignored Range, or a bad file is re-fetched)."""
        with self._lock:
            self._p = replace(self._p, bytes_done=max(0, self._p.bytes_done - n),
                              bytes_resumed=max(0, self._p.bytes_resumed - resumed))

    def hashed(self, n: int) -> None:
        with self._lock:
            self._p = replace(self._p, bytes_hashed=self._p.bytes_hashed + n)
        self._maybe_emit()

    def start_file(self, path: str) -> None:
        with self._lock:
            self._current[path] = None
            self._p = replace(self._p, current_files=tuple(self._current))

    def end_file(self, path: str, *, done: bool = True) -> None:
        with self._lock:
            self._current.pop(path, None)
            self._p = replace(self._p, current_files=tuple(self._current),
                              files_done=self._p.files_done + (1 if done else 0))
        self._maybe_emit()

    def snapshot(self) -> Progress:
        with self._lock:
            return self._with_rate(self._p)

    # -- emission
    def _with_rate(self, p: Progress) -> Progress:
        now = self._clock()
        window = [(t, b) for t, b in self._rate_window if now - t <= 30.0]
        self._rate_window = window[-256:]
        rate = 0
        if len(window) >= 2 and window[-1][0] > window[0][0]:
            rate = int((window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0]))
        elif p.bytes_fetched and now > self._t0:
            rate = int(p.bytes_fetched / (now - self._t0))
        eta = int((p.bytes_total - p.bytes_done) / rate) if rate > 0 and p.bytes_total >= p.bytes_done else None
        if p.phase in ("Complete", "Failed"):
            eta = 0 if p.phase == "Complete" else None
        return replace(p, bytes_per_second=rate, eta_seconds=eta, time=_now())

    def _maybe_emit(self, *, force: bool = False) -> None:
        if self._callback is None:
            return
        now = self._clock()
        with self._lock:
            if not force and now - self._last_emit < self._interval:
                return
            self._last_emit = now
            snap = self._with_rate(self._p)
        with self._emit_lock:
            self._callback(snap)


def _masked(value: Any, redact: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _masked(v, redact) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, redact) for v in value]
    return value


def record_bytes(record: dict[str, Any]) -> bytes:
    data = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    if len(data) > MAX_RECORD_BYTES:  # never expected; keep the contract anyway
        record = {**record, "currentFiles": [], "message": record.get("message", "")[:200]}
        data = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    return data


def write_progress_file(path: Path, record: dict[str, Any]) -> None:
    """Replace ``path`` atomically with one JSON record. A bind-mounted file (``/dev/termination-log``)
    cannot be renamed over: there we truncate and write in place."""
    data = record_bytes(record) + b"\n"
    try:
        atomic_write_bytes(path, data, durable=False)
    except OSError:
        with open(path, "wb") as f:
            f.write(data)


class JsonSink:
    """The CLI's progress callback: one JSON line per record on ``stream``, and the latest record in
    ``progress_file`` (atomically replaced) when given."""

    def __init__(self, stream: TextIO | None = None, progress_file: Path | None = None,
                 redact: Callable[[str], str] = lambda s: s,
                 forward: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.progress_file = progress_file
        self.redact = redact
        self.forward = forward
        """Also handed every (redacted) record, e.g. the progress ConfigMap reporter."""
        self._warned = False

    def emit(self, record: dict[str, Any]) -> None:
        record = _masked(record, self.redact)  # before record_bytes may cut a field
        data = record_bytes(record).decode()
        record = json.loads(data)
        self.stream.write(data + "\n")
        self.stream.flush()
        if self.forward is not None:
            self.forward(record)
        if self.progress_file is not None:
            try:
                write_progress_file(self.progress_file, record)
            except OSError as exc:  # never fail a long download over a status file
                if not self._warned:
                    logging.getLogger(__name__).warning(
                        "cannot write the progress file %s: %s", self.progress_file, exc.strerror)
                    self._warned = True

    def __call__(self, p: Progress) -> None:
        self.emit(p.as_json(self.redact))
