"""pvc:// (verify in place, no copy) and `wait`, the serving pods' init container."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from kimik3_operator.stager import ChecksumMismatch, Progress, WeightsError, read_manifest, stage, wait_ready
from kimik3_operator.stager.atomic import atomic_write_json
from kimik3_operator.stager.manifest import marker_path

from .conftest import cli, cli_env

URI = "pvc://model-store/kimi-k3"


def _volume(root: Path) -> dict[str, bytes]:
    files = {"config.json": b'{"model_type": "kimi_k3"}', "model-00001-of-00001.safetensors": os.urandom(300_000),
             "tokenizer/tokenizer.json": b"{}" * 100}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def test_pvc_records_a_manifest_without_copying(tmp_path: Path) -> None:
    files = _volume(tmp_path)
    seen: list[Progress] = []
    r = stage(URI, "", tmp_path, progress=seen.append, progress_interval=0)
    m = read_manifest(tmp_path)
    assert m is not None and m.commit == r.commit and len(r.commit) == 64 and r.fetched_bytes == 0
    assert {f.path: f.sha256 for f in m.files} == {p: hashlib.sha256(d).hexdigest() for p, d in files.items()}
    assert "Verifying" in [p.phase for p in seen] and seen[-1].bytes_hashed == r.bytes

    seen.clear()
    r2 = stage(URI, "", tmp_path, progress=seen.append, progress_interval=0)
    assert r2.fast_path and r2.commit == r.commit and seen[-1].bytes_hashed == 0  # nothing read again

    (tmp_path / "config.json").write_bytes(b'{"model_type": "kimi_k3", "v": 2}')
    seen.clear()
    r3 = stage(URI, "", tmp_path, progress=seen.append, progress_interval=0)
    assert r3.commit != r.commit and seen[-1].bytes_hashed == len(b'{"model_type": "kimi_k3", "v": 2}')


def test_pvc_checks_sha256sums_and_presence(tmp_path: Path) -> None:
    files = _volume(tmp_path)
    sums = "".join(f"{hashlib.sha256(d).hexdigest()}  {p}\n" for p, d in files.items())
    (tmp_path / "SHA256SUMS").write_text(sums)
    stage(URI, "", tmp_path)
    assert {f.verified_by for f in read_manifest(tmp_path).files if f.path != "SHA256SUMS"} == {"sha256"}  # type: ignore[union-attr]

    (tmp_path / "model-00001-of-00001.safetensors").write_bytes(b"\x00" * 300_000)
    with pytest.raises(ChecksumMismatch) as exc:
        stage(URI, "", tmp_path)
    assert exc.value.path == "model-00001-of-00001.safetensors"
    assert read_manifest(tmp_path) is None  # a bad volume is never marked ready

    (tmp_path / "model-00001-of-00001.safetensors").unlink()
    with pytest.raises(WeightsError) as exc2:
        stage(URI, "", tmp_path)
    assert exc2.value.reason == "MissingFile"
    with pytest.raises(WeightsError) as exc2:
        stage(URI, "", tmp_path / "not-mounted")
    assert exc2.value.reason in ("NotFound", "NoFiles")


def test_wait_returns_once_the_marker_appears(tmp_path: Path) -> None:
    _volume(tmp_path)
    t = threading.Timer(0.3, lambda: stage(URI, "", tmp_path))
    t.start()
    try:
        r = wait_ready(tmp_path, timeout=10, interval=0.05)
    finally:
        t.join()
    assert r.manifest.commit == read_manifest(tmp_path).commit and 0.2 < r.waited_seconds < 10  # type: ignore[union-attr]


def test_wait_times_out_clearly(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(WeightsError) as exc:
        wait_ready(tmp_path, timeout=0.3, interval=0.05)
    assert exc.value.reason == "NotReady" and "no completion marker" in exc.value.message
    assert time.monotonic() - t0 < 2

    _volume(tmp_path)
    r = stage(URI, "", tmp_path)
    with pytest.raises(WeightsError) as exc:
        wait_ready(tmp_path, timeout=0, commit="0" * 64)
    assert f"marker is for commit {r.commit}, expected {'0' * 64}" in exc.value.message
    (tmp_path / "config.json").unlink()
    with pytest.raises(WeightsError) as exc:
        wait_ready(tmp_path, timeout=0, commit=r.commit)
    assert "config.json is listed in the marker but missing" in exc.value.message


def test_wait_cli(tmp_path: Path) -> None:
    out = cli("wait", "--dest", str(tmp_path), "--timeout", "0.5", "--interval", "0.1", env=cli_env())
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith(f"NotReady: timed out after 0.5s waiting for {tmp_path}")

    _volume(tmp_path)
    r = stage(URI, "", tmp_path)
    out = cli("wait", "--dest", str(tmp_path), "--timeout", "5", "--commit", r.commit, "--uri", URI, env=cli_env())
    assert out.returncode == 0, out.stderr
    assert f'"commit": "{r.commit}"' in out.stdout and '"ready": true' in out.stdout

    out = cli("show", "--dest", str(tmp_path), env=cli_env())
    assert out.returncode == 0 and f'"commit": "{r.commit}"' in out.stdout


def test_a_torn_marker_is_not_ready(tmp_path: Path) -> None:
    marker_path(tmp_path).parent.mkdir(parents=True)
    marker_path(tmp_path).write_text('{"uri": "hf://a/b", "commi')
    with pytest.raises(WeightsError):
        wait_ready(tmp_path, timeout=0)
    atomic_write_json(marker_path(tmp_path), {"uri": "hf://a/b", "commit": "c", "files": []})
    assert wait_ready(tmp_path, timeout=0).manifest.commit == "c"
