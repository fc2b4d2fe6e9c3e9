"""Helpers for e2e tests: kubectl against the local cluster and bounded polling."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SH = ROOT / "e2e" / "cluster" / "cluster.sh"
T = TypeVar("T")


def kubectl(*args: str, input: str | None = None, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True,
                          timeout=timeout, check=check, env=os.environ)


def get_json(*args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


def apply(obj: dict[str, Any], *extra: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return kubectl("apply", "-f", "-", *extra, input=yaml.safe_dump(obj), check=check)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 120, interval: float = 0.5) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def is_ready(obj: dict[str, Any]) -> bool:
    """Its Ready condition is True (a pod, or a KimiK3Deployment)."""
    return (condition(obj, "Ready") or {}).get("status") == "True"


def host_daemon() -> tuple[Path, threading.Event]:
    """For `python -m e2e.tests.X DIR [PIDFILE]` processes the demo leaves running: the folder
    (made), the pidfile (written), and an event SIGTERM sets."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    root = Path(sys.argv[1])
    root.mkdir(parents=True, exist_ok=True)
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(f"{os.getpid()}\n")
    return root, stop
