"""hf:// staging against the fake Hub on loopback: resolve, verify, skip, resume after a kill, corruption,
tokens."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kimik3_operator.contract.stager import STATE_DIR
from kimik3_operator.stager import ChecksumMismatch, Progress, WeightsError, read_manifest, stage
from kimik3_operator.stager.manifest import PARTIAL_DIR

from .conftest import cli, cli_env, cli_popen
from .fake_hub import FakeHub, Slow

REPO = "moonshotai/Kimi-K3"
URI = f"hf://{REPO}"
TOKEN = "hf_LOOPBACKtestTOKEN0123456789abcdef"


def _files(seed: int = 0) -> dict[str, bytes]:
    rnd = hashlib.sha256(str(seed).encode()).digest()
    blob = lambda n, tag: (rnd + tag.encode()) * (n // (len(rnd) + len(tag)) + 1)  # noqa: E731
    return {
        "config.json": json.dumps({"model_type": "kimi_k3", "seed": seed}).encode(),
        "tokenizer.json": blob(40_000, "tok")[:40_000],
        "model-00001-of-00003.safetensors": blob(1_500_000, "s1")[:1_500_000],
        "model-00002-of-00003.safetensors": blob(1_200_000, "s2")[:1_200_000],
        "weights/model-00003-of-00003.safetensors": blob(900_000, "s3")[:900_000],
        "model.safetensors.index.json": b'{"weight_map": {}}',
    }


def _stage(hub: FakeHub, dest: Path, revision: str = "main", **kw: object):
    return stage(URI, revision, dest, token=kw.pop("token", TOKEN), env={"HF_ENDPOINT": hub.endpoint},
                 progress_interval=0, **kw)  # type: ignore[arg-type]


def _tree_equal(dest: Path, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        assert (dest / path).read_bytes() == data, path


def _wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def test_stage_resolves_main_to_the_commit_and_verifies_every_file(hub: FakeHub, tmp_path: Path) -> None:
    files = _files()
    commit = hub.add_repo(REPO, files, token=TOKEN)
    hub.page_size = 2  # the tree listing takes several pages
    seen: list[Progress] = []
    r = stage(URI, "main", tmp_path, token=TOKEN, env={"HF_ENDPOINT": hub.endpoint}, progress=seen.append,
              progress_interval=0)

    assert r.commit == commit and len(commit) == 40
    assert (r.files, r.bytes, r.skipped_bytes, r.fetched_bytes) == (6, sum(map(len, files.values())), 0, r.bytes)
    _tree_equal(tmp_path, files)
    m = read_manifest(tmp_path)
    assert m is not None and m.commit == commit and m.uri == URI and m.revision == "main"
    by = {f.path: f for f in m.files}
    assert by["model-00001-of-00003.safetensors"].verified_by == "sha256"  # LFS: the Hub's lfs.sha256
    assert by["config.json"].verified_by == "git-sha1"  # regular file: its git blob id
    assert all(f.sha256 == hashlib.sha256(files[f.path]).hexdigest() for f in m.files)
    assert len(hub.requests(path_contains="/tree/")) == 4  # 6 files + 1 folder, 2 per page
    # the token goes to the Hub, never to the CDN the LFS files redirect to
    assert all(x.authorized for x in hub.requests(host="hub") if "/api/agent" not in x.path)
    cdn = hub.requests(host="cdn")
    assert len(cdn) == 3 and not any(x.authorized for x in cdn)
    phases = [p.phase for p in seen]
    assert phases[:2] == ["Pending", "Resolving"] and phases[-1] == "Complete"
    assert {"Listing", "Downloading"} <= set(phases)
    assert seen[-1].bytes_done == seen[-1].bytes_total == r.bytes and seen[-1].commit == commit


def test_a_second_run_downloads_nothing(hub: FakeHub, tmp_path: Path) -> None:
    files = _files()
    commit = hub.add_repo(REPO, files, token=TOKEN)
    _stage(hub, tmp_path)
    hub.reset_log()

    r = _stage(hub, tmp_path)
    assert r.fast_path and r.commit == commit and r.skipped_bytes == r.bytes and r.fetched_bytes == 0
    assert [x.path for x in hub.requests()] == [f"/api/models/{REPO}/revision/main"]  # resolving main, nothing else

    hub.reset_log()
    r = _stage(hub, tmp_path, revision=commit)  # pinned to the commit: not even that
    assert r.fast_path and hub.requests() == []


def test_a_new_commit_fetches_only_what_changed(hub: FakeHub, tmp_path: Path) -> None:
    old = _files()
    hub.add_repo(REPO, old, token=TOKEN)
    _stage(hub, tmp_path)
    new = dict(old)
    new["config.json"] = b'{"model_type": "kimi_k3", "v": 2}'
    new["model-00002-of-00003.safetensors"] = b"\x01" * 1_100_000
    del new["weights/model-00003-of-00003.safetensors"]
    commit2 = hub.add_repo(REPO, new, token=TOKEN)
    hub.reset_log()

    r = _stage(hub, tmp_path)
    assert r.commit == commit2 and not r.fast_path
    fetched = sorted(x.path for x in hub.file_downloads())
    assert len(fetched) == 2 and any("config.json" in p for p in fetched)  # config + the changed shard only
    assert r.fetched_bytes == len(new["config.json"]) + 1_100_000
    _tree_equal(tmp_path, new)
    assert not (tmp_path / "weights/model-00003-of-00003.safetensors").exists()  # dropped by the new commit
    assert read_manifest(tmp_path).commit == commit2  # type: ignore[union-attr]


def test_resume_after_a_kill_fetches_only_the_remainder(hub: FakeHub, tmp_path: Path) -> None:
    big = "model-00001-of-00001.safetensors"
    data = os.urandom(24 * 1024 * 1024)  # > 2 x huggingface_hub's 10 MiB write chunk
    files = {"config.json": b"{}", big: data}
    commit = hub.add_repo(REPO, files, token=TOKEN)
    hub.slow[big] = Slow(fast_bytes=12 * 1024 * 1024, chunk=32 * 1024, delay=0.05, max_seconds=20)
    progress_file = tmp_path / "progress.json"
    dest = tmp_path / "cache"
    env = cli_env(HF_ENDPOINT=hub.endpoint, HF_TOKEN=TOKEN)
    proc = cli_popen("stage", "--uri", URI, "--revision", "main", "--dest", str(dest), "--workers", "1",
                     "--progress-file", str(progress_file), "--progress-interval", "0", env=env)
    partials = dest / STATE_DIR / PARTIAL_DIR

    def partial_size() -> int:
        return sum(p.stat().st_size for p in partials.glob("*.part")) if partials.is_dir() else 0

    try:
        _wait_for(lambda: partial_size() >= 10 * 1024 * 1024, 20, "the first 10 MiB on disk")
    finally:
        proc.send_signal(signal.SIGKILL)  # no cleanup at all, like an OOM kill or a lost node
        proc.communicate(timeout=10)
    have = partial_size()
    assert 0 < have < len(data)
    assert read_manifest(dest) is None and not (dest / big).exists()
    assert json.loads(progress_file.read_text())["phase"] == "Downloading"

    hub.slow.clear()
    hub.reset_log()
    r = _stage(hub, dest)
    assert r.commit == commit and r.resumed_bytes == have and r.fetched_bytes == len(data) - have + 2
    cdn = hub.requests(host="cdn", method="GET")
    assert [(x.range, x.sent) for x in cdn] == [(f"bytes={have}-", len(data) - have)]
    assert (dest / big).read_bytes() == data
    assert not partials.exists()


def test_a_server_that_ignores_range_still_yields_the_right_file(hub: FakeHub, tmp_path: Path) -> None:
    files = _files()
    hub.add_repo(REPO, files, token=TOKEN)
    shard = "model-00001-of-00003.safetensors"
    sha = hashlib.sha256(files[shard]).hexdigest()
    part = tmp_path / STATE_DIR / PARTIAL_DIR / f"{shard}.{sha[:16]}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(files[shard][:500_000])
    hub.ignore_range = True
    r = _stage(hub, tmp_path)
    assert (tmp_path / shard).read_bytes() == files[shard]
    assert r.resumed_bytes == 0  # the resumed prefix was discarded with the 200 answer


def test_a_corrupted_local_file_is_detected_and_fetched_again(hub: FakeHub, tmp_path: Path) -> None:
    files = _files()
    hub.add_repo(REPO, files, token=TOKEN)
    _stage(hub, tmp_path)
    shard = tmp_path / "model-00002-of-00003.safetensors"
    with open(shard, "r+b") as f:  # same size, one byte flipped: mtime changes
        f.seek(1000)
        b = f.read(1)
        f.seek(1000)
        f.write(bytes([b[0] ^ 0x55]))
    hub.reset_log()

    r = _stage(hub, tmp_path)
    assert not r.fast_path
    assert [x.path.split("?")[0].rsplit("/", 1)[-1] for x in hub.requests(host="cdn")] == [
        hashlib.sha256(files["model-00002-of-00003.safetensors"]).hexdigest()]
    _tree_equal(tmp_path, files)

    # a flip that keeps the recorded mtime is invisible to the quick check; verify="full" finds it
    st = shard.stat()
    with open(shard, "r+b") as f:
        f.write(b"\x00\x00")
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _stage(hub, tmp_path).fast_path
    hub.reset_log()
    r = _stage(hub, tmp_path, verify="full")
    assert not r.fast_path and len(hub.requests(host="cdn")) == 1
    _tree_equal(tmp_path, files)


def test_corrupt_bytes_from_the_source_fail_clearly(hub: FakeHub, tmp_path: Path) -> None:
    files = _files()
    hub.add_repo(REPO, files, token=TOKEN)
    hub.corrupt.add("model-00002-of-00003.safetensors")
    with pytest.raises(ChecksumMismatch) as exc:
        _stage(hub, tmp_path, workers=1)
    assert exc.value.path == "model-00002-of-00003.safetensors" and exc.value.algorithm == "sha256"
    assert exc.value.expected == hashlib.sha256(files["model-00002-of-00003.safetensors"]).hexdigest()
    assert read_manifest(tmp_path) is None
    assert not (tmp_path / "model-00002-of-00003.safetensors").exists()
    assert not list((tmp_path / STATE_DIR / PARTIAL_DIR).glob("model-00002*"))  # bad bytes are not kept

    hub.corrupt.clear()  # fixed upstream: the next run completes, keeping what was verified
    r = _stage(hub, tmp_path)
    _tree_equal(tmp_path, files)
    assert r.fetched_bytes < r.bytes


def test_errors_carry_a_reason(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, _files(), token=TOKEN)
    with pytest.raises(WeightsError) as exc:
        _stage(hub, tmp_path, token=None)
    assert exc.value.reason == "RepositoryNotFound"
    with pytest.raises(WeightsError) as exc:
        _stage(hub, tmp_path, revision="no-such-branch")
    assert exc.value.reason == "RevisionNotFound"
    with pytest.raises(WeightsError) as exc:
        stage("hf://moonshotai/Kimi-K3/extra", "main", tmp_path)
    assert exc.value.reason == "InvalidUri"


def test_a_listing_that_escapes_dest_is_refused(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"config.json": b"{}", "../escape.safetensors": b"x" * 10}, token=TOKEN)
    with pytest.raises(WeightsError) as exc:
        _stage(hub, tmp_path / "d")
    assert exc.value.reason == "UnsafePath"
    assert not (tmp_path / "escape.safetensors").exists()


def test_cli_stage_reads_the_token_from_the_environment_and_never_prints_it(hub: FakeHub, tmp_path: Path) -> None:
    files = _files()
    commit = hub.add_repo(REPO, files, token=TOKEN)
    progress_file = tmp_path / "progress.json"
    argv = ["stage", "--uri", URI, "--revision", "main", "--dest", str(tmp_path / "cache"),
            "--progress-file", str(progress_file), "--progress-interval", "0", "-v"]
    out = cli(*argv, env=cli_env(HF_ENDPOINT=hub.endpoint, HF_TOKEN=TOKEN))
    assert out.returncode == 0, out.stderr
    assert TOKEN not in " ".join(argv) and TOKEN not in out.stdout and TOKEN not in out.stderr
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert records[-1]["phase"] == "Complete" and records[-1]["commit"] == commit
    assert records[-1]["bytesDone"] == records[-1]["bytesTotal"] == sum(map(len, files.values()))
    final = progress_file.read_bytes()
    assert json.loads(final) == records[-1] and len(final) < 4096  # fits a termination message
    assert any(x.authorized for x in hub.requests(host="hub"))  # the token was used, from the environment

    # the same from a file (a mounted Secret), and a wrong token: a clear reason, still no token in the output
    token_file = tmp_path / "token"
    token_file.write_text("hf_WRONGwrongWRONG0123456789")
    out = cli("stage", "--uri", URI, "--dest", str(tmp_path / "other"), "--token-file", str(token_file),
              env=cli_env(HF_ENDPOINT=hub.endpoint))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("RepositoryNotFound: hf://moonshotai/Kimi-K3")
    assert "hf_WRONG" not in out.stdout + out.stderr
    assert json.loads(out.stdout.splitlines()[-1])["phase"] == "Failed"

    # there is no way to pass a token on the command line
    out = cli("stage", "--uri", URI, "--dest", str(tmp_path / "x"), "--token", TOKEN, env=cli_env())
    assert out.returncode == 2 and "unrecognized arguments" in out.stderr


def test_sigterm_stops_cleanly_and_keeps_the_partial(hub: FakeHub, tmp_path: Path) -> None:
    big = "model.safetensors"
    data = os.urandom(16 * 1024 * 1024)
    hub.add_repo(REPO, {big: data}, token=TOKEN)
    hub.slow[big] = Slow(fast_bytes=11 * 1024 * 1024, chunk=16 * 1024, delay=0.05, max_seconds=20)
    progress_file = tmp_path / "progress.json"
    dest = tmp_path / "cache"
    proc = cli_popen("stage", "--uri", URI, "--dest", str(dest), "--progress-file", str(progress_file),
                     "--progress-interval", "0", env=cli_env(HF_ENDPOINT=hub.endpoint, HF_TOKEN=TOKEN))
    partials = dest / STATE_DIR / PARTIAL_DIR
    try:
        _wait_for(lambda: partials.is_dir() and any(p.stat().st_size for p in partials.glob("*.part")), 20,
                  "a partial file")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 143, err
    last = json.loads(progress_file.read_text())
    assert last["phase"] == "Failed" and last["reason"] == "Interrupted"
    assert any(p.stat().st_size for p in partials.glob("*.part"))


def test_an_interrupted_update_to_a_new_commit_still_ends_clean(hub: FakeHub, tmp_path: Path) -> None:
    old = _files()
    hub.add_repo(REPO, old, token=TOKEN)
    _stage(hub, tmp_path)
    new = dict(old)
    new["model-00002-of-00003.safetensors"] = b"\x02" * 1_000_000
    del new["weights/model-00003-of-00003.safetensors"]
    commit2 = hub.add_repo(REPO, new, token=TOKEN)
    hub.corrupt.add("model-00002-of-00003.safetensors")  # the update fails half-way
    with pytest.raises(ChecksumMismatch):
        _stage(hub, tmp_path)
    assert read_manifest(tmp_path) is None  # nobody may start on a half-updated folder

    hub.corrupt.clear()
    hub.reset_log()
    r = _stage(hub, tmp_path)
    assert r.commit == commit2 and len(hub.file_downloads()) == 1  # the unchanged files were trusted
    _tree_equal(tmp_path, new)
    assert not (tmp_path / "weights/model-00003-of-00003.safetensors").exists()  # dropped, though the run broke
    assert not (tmp_path / STATE_DIR / "previous.json").exists()
