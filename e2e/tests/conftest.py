"""e2e fixtures: the local real cluster (started if needed), the chart (CRD and RBAC) installed
with the real helm, and the operator as a host process acting as the chart's ServiceAccount."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest

from .kube import CLUSTER_SH, ROOT, kubectl, wait_for

pytestmark = pytest.mark.e2e
# Loopback only, never through a proxy from the environment.
NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


REPORT: list[str] = []
"""Figures tests measured (faults survived, idle writes, reads per minute), shown in the terminal
summary so that they appear even with -q and output capture."""


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if REPORT:
        terminalreporter.section("kimik3 e2e figures")
        for line in REPORT:
            terminalreporter.write_line(line)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cluster_env() -> dict[str, str]:
    up = subprocess.run([str(CLUSTER_SH), "up"], capture_output=True, text=True, timeout=5400)
    if up.returncode != 0:
        raise RuntimeError(f"cluster.sh up failed ({up.returncode}):\n{up.stderr[-4000:]}")
    env_lines = subprocess.run([str(CLUSTER_SH), "env"], capture_output=True, text=True, check=True).stdout
    env: dict[str, str] = {}
    for line in env_lines.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            env[key] = os.path.expandvars(value.strip("'\""))
    env["KUBECONFIG"] = up.stdout.strip().splitlines()[-1]
    return env


CHART = ROOT / "charts" / "kimik3-operator"
RELEASE, CHART_NAMESPACE = "kimik3-operator", "kimik3-system"
SERVICE_ACCOUNT = "kimik3-operator"  # the chart's full name for this release name
CRD = "crd/kimik3deployments.serving.kimik3.dev"


def helm(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["helm", *args], capture_output=True, text=True, timeout=timeout, env=os.environ)
    assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stderr}"
    return result


@pytest.fixture(scope="session")
def cluster() -> Iterator[dict[str, str]]:
    env = _cluster_env()
    os.environ.update(env)
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    yield env


@pytest.fixture(scope="session")
def chart(cluster: dict[str, str]) -> Iterator[str]:
    """The chart, installed as users install it: CRD, ServiceAccount, RBAC, the Deployment."""
    os.environ["KIMIK3_E2E_STARTED"] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    helm("upgrade", "--install", RELEASE, str(CHART), "-n", CHART_NAMESPACE, "--create-namespace")
    kubectl("wait", "--for=condition=Established", CRD, "--timeout=60s")
    yield RELEASE


class OperatorProcess:
    """`kimik3 run` as a separate process acting as the chart's ServiceAccount (kwok runs no
    containers, so the chart's own pod never executes): least privilege is what is tested.
    Tests that need the operator down, or one with other settings, stop and start it."""

    def __init__(self, folder: Path, settings: dict[str, str]) -> None:
        self.folder, self.log = folder, folder / "operator.log"
        self.settings = settings
        self.proc: subprocess.Popen[bytes] | None = None
        self.liveness = ""
        self.kubeconfig = subprocess.run(
            [str(ROOT / "scripts" / "sa-kubeconfig.sh"), CHART_NAMESPACE, SERVICE_ACCOUNT,
             str(folder / "kubeconfig")], capture_output=True, text=True, check=True, timeout=60).stdout.strip()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, **self.settings}
        self.liveness = f"http://127.0.0.1:{free_port()}/healthz"
        with self.log.open("a") as out:
            self.proc = subprocess.Popen([str(Path(sys.executable).with_name("kimik3")), "run",
                                          "--liveness", self.liveness],
                                         stdout=out, stderr=subprocess.STDOUT, env=env)

        def live() -> bool:
            assert self.alive(), f"operator exited:\n{self.log.read_text()[-4000:]}"
            try:
                with NO_PROXY_OPENER.open(self.liveness, timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False
        wait_for("the operator's liveness endpoint", live, timeout=60)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


@pytest.fixture(scope="session")
def operator_process(chart: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The suite's operator, with short resync and retry intervals so tests converge fast."""
    process = OperatorProcess(tmp_path_factory.mktemp("operator"),
                              {"KIMIK3_RESYNC_SECONDS": "5", "KIMIK3_RETRY_SECONDS": "2"})
    process.start()
    try:
        yield process
    finally:
        process.stop()
        print(f"operator log: {process.log}")


@pytest.fixture(scope="session")
def operator(operator_process: OperatorProcess) -> Path:
    return operator_process.log


@pytest.fixture
def namespace(chart: str) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    wait_for(f"default ServiceAccount in {name}",
             lambda: kubectl("-n", name, "get", "serviceaccount", "default", check=False).returncode == 0)
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)
