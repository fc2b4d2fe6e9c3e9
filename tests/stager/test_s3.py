"""s3:// staging against the fake S3 on loopback (fake_s3.py), which checks every request's signature."""

from __future__ import annotations

import hashlib
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from kimik3_operator.contract.stager import STATE_DIR
from kimik3_operator.stager import ChecksumMismatch, WeightsError, read_manifest, stage
from kimik3_operator.stager.files import FileStager, partial_name
from kimik3_operator.stager.manifest import PARTIAL_DIR
from kimik3_operator.stager.source import RemoteFile

from .conftest import cli_env, cli_popen
from .fake_hub import Slow
from .fake_s3 import ACCESS_KEY, SECRET_KEY, FakeS3, multipart_etag

BUCKET = "k3-weights"
PREFIX = "models/kimi-k3"
URI = f"s3://{BUCKET}/{PREFIX}"
MiB = 1024 * 1024


def _blob(n: int, tag: str) -> bytes:
    seed = hashlib.sha256(tag.encode()).digest()
    return (seed * (n // len(seed) + 1))[:n]


FILES = {
    "config.json": b'{"model_type": "kimi_k3"}',
    "model-00001-of-00002.safetensors": _blob(3 * MiB + 17, "s1"),
    "sub dir/model-00002-of-00002.safetensors": _blob(2 * MiB, "s2"),  # a key that needs URI encoding
}


class Backend:
    """The fake S3 on loopback, as the tests see it."""

    def __init__(self, s3: FakeS3) -> None:
        self.s3 = s3
        self.endpoint = s3.endpoint
        s3.buckets.setdefault(BUCKET, {})

    def put(self, key: str, data: bytes, *, part_size: int = 0) -> None:
        self.s3.put(BUCKET, key, data, part_size=part_size)

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL_S3": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1"}


@pytest.fixture
def backend(fake_s3: FakeS3) -> Backend:
    return Backend(fake_s3)


def _put_all(b: Backend, files: dict[str, bytes], **kw: Any) -> None:
    for rel, data in files.items():
        b.put(f"{PREFIX}/{rel}", data, **kw)


def _stage(b: Backend, dest: Path, revision: str = "", **kw: Any):
    return stage(URI, revision, dest, env=b.env(), progress_interval=0, **kw)


def test_stage_and_rerun(backend: Backend, tmp_path: Path) -> None:
    _put_all(backend, FILES)
    backend.put("models/kimi-k3-old/config.json", b"{}")  # a sibling prefix is not part of this model
    r = _stage(backend, tmp_path)
    assert len(r.commit) == 64 and r.files == 3 and r.fetched_bytes == r.bytes == sum(map(len, FILES.values()))
    for rel, data in FILES.items():
        assert (tmp_path / rel).read_bytes() == data
    m = read_manifest(tmp_path)
    assert m is not None and {f.verified_by for f in m.files} == {"md5-etag"}
    mtimes = {f.path: (tmp_path / f.path).stat().st_mtime_ns for f in m.files}

    backend.s3.reset_log()
    r2 = _stage(backend, tmp_path)
    assert r2.fast_path and r2.commit == r.commit and r2.fetched_bytes == 0 and r2.skipped_bytes == r.bytes
    assert {p: (tmp_path / p).stat().st_mtime_ns for p in mtimes} == mtimes
    assert backend.s3.gets() == [] and all("list-type=2" in x.path for x in backend.s3.log)

    # a pinned commit must match the listing; a changed object changes the commit
    assert _stage(backend, tmp_path, revision=r.commit).fast_path
    backend.put(f"{PREFIX}/config.json", b'{"model_type": "kimi_k3", "v": 2}')
    with pytest.raises(WeightsError) as exc:
        _stage(backend, tmp_path, revision=r.commit)
    assert exc.value.reason == "RevisionMismatch"
    r3 = _stage(backend, tmp_path)
    assert r3.commit != r.commit and r3.fetched_bytes == len(b'{"model_type": "kimi_k3", "v": 2}')


def test_multipart_etags_are_verified(backend: Backend, tmp_path: Path) -> None:
    data = _blob(11 * MiB + 5, "mp")
    backend.put(f"{PREFIX}/model.safetensors", data, part_size=5 * MiB)
    r = _stage(backend, tmp_path)
    assert (tmp_path / "model.safetensors").read_bytes() == data
    entry = {f.path: f for f in read_manifest(tmp_path).files}["model.safetensors"]  # type: ignore[union-attr]
    assert entry.identity == multipart_etag(data, 5 * MiB) and entry.verified_by == "multipart-etag"
    assert r.unverified_files == ()


def test_resume_from_a_partial_file(backend: Backend, tmp_path: Path) -> None:
    _put_all(backend, FILES)
    key = "model-00001-of-00002.safetensors"
    data = FILES[key]
    etag = hashlib.md5(data).hexdigest()
    part = tmp_path / STATE_DIR / PARTIAL_DIR / partial_name(RemoteFile(key, len(data), etag))
    part.parent.mkdir(parents=True)
    part.write_bytes(data[:MiB + 3])  # what a killed run left
    backend.s3.reset_log()
    r = _stage(backend, tmp_path)
    assert r.resumed_bytes == MiB + 3 and r.fetched_bytes == r.bytes - (MiB + 3)
    assert (tmp_path / key).read_bytes() == data
    ranged = [x for x in backend.s3.gets() if x.range]
    assert [(x.range, x.sent) for x in ranged] == [(f"bytes={MiB + 3}-", len(data) - MiB - 3)]


def test_resume_after_a_kill(fake_s3: FakeS3, tmp_path: Path) -> None:
    key = "model.safetensors"
    data = _blob(8 * MiB, "kill")
    fake_s3.put(BUCKET, f"{PREFIX}/{key}", data)
    fake_s3.slow[f"{PREFIX}/{key}"] = Slow(fast_bytes=3 * MiB, chunk=16 * 1024, delay=0.05, max_seconds=20)
    dest = tmp_path / "cache"
    proc = cli_popen("stage", "--uri", URI, "--dest", str(dest), "--progress-interval", "0",
                     env=cli_env(**fake_s3.env()))
    partials = dest / STATE_DIR / PARTIAL_DIR
    deadline = time.monotonic() + 20
    try:
        while not (partials.is_dir() and sum(p.stat().st_size for p in partials.glob("*.part")) >= 2 * MiB):
            assert time.monotonic() < deadline, "no partial download appeared"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
    have = sum(p.stat().st_size for p in partials.glob("*.part"))
    assert 0 < have < len(data) and read_manifest(dest) is None

    fake_s3.slow.clear()
    fake_s3.reset_log()
    r = _stage(Backend(fake_s3), dest)
    assert r.resumed_bytes == have and r.fetched_bytes == len(data) - have
    assert [x.range for x in fake_s3.gets()] == [f"bytes={have}-"]
    assert (dest / key).read_bytes() == data


def test_corrupt_bytes_fail_clearly_and_sha256sums_are_used(fake_s3: FakeS3, tmp_path: Path) -> None:
    b = Backend(fake_s3)
    _put_all(b, FILES)
    fake_s3.corrupt.add(f"{PREFIX}/config.json")
    with pytest.raises(ChecksumMismatch) as exc:
        _stage(b, tmp_path / "a")
    assert exc.value.path == "config.json" and exc.value.algorithm == "md5"

    # a SHA256SUMS at the prefix root is the strongest check, and it catches what the ETag cannot
    fake_s3.corrupt.clear()
    sums = "".join(f"{hashlib.sha256(d).hexdigest()}  {p}\n" for p, d in FILES.items())
    b.put(f"{PREFIX}/SHA256SUMS", sums.encode())
    r = _stage(b, tmp_path / "b")
    by = {f.path: f.verified_by for f in read_manifest(tmp_path / "b").files}  # type: ignore[union-attr]
    assert by["config.json"] == "sha256" and by["SHA256SUMS"] == "md5-etag" and r.files == 4
    bad = sums.replace(hashlib.sha256(FILES["config.json"]).hexdigest(), "0" * 64)
    b.put(f"{PREFIX}/SHA256SUMS", bad.encode())
    with pytest.raises(ChecksumMismatch) as exc:
        _stage(b, tmp_path / "c")
    assert exc.value.path == "config.json" and exc.value.algorithm == "sha256"


def test_objects_without_a_usable_checksum_are_staged_and_named(fake_s3: FakeS3, tmp_path: Path) -> None:
    fake_s3.buckets[BUCKET] = {}
    fake_s3.put(BUCKET, f"{PREFIX}/kms.safetensors", _blob(100_000, "kms"), sse="aws:kms")
    fake_s3.put(BUCKET, f"{PREFIX}/checksummed.safetensors", _blob(100_000, "ck"), sse="aws:kms", checksum=True)
    r = _stage(Backend(fake_s3), tmp_path)
    by = {f.path: f.verified_by for f in read_manifest(tmp_path).files}  # type: ignore[union-attr]
    assert by == {"kms.safetensors": "none", "checksummed.safetensors": "sha256"}
    assert r.unverified_files == ("kms.safetensors",)


def test_listing_pagination_and_a_changed_object_mid_run(fake_s3: FakeS3, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fake_s3.page_size = 2
    many = {f"part-{i:03d}.bin": _blob(1000 + i, str(i)) for i in range(7)}
    b = Backend(fake_s3)
    _put_all(b, many)
    r = _stage(b, tmp_path / "a")
    assert r.files == 7 and sum(1 for x in fake_s3.log if "list-type=2" in x.path) == 4

    # the object changes between the listing and the GET: If-Match fails, the run says so
    real = FileStager.stage_file

    def change_first(self: Any, rf: RemoteFile) -> Any:
        b.put(f"{PREFIX}/{rf.path}", b"changed")
        return real(self, rf)

    monkeypatch.setattr(FileStager, "stage_file", change_first)
    with pytest.raises(WeightsError) as exc:
        _stage(b, tmp_path / "b", workers=1)
    assert exc.value.reason == "SourceChanged"


def test_bad_credentials_fail_with_a_reason(fake_s3: FakeS3, tmp_path: Path) -> None:
    b = Backend(fake_s3)
    _put_all(b, FILES)
    env = {**b.env(), "AWS_SECRET_ACCESS_KEY": "wrong-secret-wrong-secret"}
    with pytest.raises(WeightsError) as exc:
        stage(URI, "", tmp_path, env=env)
    assert exc.value.reason == "Unauthorized" and "SignatureDoesNotMatch" in exc.value.message
    assert "wrong-secret" not in str(exc.value)


@pytest.mark.parametrize("kind", ["container", "web-identity"])
def test_pod_credentials(kind: str, fake_s3: FakeS3, tmp_path: Path) -> None:
    """EKS Pod Identity (container credentials) and IRSA (web identity), both served on loopback."""
    b = Backend(fake_s3)
    _put_all(b, {"config.json": b"{}"})
    base = {"AWS_ENDPOINT_URL_S3": fake_s3.endpoint, "AWS_REGION": "us-east-1"}
    token = tmp_path / "token"
    token.write_text("eyJhbGciOi.loopback.jwt")
    if kind == "container":
        env = {**base, "AWS_CONTAINER_CREDENTIALS_FULL_URI": f"{fake_s3.endpoint}/creds",
               "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(token)}
    else:
        env = {**base, "AWS_ROLE_ARN": "arn:aws:iam::000000000000:role/k3", "AWS_WEB_IDENTITY_TOKEN_FILE": str(token),
               "AWS_ENDPOINT_URL_STS": f"{fake_s3.endpoint}/sts"}
    r = stage(URI, "", tmp_path / "d", env=env)
    assert r.files == 1 and (tmp_path / "d/config.json").read_bytes() == b"{}"
    signed = [x for x in fake_s3.log if x.path.startswith(f"/{BUCKET}")]
    assert signed and all(x.signed and x.status in (200, 206) for x in signed)


def test_cli_progress_file_for_s3(fake_s3: FakeS3, tmp_path: Path) -> None:
    from .conftest import cli

    b = Backend(fake_s3)
    _put_all(b, FILES)
    pf = tmp_path / "progress.json"
    out = cli("stage", "--uri", URI, "--dest", str(tmp_path / "d"), "--progress-file", str(pf),
              env=cli_env(**b.env()))
    assert out.returncode == 0, out.stderr
    last = json.loads(pf.read_text())
    assert last["phase"] == "Complete" and last["percent"] == 100.0 and len(last["commit"]) == 64
    assert SECRET_KEY not in out.stdout + out.stderr
