"""The operator as users run it: its image built from images/operator/Dockerfile (podman, on the
stand-in base: e2e/images/build.sh), released to the cluster's loopback registry (`build.sh
release`: the images, the chart pinning each by digest, SBOMs), `helm install`ed from `oci://` by
those digests and run as real pods by a real kubelet with containerd and runc (the cluster's real
node, e2e/cluster/node.sh), under the chart's securityContext.

This release watches only its own namespace and installs no CRD (the session's chart did), so it
never meets the host replicas the other tests run: here it proves the image, the chart and the
runtime together; what it reconciles is the other tests' subject. It is uninstalled at the end,
before the idle and RBAC tests read the audit log."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from e2e.harness.kube import ROOT, apply, delete_deployments, get_json, is_ready, kubectl, wait_for
from e2e.harness.pod_runner import PodRunner
from e2e.harness.replicas import Replicas, metric
from e2e.harness.traffic import SESSION, post, prompt, stats
from kimik3_operator.planner import images

from .conftest import OPERATOR_PODS, REPORT

pytestmark = pytest.mark.e2e

RELEASE = NAMESPACE = "kimik3-real"
FULLNAME = f"{RELEASE}-kimik3-operator"  # the chart's full name for this release
IMAGE_BUILD = ROOT / "e2e" / "images" / "build.sh"
UID = 65532  # images/operator/Dockerfile USER; no passwd entry names it
PD_EXAMPLE = ROOT / "manifests" / "examples" / "pd-gb300-decode-b200-prefill.yaml"


def _chart_version() -> str:
    for line in (ROOT / "charts" / "kimik3-operator" / "Chart.yaml").read_text().splitlines():
        if line.startswith("version:"):
            return line.split(":", 1)[1].strip().strip('"')
    raise AssertionError("Chart.yaml has no version")


def helm(*args: str, timeout: float = 300) -> str:
    """helm itself (not conftest's, which points the webhook at the host replicas)."""
    result = subprocess.run(["helm", *args], capture_output=True, text=True, timeout=timeout, env=os.environ)
    assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def values(tag: str | None = None) -> list[str]:
    """What a user on this cluster sets: where the operator may run (the real node's taint and
    label), the one namespace it watches, no second copy of the CRD; the release's chart names the
    images by digest, and `tag` names another operator image instead (an upgrade)."""
    key, _, rest = os.environ["KIMIK3_REAL_NODE_TAINT"].partition("=")
    effect = rest.partition(":")[2]
    out = ["--set-json", f'watchNamespaces=["{NAMESPACE}"]', "--set", "crds.enabled=false",
           "--set-json", f"tolerations=[{json.dumps({'key': key, 'operator': 'Exists', 'effect': effect})}]",
           "--set-json", 'nodeSelector={"kimik3.dev/e2e-node":"real"}',
           # as often as the host replicas: a test waits for rounds, not for minutes
           "--set", "resyncSeconds=5"]
    return out + (["--set", "image.digest=", "--set", f"image.tag={tag}"] if tag else [])


def operator_pods() -> list[dict[str, Any]]:
    return [p for p in get_json("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=kimik3-operator")["items"]
            if not p["metadata"].get("deletionTimestamp")]


def ready_pods(n: int = 2) -> list[dict[str, Any]] | None:
    pods = operator_pods()
    return pods if len(pods) == n and all(is_ready(p) for p in pods) else None


def lease_holder() -> str:
    lease = get_json("lease", FULLNAME, "-n", NAMESPACE)
    return str(lease["spec"].get("holderIdentity") or "")


def pod_of(holder: str, pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The pod whose name a Lease holder's identity starts with (k8s/identity.py: pod name + suffix)."""
    return next((p for p in pods if holder.startswith(p["metadata"]["name"])), None)


def leader(pods: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The pod that holds the Lease now."""
    return pod_of(lease_holder(), pods)


@pytest.fixture(scope="module")
def registry(chart: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A release of the tree in the cluster's registry (images built if the tree changed them): the
    images, the chart pinning each by digest, and its assets in RELEASE_DIR."""
    host = os.environ["KIMIK3_REGISTRY"]
    out = tmp_path_factory.mktemp("release")
    pushed = subprocess.run([str(IMAGE_BUILD), "release", host, str(out)], capture_output=True, text=True,
                            timeout=1800)
    assert pushed.returncode == 0, f"e2e/images/build.sh release failed:\n{pushed.stderr[-4000:]}"
    DIGESTS.update({name: digest for name, _ref, digest in (line.split() for line in pushed.stdout.splitlines())})
    RELEASE_DIR[:] = [out]
    return host


DIGESTS: dict[str, str] = {}
"""Each released image's digest by its name (operator, router, vllm-router), set by `registry`."""
RELEASE_DIR: list[Path] = []
"""The release's assets (release.json, SBOMs, the wheel, the chart), set by `registry`."""


@pytest.fixture(scope="module")
def release(registry: str) -> Iterator[str]:
    helm("install", RELEASE, f"oci://{registry}/charts/kimik3-operator", "--version", _chart_version(),
         "--plain-http", "-n", NAMESPACE, "--create-namespace", *values(), "--wait", "--timeout", "240s")
    yield RELEASE
    helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "120s")
    kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def test_the_chart_from_the_registry_runs_two_real_operator_pods_and_one_leads(release: str, registry: str) -> None:
    pods = wait_for("two Ready operator pods", ready_pods, timeout=120)
    for pod in pods:
        assert pod["spec"]["nodeName"] == os.environ["KIMIK3_REAL_NODE"]
        status = pod["status"]["containerStatuses"][0]
        # Pulled by containerd from the loopback registry by the release's digest, not imported.
        assert status["imageID"] == f"{registry}/kimik3-operator/kimik3-operator@{DIGESTS['operator']}", status
        assert pod["spec"]["containers"][0]["image"] == status["imageID"]
        assert status["restartCount"] == 0, f"{pod['metadata']['name']} restarted: {status}"
    assert wait_for("a Lease holder that is one of the pods", lambda: leader(pods), timeout=60)


def _components(path: Path) -> set[tuple[str, str]]:
    """(name, version) of every component a CycloneDX document lists, the name as its purl spells it."""
    bom = json.loads(path.read_text())
    assert bom["bomFormat"] == "CycloneDX", path
    return {(unquote(c["purl"].partition("?")[0].rpartition("@")[0].rpartition("/")[2]).lower(), c["version"])
            for c in bom["components"] if c.get("purl")}


def _pins(requirements: Path) -> set[tuple[str, str]]:
    """name==version of a hash-locked requirements file (images/*/requirements-<arch>.txt)."""
    return {(n.strip().lower().replace("_", "-").replace(".", "-"), v.split()[0].strip())
            for n, _, v in (line.partition("==") for line in requirements.read_text().splitlines()
                            if "==" in line and not line.lstrip().startswith("#"))}


def _installed_debs(image: str) -> set[tuple[str, str]]:
    """(package, version) of what the image's own dpkg database says is installed."""
    env = dict(os.environ)  # podman on build.sh's own storage: its `env` prints one export line
    exports = subprocess.run([str(IMAGE_BUILD), "env"], capture_output=True, text=True, check=True).stdout
    for line in exports.splitlines():
        env.update(word.split("=", 1) for word in shlex.split(line.removeprefix("export ")))
    rootfs = subprocess.run(["podman", "image", "mount", image], capture_output=True, text=True, check=True,
                            env=env).stdout.strip()
    try:
        stanzas = (Path(rootfs) / "var/lib/dpkg/status").read_text().split("\n\n")
    finally:
        subprocess.run(["podman", "image", "unmount", image], capture_output=True, env=env, check=False)
    out = set()
    for stanza in stanzas:
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" "))
        if fields.get("Status") == "install ok installed":
            out.add((fields["Package"].lower(), fields["Version"]))
    return out


