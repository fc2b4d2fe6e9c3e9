"""Attack 9: symlinks in the cache lead the stager outside its destination.

Replayed: whoever wrote the cache volume before plants symlinks to a folder outside the destination: a
forged marker (or previous marker, or journal) naming a file under a symlinked folder, which the stale-file
cleanup deleted; the state folder, the partial folder, the lock, the journal, the marker, a partial
download, a listed folder or a listed file as symlinks, through which locks, markers and bytes were
written. Now: nothing outside changes (not a byte, not an mtime, no new entry); the stager replaces its
own symlinked spots with real folders and files and completes. pvc:// volumes are read in place: a file
symlinked to outside fails with UnsafePath, one symlinked inside the folder is followed.
"""

# ruff: noqa: F811  (the fixtures are imported from stager_world, and test arguments shadow them)

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kimik3_operator.contract.stager import MARKER_NAME, STATE_DIR
from kimik3_operator.stager import read_manifest
from kimik3_operator.stager.files import partial_name
from kimik3_operator.stager.manifest import JOURNAL_NAME, LOCK_NAME, PARTIAL_DIR, PREVIOUS_NAME
from kimik3_operator.stager.source import RemoteFile
from tests.stager.fake_hub import git_blob_sha1

from .stager_world import TOKEN, FakeHub, hub, loopback_only, replay, run_stage, tree_state  # noqa: F401

pytestmark = pytest.mark.timeout(240)  # a replay is bounded; a stall fails here, not at the suite's 600 s

FILES = {"config.json": b'{"model_type": "kimi_k3"}', "weights/model-00001.safetensors": b"\x01" * 40_000,
         "weights/model-00002.safetensors": b"\x02" * 30_000}
FORGED_PATH = "link/victim.txt"
"""What a forged marker names: a file under ``dest/link``, a symlink to the outside folder."""

PLANTS = {  # name -> where the symlink goes in dest, relative to dest (to outside/<target>)
    "state": STATE_DIR,
    "partial-folder": f"{STATE_DIR}/{PARTIAL_DIR}",
    "lock": f"{STATE_DIR}/{LOCK_NAME}",
    "journal": f"{STATE_DIR}/{JOURNAL_NAME}",
    "marker": f"{STATE_DIR}/{MARKER_NAME}",
    "previous": f"{STATE_DIR}/{PREVIOUS_NAME}",
    "partial-file": "",  # filled in: the partial download of the big file
    "listed-folder": "weights",
    "listed-file": "config.json",
}
FORGERIES = ("none", MARKER_NAME, PREVIOUS_NAME, JOURNAL_NAME)


def _outside(root: Path) -> Path:
    out = root / "outside"
    (out / "state").mkdir(parents=True)
    (out / "victim.txt").write_text("must survive")
    (out / "victim.bin").write_bytes(b"\0" * 40_000)  # the size of a listed file: tempting to trust
    (out / "state" / MARKER_NAME).write_text("{}")
    return out


def _forge(dest: Path, where: str, commit: str) -> None:
    """A marker (or previous marker, or journal line) naming FORGED_PATH, and dest/link -> outside."""
    entry = {"path": FORGED_PATH, "size": 12, "sha256": "0" * 64, "identity": "x", "verifiedBy": "none",
             "mtimeNs": 0}
    state = dest / STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    if where == JOURNAL_NAME:
        (state / where).write_text(json.dumps(entry) + "\n")
    else:
        marker = {"format": 1, "uri": "hf://org/other", "revision": "main", "commit": commit, "filters": {},
                  "files": [entry]}
        (state / where).write_text(json.dumps(marker))


def test_no_symlink_leads_the_stager_outside(hub: FakeHub) -> None:
    commit = hub.add_repo("org/k3", FILES)

    @replay(40)
    @given(plants=st.sets(st.sampled_from(sorted(PLANTS))), forged=st.sampled_from(FORGERIES),
           absolute=st.booleans(), workers=st.sampled_from([1, 4]))
    def one(plants: set[str], forged: str, absolute: bool, workers: int) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            outside = _outside(Path(tmp))
            dest = Path(tmp, "dest")
            dest.mkdir()
            state_linked = "state" in plants
            if forged != "none" and not state_linked:
                _forge(dest, forged, "f" * 40)
                (dest / "link").symlink_to(outside if absolute else Path("..", "outside"))
            big = RemoteFile("weights/model-00001.safetensors", 40_000, git_blob_sha1(FILES[
                "weights/model-00001.safetensors"]))
            for name in sorted(plants, key=lambda n: PLANTS[n].count("/") if PLANTS[n] else 9):
                at = PLANTS[name] or f"{STATE_DIR}/{PARTIAL_DIR}/{partial_name(big)}"
                if state_linked and at.startswith(STATE_DIR + "/"):
                    continue  # inside a symlinked state folder: it would be planted outside
                if "partial-folder" in plants and at.startswith(f"{STATE_DIR}/{PARTIAL_DIR}/"):
                    continue
                target = outside / ("state" if name in ("state", "partial-folder", "listed-folder") else
                                    "victim.bin" if name in ("partial-file", "listed-file") else "victim.txt")
                link = dest / at
                link.parent.mkdir(parents=True, exist_ok=True)
                if os.path.lexists(link):
                    continue
                link.symlink_to(target if absolute else Path(os.path.relpath(target, link.parent)))
            before = tree_state(outside)
            out = run_stage("hf://org/k3", dest, token=TOKEN, env={"HF_ENDPOINT": hub.endpoint}, workers=workers)
            assert tree_state(outside) == before, "something outside the destination changed"
            assert out.error is None, out
            assert out.result is not None and out.result.commit == commit
            for path, data in FILES.items():
                assert not (dest / path).is_symlink() and (dest / path).read_bytes() == data
            assert not (dest / STATE_DIR).is_symlink() and read_manifest(dest) is not None
            again = run_stage("hf://org/k3", dest, token=TOKEN, env={"HF_ENDPOINT": hub.endpoint})
            assert again.result is not None and again.result.fast_path
            assert tree_state(outside) == before

    one()


def test_pvc_follows_symlinks_inside_its_folder_only(tmp_path: Path) -> None:
    outside = _outside(tmp_path)
    dest = tmp_path / "claim" / "kimi-k3"
    (dest / "blobs").mkdir(parents=True)
    (dest / "blobs" / "abc").write_bytes(b"weights")
    (dest / "model.safetensors").symlink_to(Path("blobs", "abc"))  # a Hub cache snapshot links into its blobs
    out = run_stage("pvc://claim/kimi-k3", dest)
    assert out.error is None and out.result is not None and out.result.files == 2, out

    (dest / "stolen.json").symlink_to(outside / "victim.txt")
    before = tree_state(outside)
    out = run_stage("pvc://claim/kimi-k3", dest)
    assert out.reason == "UnsafePath" and "stolen.json" in out.last.message, out
    assert tree_state(outside) == before
