"""Fixtures for the stager tests: a fake Hub and a fake S3 on loopback, a CLI runner, and a guard
that fails any connection off loopback (in this process and in the CLI subprocesses)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).parent
REPO = HERE.parent.parent

# Before huggingface_hub is imported anywhere: no telemetry/agent-registry call, and a default endpoint on
# loopback (a dead port) so that nothing can ever reach the real Hub.
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="kimik3-weights-hf-home-")
os.environ.pop("HF_TOKEN", None)
os.environ.pop("HUGGING_FACE_HUB_TOKEN", None)
if "huggingface_hub.constants" in sys.modules:  # imported by someone earlier: switch telemetry off anyway
    sys.modules["huggingface_hub.constants"].HF_HUB_DISABLE_TELEMETRY = True  # type: ignore[attr-defined]

from .fake_hub import FakeHub  # noqa: E402
from .fake_s3 import FakeS3  # noqa: E402


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.socket.connect

    def guarded(self: socket.socket, address: object) -> None:
        if self.family == socket.AF_INET and not str(address[0]).startswith("127."):  # type: ignore[index]
            raise AssertionError(f"test tried to connect to {address!r}: loopback only")
        if self.family == socket.AF_INET6 and str(address[0]) != "::1":  # type: ignore[index]
            raise AssertionError(f"test tried to connect to {address!r}: loopback only")
        return real(self, address)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "connect", guarded)


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    h = FakeHub().start()
    try:
        yield h
    finally:
        h.stop()


@pytest.fixture
def fake_s3() -> Iterator[FakeS3]:
    s = FakeS3().start()
    try:
        yield s
    finally:
        s.stop()


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a CLI subprocess: no inherited secrets or endpoints, the loopback guard loaded."""
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("AWS_", "HF_", "HUGGING_FACE")) and k not in ("PYTHONPATH",)}
    pythonpath = os.pathsep.join([str(HERE / "netguard"), str(REPO / "operator"), str(REPO)])
    return {**keep, "PYTHONPATH": pythonpath, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": os.environ["HF_HOME"],
            "HF_ENDPOINT": "http://127.0.0.1:9", **extra}


def cli(*args: str, env: dict[str, str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kimik3_operator.stager", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def cli_popen(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "kimik3_operator.stager", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
