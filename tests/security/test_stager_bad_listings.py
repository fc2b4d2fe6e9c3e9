"""Attack 10: bad sizes and names in a listing end in an internal error or a stall.

Replayed against the fake Hub and the fake S3: negative sizes, sizes that are no whole number (text,
fractions, booleans, null), a file and a folder with one name, a name over 255 bytes, a path whose
partial-download name would pass 255 bytes (valid: it must stage), a multipart ETag whose parts cannot
make the object (a one-byte first part of a large object, more parts than S3 allows). Now: each ends in
its own reason and a message naming the path, in the stager's final record (what the operator shows as
WeightsFailed), quickly; never InternalError, never a traceback.
"""

# ruff: noqa: F811  (the fixtures are imported from stager_world, and test arguments shadow them)

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from .stager_world import (  # noqa: F401
    TOKEN,
    FakeHub,
    FakeS3,
    cli,
    cli_env,
    fake_s3,
    hub,
    loopback_only,
    replay,
    run_stage,
)

pytestmark = pytest.mark.timeout(240)  # a replay is bounded; a stall fails here, not at the suite's 600 s

MODEL = b"\x07" * 50_000
BAD_SIZES = st.one_of(st.integers(-(10**12), -1), st.sampled_from(["abc", "12kb", "", "1e3", "0x10", "-0"]),
                      st.floats(0.5, 1e6).filter(lambda f: not f.is_integer()), st.booleans(), st.none())
NAMES = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_.\u00e9\u4e2d", min_size=1, max_size=12).filter(
    lambda n: n.strip(".") != "")


@st.composite
def hub_cases(draw: Any) -> tuple[str, dict[str, bytes], dict[str, Any], set[str]]:
    """(what, files, listed sizes, the reasons that may answer): one anomaly per listing."""
    what = draw(st.sampled_from(["size", "clash", "long-name", "long-path"]))
    files: dict[str, bytes] = {"config.json": b"{}", "model.safetensors": MODEL}
    sizes: dict[str, Any] = {}
    if what == "size":
        sizes[draw(st.sampled_from(sorted(files)))] = draw(BAD_SIZES)
        return what, files, sizes, {"InvalidListing"}
    if what == "clash":
        folder = draw(NAMES)
        files[folder] = b"a file"
        files[f"{folder}/{draw(NAMES)}"] = b"and a folder"
        return what, files, sizes, {"InvalidListing"}
    if what == "long-name":
        name = draw(NAMES) * 300
        files[f"sub/{name[:draw(st.integers(256, 400))]}.json"] = b"{}"
        return what, files, sizes, {"InvalidListing"}
    depth = draw(st.integers(3, 8))  # each name fits, the flattened partial name does not: it must stage
    files["/".join(draw(NAMES) + "d" * 70 for _ in range(depth)) + "/x.json"] = b"{}"
    return what, files, sizes, set()


def test_hub_listings(hub: FakeHub) -> None:
    @replay(60)
    @given(case=hub_cases())
    def one(case: tuple[str, dict[str, bytes], dict[str, Any], set[str]]) -> None:
        what, files, sizes, reasons = case
        hub.repos.clear()
        hub.listed_size = sizes
        hub.add_repo("org/bad", files)
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            out = run_stage("hf://org/bad", Path(tmp, "d"), token=TOKEN, env={"HF_ENDPOINT": hub.endpoint})
            if not reasons:
                assert out.error is None, out
                assert all(Path(tmp, "d", p).read_bytes() == data for p, data in files.items())
        hub.listed_size = {}
        assert time.monotonic() - t0 < 20, "a stall"
        if reasons:
            assert out.reason in reasons and out.last.message, (what, out)

    one()


@st.composite
def s3_cases(draw: Any) -> tuple[str, dict[str, tuple[bytes, int]], dict[str, str], dict[str, int], set[str]]:
    """(what, objects {key: (data, part size)}, listed sizes, part-1 sizes, the reasons that may answer)."""
    what = draw(st.sampled_from(["size", "clash", "tiny-part", "too-many-parts"]))
    objects = {"config.json": (b"{}", 0), "model.safetensors": (MODEL, 0)}
    if what == "size":
        bad = draw(st.one_of(st.integers(-(10**12), -1).map(str), st.sampled_from(["abc", "", "1.5", "1e3", "+7"])))
        return what, objects, {draw(st.sampled_from(sorted(objects))): bad}, {}, {"InvalidListing"}
    if what == "clash":
        objects["weights"] = (b"a file", 0)
        objects["weights/model.bin"] = (b"and a folder", 0)
        return what, objects, {}, {}, {"InvalidListing"}
    if what == "tiny-part":  # a 2-part ETag whose "first part" is a few bytes of a 50 kB object
        objects["model.safetensors"] = (MODEL, 30_000)
        return what, objects, {}, {"model.safetensors": draw(st.integers(1, 100))}, {"InvalidSource"}
    data = b"\x09" * draw(st.integers(10_001, 20_000))  # one-byte parts: more parts than S3 allows
    objects["model.safetensors"] = (data, 1)
    return what, objects, {}, {}, {"InvalidSource"}


def test_s3_listings(fake_s3: FakeS3) -> None:
    @replay(40)
    @given(case=s3_cases())
    def one(case: tuple[str, dict[str, tuple[bytes, int]], dict[str, str], dict[str, int], set[str]]) -> None:
        what, objects, sizes, part1, reasons = case
        fake_s3.buckets.clear()
        fake_s3.buckets["k3-weights"] = {}
        for key, (data, part_size) in objects.items():
            fake_s3.put("k3-weights", f"m/{key}", data, part_size=part_size)
        fake_s3.listed_size = {f"m/{k}": v for k, v in sizes.items()}
        fake_s3.part1_size = {f"m/{k}": v for k, v in part1.items()}
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            out = run_stage("s3://k3-weights/m", Path(tmp, "d"), revision="", env=fake_s3.env())
        assert time.monotonic() - t0 < 20, "a stall"
        assert out.reason in reasons and out.last.message, (what, out)

    one()


def test_the_job_reports_the_reason(hub: FakeHub, tmp_path: Path) -> None:
    """The Job's own output for one of them: the termination record names the reason, stderr ends with
    ``Reason: message`` and holds no traceback."""
    hub.add_repo("org/bad", {"config.json": b"{}", "model.safetensors": MODEL})
    hub.listed_size = {"model.safetensors": -4096}
    progress = tmp_path / "termination-log"
    out = cli("stage", "--uri", "hf://org/bad", "--dest", str(tmp_path / "d"), "--progress-file", str(progress),
              env=cli_env(HF_ENDPOINT=hub.endpoint))
    assert out.returncode == 1
    record = json.loads(progress.read_text())
    assert record["phase"] == "Failed" and record["reason"] == "InvalidListing"
    assert "negative size -4096" in record["message"] and "model.safetensors" in record["message"]
    assert out.stderr.strip().splitlines()[-1] == f"InvalidListing: {record['message']}"
    assert "Traceback" not in out.stderr
