"""What the stager's attack replays share: the fake Hub and fake S3 of tests/stager on loopback (their
fixtures and loopback guard re-exported: a test module imports them by name), hypothesis settings that
keep a replay bounded, and ways to look at an outcome (the final progress record, a folder's state).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings

from kimik3_operator.stager import Progress, StageResult, WeightsError, stage
from tests.stager.conftest import cli, cli_env, fake_s3, hub, loopback_only
from tests.stager.fake_hub import FakeHub
from tests.stager.fake_s3 import ACCESS_KEY, SECRET_KEY, FakeS3

__all__ = ["ACCESS_KEY", "SECRET_KEY", "FakeHub", "FakeS3", "Outcome", "cli", "cli_env", "fake_s3", "hub",
           "loopback_only", "replay", "run_stage", "tree_state"]

TOKEN = "hf_SECURITYreplayTOKEN0123456789abcdef"


def replay(max_examples: int) -> Callable[[Any], Any]:
    """Hypothesis settings for a replay against the loopback fakes: reproducible, no example database,
    no per-example deadline (a stage takes tenths of a second), the servers shared by every example."""
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None, print_blob=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@dataclass(frozen=True)
class Outcome:
    """How a stage ended: its result or its error, and the last progress record (what the Job's
    termination message and annotation carry, hence the operator's WeightsFailed message)."""

    result: StageResult | None
    error: WeightsError | None
    last: Progress

    @property
    def reason(self) -> str:
        return self.error.reason if self.error is not None else ""


def run_stage(uri: str, dest: Path, *, revision: str = "main", **kw: Any) -> Outcome:
    """``stage`` in this process; any exception but a WeightsError fails the test (an internal error)."""
    records: list[Progress] = []
    try:
        result = stage(uri, revision, dest, progress=records.append, progress_interval=0, **kw)
    except WeightsError as exc:
        assert records[-1].phase == "Failed" and records[-1].reason == exc.reason, records[-1]
        return Outcome(None, exc, records[-1])
    return Outcome(result, None, records[-1])


def tree_state(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``root`` (symlinks not followed): its kind, content hash or link target, mode
    and mtime. Two equal states mean nothing under ``root`` was touched."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = os.lstat(p)
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", st.st_mode)
            else:
                out[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest(), st.st_mode, st.st_mtime_ns)
    return out
