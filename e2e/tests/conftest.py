"""e2e fixtures: the local real cluster (started if needed), the chart (CRD and RBAC) installed
with the real helm, and the operator as a host process acting as the chart's ServiceAccount."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from e2e.harness.kube import CLUSTER_SH, ROOT, get_json, kubectl, wait_for
from e2e.harness.pod_runner import PodRunner, free_port, prometheus_targets
from e2e.harness.replicas import NO_PROXY_OPENER, Replicas  # noqa: F401 - NO_PROXY_OPENER for tests
from e2e.harness.stager import Stager

pytestmark = pytest.mark.e2e


REPORT: list[str] = []
"""Figures tests measured (faults survived, idle writes, reads per minute), shown in the terminal
summary so that they appear even with -q and output capture."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `after_suite(N)` judge or end what the whole run did (RBAC against every request
    the suite made, the uninstall of the session's chart): they run after every other test, in the
    order of N, whatever their files are called or however the rest is ordered. Every other test
    stands alone. Hand-written (a stable sort on the marker) rather than a plugin: four lines."""
    def rank(item: pytest.Item) -> int:
        marker = item.get_closest_marker("after_suite")
        return int(marker.args[0]) if marker else 0
    items.sort(key=rank)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if REPORT:
        terminalreporter.section("kimik3 e2e figures")
        for line in REPORT:
            terminalreporter.write_line(line)




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
LEASE = SERVICE_ACCOUNT  # the chart names the leader election Lease like the release
OPERATOR_PODS = ("kimik3-operator-a", "kimik3-operator-b")  # the chart's default: 2 replicas
CRD = "crd/kimik3deployments.serving.kimik3.dev"
WEBHOOK_CONFIGURATION = SERVICE_ACCOUNT  # the chart names the ValidatingWebhookConfiguration like the release
WEBHOOK_CERT_SECRET = f"{SERVICE_ACCOUNT}-webhook-cert"  # where the operator keeps the webhook's certificate


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


WEBHOOK_VALUES: list[str] = []
"""Set by the `chart` fixture: the webhook served by the host operator on loopback. Every install
and upgrade passes them, so the API server is never pointed at a Service's fake ClusterIP."""


