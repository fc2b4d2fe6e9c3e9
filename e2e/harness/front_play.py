"""Run a router pod's front (HAProxy, render/front.py) outside its pod: in the pod runner, where
played pods share the host's network namespace, and in the front-door security tests.

Outside a pod there is no pod-local loopback: the front's wildcard listener and the router's
loopback address become the addresses the caller gives (the played pod's IP, or free ports on
127.0.0.1). Nothing else of the rendered configuration changes, and the binary is Debian 12's
HAProxy, the one the router image installs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from kimik3_operator.render.front import API_KEY_ENV, FRONT_PORT, METRICS_PORT, ROUTER_LOOPBACK_PORT


def relocate(config: str, front: str, router: str, metrics: str) -> str:
    """The rendered configuration with its three addresses ("host:port" each) replaced."""
    moves = ((f"bind 0.0.0.0:{FRONT_PORT}\n", f"bind {front}\n", 1),
             (f" 127.0.0.1:{ROUTER_LOOPBACK_PORT}", f" {router}", 2),  # the router and probes backends
             (f"bind 0.0.0.0:{METRICS_PORT}\n", f"bind {metrics}\n", 1))
    for old, new, count in moves:
        if config.count(old) != count:
            raise ValueError(f"the front's configuration has {config.count(old)} of {old.strip()!r}, not {count}")
        config = config.replace(old, new)
    return config


def haproxy() -> str:
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if found is None:
        raise RuntimeError("haproxy is not installed (scripts/test.sh installs Debian's haproxy)")
    return found


def start_front(config: str, folder: Path, log: Path, api_key: str | None = None) -> subprocess.Popen[bytes]:
    """HAProxy in the foreground on `config` (already relocated), its output in `log`."""
    path = folder / "front.cfg"
    path.write_text(config + "\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if api_key is not None:
        env[API_KEY_ENV] = api_key
    with log.open("ab") as out:
        return subprocess.Popen([haproxy(), "-db", "-f", str(path)], stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