def test_the_release_pins_every_image_by_digest_and_lists_what_each_holds(registry: str) -> None:
    """`build.sh release`: release.json names each image by the digest the registry holds; the chart
    in the registry names the operator and both router images by those digests; SHA256SUMS holds;
    each image's SBOMs list exactly its Python lock's pins (or the router crate's locked
    dependencies) and the Debian packages its own dpkg database has installed, at their versions."""
    out = RELEASE_DIR[0]
    manifest = json.loads((out / "release.json").read_text())
    assert manifest["version"] == _chart_version() and manifest["chart"]["version"] == _chart_version()
    by_name = {i["name"]: i for i in manifest["images"]}
    assert sorted(by_name) == ["operator", "router", "vllm-router"]
    for name, image in by_name.items():
        assert image["digest"] == DIGESTS[name]
        repository = image["reference"].partition("/")[2]
        assert _registry_digest(registry, repository, image["digest"]) == image["digest"]
    shown = yaml.safe_load(helm("show", "values", manifest["chart"]["reference"], "--version", manifest["version"],
                                "--plain-http"))
    assert shown["image"] == {**shown["image"], "repository": by_name["operator"]["reference"],
                              "digest": DIGESTS["operator"]}
    assert shown["routerImages"] == {"kimik3Router": f"{by_name['router']['reference']}@{DIGESTS['router']}",
                                     "vllmRouter": f"{by_name['vllm-router']['reference']}@{DIGESTS['vllm-router']}"}
    subprocess.run(["sha256sum", "--check", "--quiet", "SHA256SUMS"], cwd=out, check=True)

    arch = {"x86_64": "amd64", "aarch64": "arm64"}[os.uname().machine]
    for name, lock in (("operator", "operator"), ("vllm-router", "vllm-router")):
        pins = _pins(ROOT / "images" / lock / f"requirements-{arch}.txt")
        listed = {(n.replace(".", "-").replace("_", "-"), v)
                  for n, v in _components(out / "sbom" / f"{name}.python.cdx.json")}
        assert pins and listed == pins, (name, sorted(pins ^ listed))
    lock = {(p["name"], p["version"]) for p in tomllib.loads((ROOT / "router" / "Cargo.lock").read_text())["package"]}
    crates = _components(out / "sbom" / "router.cargo.cdx.json")
    direct = {n for n in tomllib.loads((ROOT / "router" / "Cargo.toml").read_text())["dependencies"]}
    assert crates and crates <= lock, sorted(crates - lock)  # nothing the lock does not hold
    assert direct <= {n for n, _ in crates}, sorted(direct - {n for n, _ in crates})  # every direct dependency
    for name, tag in (("operator", images.OPERATOR_IMAGE), ("router", images.ROUTER_IMAGE),
                      ("vllm-router", images.VLLM_ROUTER_IMAGE)):
        installed = _installed_debs(tag)
        listed = _components(out / "sbom" / f"{name}.deb.cdx.json")
        assert installed and installed <= listed, (name, sorted(installed - listed)[:10])
        assert {n for n, _ in listed - installed} <= {"debian"}, (name, sorted(listed - installed)[:10])
    dockerfile = (ROOT / "images" / "router" / "Dockerfile").read_text().splitlines()
    haproxy = next(line.split("=", 1)[1] for line in dockerfile if line.startswith("ARG HAPROXY_VERSION="))
    assert ("haproxy", haproxy) in _components(out / "sbom" / "router.deb.cdx.json")
    REPORT.append(f"release {manifest['version']}: {len(by_name)} images pinned by digest in the chart; SBOM parts "
                  + ", ".join(f"{p.name.removesuffix('.cdx.json')} {len(json.loads(p.read_text())['components'])}"
                              for p in sorted((out / "sbom").glob("*.json"))))


