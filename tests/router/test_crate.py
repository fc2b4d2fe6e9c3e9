"""kimik3-router's own tests (router/: unit, fake engines, a fake API server, the engine simulator),
run by cargo with the crate's locked dependencies, so `make test` covers the router as it covers the
operator. The simulator test runs this venv's Python with this checkout's code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = Path(os.environ.get("KIMIK3_CACHE", Path.home() / ".cache" / "kimik3-e2e")) / "router-target"


def test_the_router_crate_passes_its_own_tests() -> None:
    env = {**os.environ, "KIMIK3_PYTHON": sys.executable,
           "PYTHONPATH": f"{ROOT / 'operator'}:{ROOT / 'simulator'}", "NO_PROXY": "127.0.0.0/8,localhost"}
    run = subprocess.run(["cargo", "test", "--release", "--locked", "--quiet", "--manifest-path",
                          str(ROOT / "router" / "Cargo.toml"), "--target-dir", str(TARGET)],
                         capture_output=True, text=True, timeout=1500, env=env)
    assert run.returncode == 0, f"cargo test failed:\n{run.stdout[-6000:]}\n{run.stderr[-4000:]}"
    assert "test result: ok" in run.stdout
