"""What a serving pod's init container runs: wait until ``dest`` holds a complete, matching stage."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .confine import local_stat
from .errors import WeightsError
from .manifest import Manifest, marker_path, read_manifest


@dataclass(frozen=True)
class WaitResult:
    manifest: Manifest
    waited_seconds: float


def check_ready(dest: Path, *, commit: str | None = None, uri: str | None = None,
                check_files: bool = True) -> tuple[Manifest | None, str]:
    """(manifest, "") when ``dest`` is ready, else (manifest-or-None, why not)."""
    m = read_manifest(dest)
    if m is None:
        return None, f"no completion marker at {marker_path(dest)}"
    if uri is not None and m.uri != uri:
        return m, f"marker is for {m.uri}, expected {uri}"
    if commit is not None and m.commit != commit:
        return m, f"marker is for commit {m.commit}, expected {commit}"
    if check_files:
        fetched = not m.uri.startswith("pvc://")  # pvc:// files may be symlinks inside dest; staged ones never
        for f in m.files:
            st = local_stat(dest, f.path, fetched)
            if st is None:
                return m, f"{f.path} is listed in the marker but missing"
            if st.st_size != f.size:
                return m, f"{f.path} has {st.st_size} bytes, the marker says {f.size}"
    return m, ""


def wait_ready(dest: str | os.PathLike[str], *, timeout: float, interval: float = 5.0, commit: str | None = None,
               uri: str | None = None, check_files: bool = True,
               on_wait: Callable[[str], None] | None = None,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> WaitResult:
    """Poll until the marker exists and matches, at most ``timeout`` seconds (0: check once).

    Raises WeightsError("NotReady") naming what was missing when the time is up."""
    dest_path = Path(dest)
    t0 = clock()
    deadline = t0 + max(0.0, timeout)
    last = ""
    while True:
        m, why = check_ready(dest_path, commit=commit, uri=uri, check_files=check_files)
        if not why and m is not None:
            return WaitResult(m, clock() - t0)
        if why != last and on_wait is not None:
            on_wait(why)
        last = why
        now = clock()
        if now >= deadline:
            raise WeightsError("NotReady", f"timed out after {timeout:g}s waiting for {dest_path}: {why}")
        sleep(min(max(interval, 0.01), deadline - now))