def test_the_operator_runs_as_the_chart_says_without_a_user_database(release: str) -> None:
    """The real runtime applies the chart's securityContext: uid/gid 65532 with no passwd entry
    (kopf asked getpass.getuser() for its identity and crashed here before), read-only root, no
    capabilities, seccomp filtering, no new privileges. Read inside the container itself."""
    probe = ("import os, pwd; s = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines()"
             " if ':\\t' in l); print(os.getuid(), os.getgid(), any(p.pw_uid == os.getuid() for p in pwd.getpwall()),"
             " os.access('/', os.W_OK), os.access('/tmp', os.W_OK), s['CapEff'], s['Seccomp'], s['NoNewPrivs'])")
    for pod in wait_for("two Ready operator pods", ready_pods, timeout=120):
        out = kubectl("exec", "-n", NAMESPACE, pod["metadata"]["name"], "--", "python3", "-c", probe).stdout.split()
        assert out == [str(UID), str(UID), "False", "False", "True", "0000000000000000", "2", "1"], out


def test_a_crashed_leader_is_restarted_by_the_kubelet_and_the_lease_passes_on(release: str) -> None:
    """SIGKILL the leading container: the kubelet restarts it in place, and the Lease passes from
    the dead process to a live one once it expires. Which one is a race, and both are right: the
    standby pod, or the restarted container, which is a new candidate (k8s/identity.py: one
    identity per process, not per pod). What must never happen is the dead identity holding on."""
    pods = wait_for("two Ready operator pods", ready_pods, timeout=120)
    # One read gives both the identity that will die and its pod.
    dead = wait_for("a leader", lambda: (h := lease_holder()) and pod_of(h, pods) and h, timeout=60)
    old = pod_of(dead, pods)
    assert old is not None
    name = old["metadata"]["name"]
    container = old["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    # SIGKILL from outside, through containerd: no handler runs, the Lease is not released.
    subprocess.run(["ctr", "--address", os.environ["KIMIK3_CONTAINERD"], "-n", "k8s.io", "tasks", "kill",
                    "--signal", "SIGKILL", container], check=True, capture_output=True, text=True)
    new_holder = wait_for("a live process holding the Lease",
                          lambda: (h := lease_holder()) and h != dead and h, timeout=90)
    successor = pod_of(new_holder, pods)
    assert successor, f"the Lease went to {new_holder}, not one of {[p['metadata']['name'] for p in pods]}"

    def restarted() -> dict[str, Any] | None:
        pod = get_json("pod", name, "-n", NAMESPACE)
        return pod if is_ready(pod) and pod["status"]["containerStatuses"][0]["restartCount"] >= 1 else None

    back = wait_for("the killed container restarted in place and Ready", restarted, timeout=120)
    assert lease_holder() != dead
    heir = "the restarted container" if successor["metadata"]["name"] == name else "the standby"
    REPORT.append(f"real node: leader {name} SIGKILLed; Lease to {heir} ({new_holder}); "
                  f"restarts {back['status']['containerStatuses'][0]['restartCount']}")


def test_helm_test_passes_on_the_real_node(release: str) -> None:
    out = helm("test", RELEASE, "-n", NAMESPACE, "--timeout", "120s")
    assert "Phase:          Succeeded" in out, out


def _serving_state(name: str) -> dict[str, Any]:
    """What an operator upgrade must leave alone: every pod of deployment `name` (by UID), and the
    generation of its LeaderWorkerSets and router Deployment (a changed template bumps it)."""
    selector = f"app.kubernetes.io/instance={name}"
    return {"pods": {p["metadata"]["name"]: p["metadata"]["uid"]
                     for p in get_json("pods", "-n", NAMESPACE, "-l", selector)["items"]},
            "generations": {f"{o['kind']}/{o['metadata']['name']}": o["metadata"]["generation"]
                            for kind in ("leaderworkersets", "deployments")
                            for o in get_json(kind, "-n", NAMESPACE, "-l", selector)["items"]}}


def _resyncs(pod: dict[str, Any]) -> float | None:
    """The pod's completed resync rounds (each reconciled every deployment it watches once), read
    from the port its container names `metrics`."""
    port = next(p["containerPort"] for p in pod["spec"]["containers"][0]["ports"] if p["name"] == "metrics")
    return metric(f"http://{pod['status']['podIP']}:{port}/metrics", "kimik3_operator_resyncs_total")


def test_helm_upgrade_to_another_image_rolls_the_operator_and_no_serving_pod(
        release: str, registry: str, replicas: Replicas, stager: Any) -> None:
    """A new image reference (the same build under a second tag, as a registry holds a rebuild)
    rolls the operator's Deployment while a P/D deployment serves in the namespace it watches: the
    new pods come up Ready, one leads and reconciles the deployment again, and not one serving or
    router pod is replaced, nor any template changed (an upgrade must not restart a 2.8T model).
    The host replicas, which watch every namespace, stand aside meanwhile: the release's pods are
    the deployment's only operator."""
    before = {p["metadata"]["name"] for p in wait_for("two Ready operator pods", ready_pods, timeout=120)}
    replicas.stop_all()
    try:
        kubectl("-n", NAMESPACE, "create", "secret", "generic", "hf-token", "--from-literal=token=hf_e2e")
        body = yaml.safe_load(PD_EXAMPLE.read_text())
        body["metadata"] = {"name": "k3-up", "namespace": NAMESPACE}
        apply(body)
        wait_for("k3-up Ready under the release's operator pods",
                 lambda: is_ready(get_json("k3", "k3-up", "-n", NAMESPACE)), timeout=300)
        serving = _serving_state("k3-up")
        routers = [k for k in serving["generations"] if k.startswith("Deployment/k3-up-router")]
        assert len(serving["pods"]) >= 4 and routers, serving

        tag = f"{_chart_version()}-e2e-upgrade"
        pushed = subprocess.run([str(IMAGE_BUILD), "retag", images.OPERATOR_IMAGE,
                                 f"{registry}/kimik3-operator/kimik3-operator:{tag}"],
                                capture_output=True, text=True, timeout=300)
        assert pushed.returncode == 0, pushed.stderr[-2000:]
        helm("upgrade", RELEASE, f"oci://{registry}/charts/kimik3-operator", "--version", _chart_version(),
             "--plain-http", "-n", NAMESPACE, *values(tag), "--wait", "--timeout", "240s")

        def rolled() -> list[dict[str, Any]] | None:
            pods = ready_pods()
            if not pods or {p["metadata"]["name"] for p in pods} & before:
                return None
            return pods if all(p["spec"]["containers"][0]["image"].endswith(f":{tag}") for p in pods) else None

        pods = wait_for("two Ready pods of the new image", rolled, timeout=180)
        new_leader = wait_for("a leader among the new pods", lambda: leader(pods), timeout=90)
        # Two full rounds by the new leader: the deployment was reconciled under the new image.
        wait_for("two resync rounds by the new leader", lambda: (_resyncs(new_leader) or 0) >= 2, timeout=120)
        assert is_ready(get_json("k3", "k3-up", "-n", NAMESPACE))
        after = _serving_state("k3-up")
        assert after == serving, f"the operator upgrade changed what serves:\nbefore {serving}\nafter  {after}"
        REPORT.append(f"real node: helm upgrade rolled the operator ({len(before)} pods -> {len(pods)}, leader "
                      f"{new_leader['metadata']['name']}); {len(serving['pods'])} serving and router pods and "
                      f"{len(serving['generations'])} templates unchanged")
    finally:
        delete_deployments(NAMESPACE, timeout=180, pods="app.kubernetes.io/instance=k3-up")
        replicas.start_all(OPERATOR_PODS)


def _router_on_the_real_node(namespace: str) -> dict[str, Any]:
    """The P/D example with its router placed on the real node (spec.router's nodeSelector and
    tolerations, as a user places it on a CPU pool) and sized for the node's two cores; its prefill
    leg routed by PrecisePrefix, so the prefill engines publish KV events the router pod follows."""
    body = yaml.safe_load(PD_EXAMPLE.read_text())
    body["metadata"] = {"name": "k3-real", "namespace": namespace}
    key, _, rest = os.environ["KIMIK3_REAL_NODE_TAINT"].partition("=")
    body["spec"]["router"] = {**body["spec"].get("router", {}), "replicas": 1,
                              "nodeSelector": {"kimik3.dev/e2e-node": "real"},
                              "tolerations": [{"key": key, "operator": "Exists", "effect": rest.partition(":")[2]}],
                              "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                              "prefillPolicy": "PrecisePrefix",
                              "apiKey": {"name": "clients", "key": "api-key"},
                              "admission": {"maxRequestBytes": BODY_LIMIT}}
    return body


API_KEY = "sk-e2e-real-node"
HOSTILE = [b"GET /workers HTTP/1.1", b"DELETE /workers/http%3A%2F%2F127.64.0.5%3A8000 HTTP/1.1",
           b"GET //workers HTTP/1.1", b"GET /%2Fworkers HTTP/1.1", b"GET /v1/models/../workers HTTP/1.1",
           b"GET http://x/workers HTTP/1.1", b"POST /remove_worker?url=http://127.64.0.5:8000 HTTP/1.1",
           b"POST /flush_cache HTTP/1.1"]


def _raw(ip: str, port: int, line: bytes) -> int:
    """The status HAProxy answers to a request line sent as it is, with the right key."""
    with socket.create_connection((ip, port), timeout=10) as conn:
        conn.sendall(line + b"\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode()
                     + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        return int(conn.recv(4096).split(b" ", 2)[1])


BODY_LIMIT = "1Mi"


def _oversized(ip: str, chunked: bool) -> tuple[int, bytes]:
    """Status and body of the answer to a chat request of 1.5 MB, over the real pod's 1 MiB limit:
    announced by Content-Length (the front refuses it from the headers), or chunked (no length to
    read: the router's --max-payload-size refuses it). The client may still be sending when the
    answer comes and the connection closes; what counts is the answer."""
    body = b'{"model": "kimi-k3", "messages": [{"role": "user", "content": "' + b"x" * 1_500_000 + b'"}]}'
    framing = (b"Transfer-Encoding: chunked\r\n" if chunked else b"Content-Length: %d\r\n" % len(body))
    payload = (b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 65536]), body[i:i + 65536])
                        for i in range(0, len(body), 65536)) + b"0\r\n\r\n") if chunked else body
    with socket.create_connection((ip, 8000), timeout=20) as conn:
        try:
            conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                         + API_KEY.encode() + b"\r\nContent-Type: application/json\r\n" + framing
                         + b"Connection: close\r\n\r\n" + payload)
        except OSError:
            pass  # answered and closed before the body was all sent
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, _, rest = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), rest


