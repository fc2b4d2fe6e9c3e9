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
from kubernetes import config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from kimik3_operator.k8s.informer import raw_get

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SH = ROOT / "e2e" / "cluster" / "cluster.sh"
T = TypeVar("T")


def kubectl(*args: str, input: str | None = None, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True,
                          timeout=timeout, check=check, env=os.environ)


API_AWAY = 120
"""Seconds a harness call standing in for a kubelet is tried for: longer than any API server
restart of the fault and chaos tests."""


def kubectl_until_ok(*args: str, ok: Callable[[subprocess.CompletedProcess[str]], bool] = lambda r: r.returncode == 0,
                     timeout: float = API_AWAY) -> subprocess.CompletedProcess[str]:
    """`kubectl`, tried again while the API server is away (a test restarts it), as a kubelet keeps
    trying its calls: the first answer `ok` accepts, or AssertionError after `timeout`."""
    def attempt() -> subprocess.CompletedProcess[str] | None:
        try:
            result = kubectl(*args, check=False, timeout=30)
        except subprocess.TimeoutExpired:
            return None
        return result if ok(result) else None
    return wait_for(f"kubectl {' '.join(args[:4])} to succeed", attempt, timeout=timeout, interval=1)


def get_json(*args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


LIST_ERRORS = (OSError, ValueError, ApiException, HTTPError)
"""What a failed `api_list` raises: a loop that lists every half second skips that round."""
_CLIENT: dict[str, Any] = {}
_CLIENT_LOCK = threading.Lock()


def api_list(path: str, **query: str) -> list[dict[str, Any]]:
    """The items of one list call (e.g. `/api/v1/pods`, labelSelector=...), made in-process with
    the kubernetes client against $KUBECONFIG. For the loops that list every half second (the pod
    runner, the stager): a kubectl process per list costs ~0.17 CPU-s, so three such loops of the
    demo and the tests' cluster took most of a 2-core machine."""
    kubeconfig = os.environ["KUBECONFIG"]
    with _CLIENT_LOCK:
        if kubeconfig not in _CLIENT:
            _CLIENT[kubeconfig] = config.new_client_from_config(config_file=kubeconfig)
        api = _CLIENT[kubeconfig]
    return json.loads(raw_get(api, path, list(query.items()), read_timeout=30).data)["items"]  # type: ignore[no-any-return]


def apply(obj: dict[str, Any], *extra: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return kubectl("apply", "-f", "-", *extra, input=yaml.safe_dump(obj), check=check)


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 120, interval: float = 0.5) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` and the last value."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


def delete_deployments(namespace: str, name: str = "--all", timeout: float = 120, pods: str = "") -> None:
    """Delete a test's KimiK3Deployment (or all of the namespace's) and wait until its pods (those
    `pods` selects, else all of the namespace's) are gone, so later tests find the fake GPUs free.
    Best effort on the delete: the wait is the check."""
    kubectl("-n", namespace, "delete", "k3", name, "--wait=true", "--timeout=120s", check=False)
    selector = ["-l", pods] if pods else []
    wait_for(f"the pods of {namespace} to go", lambda: not get_json("pods", "-n", namespace, *selector)["items"],
             timeout=timeout)


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def is_ready(obj: dict[str, Any]) -> bool:
    """Its Ready condition is True (a pod, or a KimiK3Deployment)."""
    return (condition(obj, "Ready") or {}).get("status") == "True"


def host_daemon() -> tuple[Path, threading.Event]:
    """For `python -m e2e.harness.X DIR [PIDFILE]` processes the demo leaves running: the folder
    (made), the pidfile (written), and an event SIGTERM sets."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    root = Path(sys.argv[1])
    root.mkdir(parents=True, exist_ok=True)
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(f"{os.getpid()}\n")
    return root, stop