def helm(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    if args and args[0] in ("install", "upgrade"):
        args = (*args, *WEBHOOK_VALUES)
    result = subprocess.run(["helm", *args], capture_output=True, text=True, timeout=timeout, env=os.environ)
    assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def custom_objects(chart: str) -> client.CustomObjectsApi:
    """The Python client, as the cluster's admin: for reads and writes that must be quick."""
    return client.CustomObjectsApi(config.new_client_from_config(config_file=os.environ["KUBECONFIG"]))


@pytest.fixture(scope="session")
def cluster() -> Iterator[dict[str, str]]:
    env = _cluster_env()
    os.environ.update(env)
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    yield env


@pytest.fixture(scope="session")
def chart(cluster: dict[str, str]) -> Iterator[str]:
    """The chart, installed as users install it: CRD, ServiceAccount, RBAC, the Deployment."""
    # scripts/test.sh sets it once for all its e2e lanes and the after-suite run (test_rbac.py).
    os.environ.setdefault("KIMIK3_E2E_STARTED", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S"))
    port = free_port()
    os.environ.update(KIMIK3_E2E_WEBHOOK_PORT=str(port))
    # No caBundle: the operator keeps the certificate (for 127.0.0.1) and sets the caBundle, as in a
    # cluster; the chart renders the rights it needs for that.
    WEBHOOK_VALUES[:] = ["--set", f"webhook.url=https://127.0.0.1:{port}/validate"]
    helm("upgrade", "--install", RELEASE, str(CHART), "-n", CHART_NAMESPACE, "--create-namespace")
    kubectl("wait", "--for=condition=Established", CRD, "--timeout=60s")
    yield RELEASE


@pytest.fixture(scope="session")
def stager(cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stager]:
    """Runs every staging pod's real command on the host (kwok runs none): see stager.py."""
    running = Stager(tmp_path_factory.mktemp("stager")).start()
    yield running
    running.stop()


@pytest.fixture(scope="session")
def pod_runner(cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodRunner]:
    """Plays every serving leader pod with the engine simulator and every router pod with the real
    vllm-router, on loopback (kwok runs none), and lists the engines for the cluster's Prometheus:
    see pod_runner.py."""
    running = PodRunner(tmp_path_factory.mktemp("pods"), targets=prometheus_targets()).start()
    yield running
    running.stop()
    assert not running.problems, running.problems


@pytest.fixture(scope="session")
def replicas(chart: str, stager: Stager, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    """The operator as the chart deploys it: two `kimik3 run --leader-elect` replicas on the
    chart's Lease, as separate processes acting as the chart's ServiceAccount (kwok runs no
    containers, so the chart's own pods never execute): least privilege is what is tested, and
    every test runs against a leader with a standby beside it. test_ha.py kills and restarts them."""
    folder = tmp_path_factory.mktemp("operator")
    operator_kubeconfig = subprocess.run(
        [str(ROOT / "scripts" / "sa-kubeconfig.sh"), CHART_NAMESPACE, SERVICE_ACCOUNT, str(folder / "kubeconfig")],
        capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    # A Lease left by an earlier run on this cluster would skip the create the RBAC test expects.
    kubectl("-n", CHART_NAMESPACE, "delete", "lease", LEASE, "--ignore-not-found")
    # Likewise the webhook certificate's Secret (the RBAC test expects its create).
    kubectl("-n", CHART_NAMESPACE, "delete", "secret", WEBHOOK_CERT_SECRET, "--ignore-not-found")
    env = {**os.environ, "KIMIK3_RESYNC_SECONDS": "5", "KIMIK3_RETRY_SECONDS": "2"}
    # The chart's webhook URL names one loopback port: the first replica serves it (in a cluster
    # every replica does, behind the webhook Service), with the certificate it keeps in the Secret.
    webhook = ["--webhook-host", "127.0.0.1", "--webhook-port", os.environ["KIMIK3_E2E_WEBHOOK_PORT"],
               "--webhook-cert-secret", WEBHOOK_CERT_SECRET, "--webhook-configuration", WEBHOOK_CONFIGURATION,
               "--webhook-cert-host", "127.0.0.1", "--webhook-cert-check-seconds", "2"]
    group = Replicas(folder, operator_kubeconfig, LEASE, CHART_NAMESPACE, env, free_port,
                     extra_args={OPERATOR_PODS[0]: webhook})
    try:
        group.start_all(OPERATOR_PODS)
        # Until the caBundle is set and the webhook listens, the API server admits unchecked
        # (failurePolicy Ignore): the webhook tests need both.
        wait_for("the operator's caBundle on the webhook configuration",
                 lambda: (get_json("validatingwebhookconfiguration", WEBHOOK_CONFIGURATION)["webhooks"][0]
                          ["clientConfig"].get("caBundle")), timeout=60)
        wait_for("the webhook listening", lambda: _listening(int(os.environ["KIMIK3_E2E_WEBHOOK_PORT"])), timeout=60)
        yield group
    finally:
        group.stop_all()
        print(f"operator logs: {folder}")


@pytest.fixture
def operator(replicas: Replicas) -> Path:
    """One replica leads (waited for before every test: test_ha.py replaces leaders); the folder
    of the replicas' logs. A replica whose process ended since the last test is started again, as
    the kubelet would, so one test's fault never fails the tests after it; an end that neither a
    test's signal nor the deliberate exit on a lost Lease explains fails this test, with the log."""
    crashed = [gone for gone in replicas.restart_exited() if gone.crashed]
    replicas.leader()
    assert not crashed, "\n".join(map(str, crashed))
    return replicas.folder



@pytest.fixture
def namespace(chart: str) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    wait_for(f"default ServiceAccount in {name}",
             lambda: kubectl("-n", name, "get", "serviceaccount", "default", check=False).returncode == 0)
    yield name
    kubectl("delete", "namespace", name, "--wait=false", check=False)