def _registry_digest(registry: str, repository: str, tag: str) -> str:
    accept = ", ".join(["application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
                        "application/vnd.docker.distribution.manifest.list.v2+json",
                        "application/vnd.docker.distribution.manifest.v2+json"])
    r = SESSION.head(f"http://{registry}/v2/{repository}/manifests/{tag}", headers={"Accept": accept}, timeout=10)
    r.raise_for_status()
    return str(r.headers["Docker-Content-Digest"])


def test_the_router_runs_as_a_real_pod_from_its_image_and_serves_the_played_engines(
        operator: Path, stager: Any, pod_runner: PodRunner, namespace: str, registry: str) -> None:
    """The operator renders the router with the image it always names (ghcr.io/...; the node's
    containerd gets it from the loopback registry, which stands in for ghcr.io) and the placement
    of spec.router; the real kubelet runs it and turns it Ready by its own readinessProbe; its
    discovery watches the engines through the API server's Service address with its own token and
    reaches them on the host's loopback (e2e/cluster/cni/kimik3-host-loopback). Requests to the pod,
    and to its Service through the node's Service rules, go prefill then decode."""
    pod_runner.play(namespace)
    kubectl("-n", namespace, "create", "secret", "generic", "hf-token", "--from-literal=token=hf_e2e")
    kubectl("-n", namespace, "create", "secret", "generic", "clients", f"--from-literal=api-key={API_KEY}")
    body = _router_on_the_real_node(namespace)
    apply(body)
    try:
        wait_for("k3-real Ready", lambda: is_ready(get_json("k3", "k3-real", "-n", namespace)), timeout=240)
        (router,) = wait_for("one Ready router pod", lambda: [p for p in get_json(
            "pods", "-n", namespace, "-l", "app.kubernetes.io/component=router")["items"]
            if is_ready(p) and not p["metadata"].get("deletionTimestamp")] or None, timeout=120)
        assert router["spec"]["nodeName"] == os.environ["KIMIK3_REAL_NODE"]
        assert not pod_runner.running(namespace, "router"), "the pod runner played a pod the real kubelet runs"
        repository, _, tag = images.ROUTER_IMAGE.partition("/")[2].rpartition(":")
        statuses = router["status"]["containerStatuses"]
        assert sorted(c["name"] for c in statuses) == ["front", "router"]
        for status in statuses:
            assert status["imageID"].endswith(_registry_digest(registry, repository, tag)), status["imageID"]
            assert status["restartCount"] == 0, status

        service_ip = get_json("service", "k3-real-router", "-n", namespace)["spec"]["clusterIP"]
        answers = []
        for i, base in enumerate([f"http://{router['status']['podIP']}:8000"] * 3 + [f"http://{service_ip}:8000"] * 3):
            body_i: dict[str, Any] = {"model": "kimi-k3", "max_tokens": 16, "stream": i % 2 == 1,
                                      "messages": [{"role": "user", "content": prompt(256, f"real{i}-")}]}
            answers.append(post(base, "/v1/chat/completions", body_i, timeout=60,
                                headers={"Authorization": f"Bearer {API_KEY}"}))
        failed = [a for a in answers if a.status != 200 or not a.done or a.error]
        assert not failed, failed

        # The front door, on the real pod: the key is asked; no admin route is reachable, by any
        # spelling, even with the key; the router itself listens on the pod's loopback only.
        ip = router["status"]["podIP"]
        assert post(f"http://{ip}:8000", "/v1/chat/completions", body_i, timeout=30).status == 401
        refused = {line.decode(): _raw(ip, 8000, line) for line in HOSTILE}
        assert all(code in (400, 404) for code in refused.values()), refused
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((ip, 8001), timeout=5).close()
        after = post(f"http://{ip}:8000", "/v1/chat/completions", {**body_i, "stream": False}, timeout=60,
                     headers={"Authorization": f"Bearer {API_KEY}"})
        assert after.status == 200, after  # the engines are all still there
        # One body limit (spec.router.admission.maxRequestBytes): the front refuses a larger body
        # from its headers, in OpenAI's error shape; the router's own cap refuses a chunked one.
        status, told = _oversized(ip, chunked=False)
        assert status == 413 and json.loads(told)["error"]["code"] == 413, told[:300]
        status, told = _oversized(ip, chunked=True)
        assert status == 413 and json.loads(told)["error"]["code"] == 413, told[:300]
        metrics = SESSION.get(f"http://{ip}:29001/metrics", timeout=10).text
        assert 'haproxy_frontend_http_responses_total{proxy="front",code="4xx"}' in metrics
        REPORT.append(f"real node: front door refused {len(refused)}/{len(HOSTILE)} admin and path-trick requests "
                      f"({sorted(set(refused.values()))}), a request without the key (401); router port 8001 closed; "
                      f"1.5 MB over the {BODY_LIMIT} body limit: 413 from the front (Content-Length) and from the "
                      "router (chunked)")
        prefill, decode = pod_runner.running(namespace, "prefill"), pod_runner.running(namespace, "decode")
        paths = [r["path"] for engine in prefill + decode for r in stats(engine)["by_request_id"].values()]
        assert paths.count("prefill_for_remote_decode") >= len(answers), paths
        assert paths.count("remote_prefill") >= len(answers), paths
        REPORT.append(f"real node: router pod {router['metadata']['name']} served {len(answers)}/{len(answers)} "
                      f"requests (3 to its pod IP, 3 to its Service), prefill then decode")
        # PrecisePrefix: the router pod follows every prefill rank's KV events at the address the
        # leader's /kv_event_sources names (tcp://*:0 resolved to the played pod's IP), and routes
        # each prefill leg by the token ids an engine's /tokenize gave it. A prompt of a few blocks
        # (the engine stores only whole blocks: 1,536 tokens here), sent twice: the second time to
        # the rank whose cache holds it.
        long = {"model": "kimi-k3", "max_tokens": 4, "messages": [{"role": "user", "content": prompt(4000, "kv-")}]}
        for _ in range(2):
            again = post(f"http://{ip}:8000", "/v1/chat/completions", long, timeout=60,
                         headers={"Authorization": f"Bearer {API_KEY}"})
            assert again.status == 200 and again.done, again
            time.sleep(1)  # the first prompt's KV events reach the router
        router_metrics = lambda: {(s.name, tuple(sorted(s.labels.items()))): s.value  # noqa: E731
                                  for f in text_string_to_metric_families(
                                      SESSION.get(f"http://{ip}:29000/metrics", timeout=10).text) for s in f.samples}
        try:
            blocks = wait_for("the router's KV index of the prefills", lambda: sum(
                v for (name, labels), v in router_metrics().items()
                if name == "kimik3_router_kv_index_blocks" and ("role", "prefill") in labels) or None, timeout=30)
        except AssertionError as missing:
            log = kubectl("-n", namespace, "logs", router["metadata"]["name"], "-c", "router", check=False).stdout
            raise AssertionError(f"{missing}\nthe router's log:\n{log[-4000:]}") from None
        seen = router_metrics()
        sources = {dict(labels)["source"]: v for (name, labels), v in seen.items()
                   if name == "kimik3_router_token_ids_total"}
        decisions = sum(v for (name, labels), v in seen.items()
                        if name == "kimik3_router_prefix_routing_decisions_total" and ("role", "prefill") in labels)
        hit = sum(v for (name, labels), v in seen.items()
                  if name == "kimik3_router_prefix_hit_tokens_total" and ("role", "prefill") in labels)
        assert sources.get("tokenize", 0) >= 1 and decisions >= len(answers), (sources, decisions)
        assert hit > 0, "the long prompt's second send was not routed to the rank holding it"
        REPORT.append(f"real node: PrecisePrefix router followed {blocks:.0f} prefill KV blocks over ZMQ; a repeated "
                      f"prompt routed to a {hit:.0f}-token hit; token ids {dict(sources)}")
    finally:
        delete_deployments(namespace, timeout=180)


def test_service_addresses_lead_to_their_endpoints_or_nowhere_at_once(chart: str) -> None:
    """The node's Service rules, from the host: the `kubernetes` Service reaches the API server on
    loopback; an address of the Service range that no rule takes is refused at once, not routed
    off the machine (e2e/cluster/node.sh's guard)."""
    ip = get_json("service", "kubernetes", "-n", "default")["spec"]["clusterIP"]
    socket.create_connection((ip, 443), timeout=5).close()
    unbacked = ".".join(ip.split(".")[:2] + ["255", "254"])
    started = time.monotonic()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((unbacked, 80), timeout=5)
    assert time.monotonic() - started < 1.0
