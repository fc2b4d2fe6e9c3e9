"""Attack 4: a source streams more bytes than its listing says, filling the shared cache before the
size check at the end of the file.

Replayed against the fake Hub (an LFS file from the CDN, a regular file from /resolve) and the fake S3,
each told to append bytes to what it serves while the listing (and the Hub's HEAD) keep the true size.
Now: the write that would pass the listed size fails (SizeMismatch) before a byte of it is written, so
nothing under the destination ever holds more than the listing announced.
"""

# ruff: noqa: F811  (the fixtures are imported from stager_world, and test arguments shadow them)

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from .stager_world import TOKEN, FakeHub, FakeS3, fake_s3, hub, loopback_only, replay, run_stage  # noqa: F401

pytestmark = pytest.mark.timeout(240)  # a replay is bounded; a stall fails here, not at the suite's 600 s


def _largest_file(root: Path) -> int:
    return max((os.lstat(Path(d, f)).st_size for d, _, fs in os.walk(root) for f in fs), default=0)


def test_a_source_that_sends_more_fails_at_the_listed_size(hub: FakeHub, fake_s3: FakeS3) -> None:
    @replay(40)
    @given(size=st.integers(1, 300_000), extra=st.integers(1, 4_000_000),
           where=st.sampled_from(["hub-lfs", "hub-regular", "s3"]), resumed=st.booleans())
    def one(size: int, extra: int, where: str, resumed: bool) -> None:
        data = (hashlib.sha256(f"{size} {where}".encode()).digest() * (size // 32 + 1))[:size]
        hub.repos.clear()
        with tempfile.TemporaryDirectory() as tmp:
            dest = Path(tmp, "dest")
            if where == "s3":
                fake_s3.put("k3-weights", f"m{size}/model.bin", data)
                fake_s3.oversize[f"m{size}/model.bin"] = extra
                out = run_stage(f"s3://k3-weights/m{size}", dest, revision="", env=fake_s3.env())
            else:
                name = "model.safetensors" if where == "hub-lfs" else "config.json"
                hub.add_repo("org/oversize", {name: data})
                hub.oversize[name] = extra
                if resumed:  # a partial left by an earlier run: the bound counts from where the fetch resumes
                    run_stage("hf://org/oversize", dest, token=TOKEN, env={"HF_ENDPOINT": hub.endpoint})
                out = run_stage("hf://org/oversize", dest, token=TOKEN, env={"HF_ENDPOINT": hub.endpoint})
            assert out.reason == "SizeMismatch", out
            assert "more than" in out.last.message and str(size) in out.last.message
            assert _largest_file(dest) <= size, "the cache holds more than the listing announced"

    one()
