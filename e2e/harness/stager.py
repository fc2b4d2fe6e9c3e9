"""The kubelet's part for staging Jobs, which kwok cannot play: run each staging pod's real command.

kwok runs no containers. For every Running staging pod, this runs the pod's own command
(`python -m kimik3_operator.stager stage ...`, as rendered, `$(VAR)` references expanded as the
kubelet does: tests/support/kubelet.py) on the host with the environment the kubelet would give it:
secrets resolved, the pod's ServiceAccount token (a TokenRequest) with the API server on loopback,
so its progress patches go through the real RBAC the operator rendered.
The network the pod would see is faked on loopback only: a fake Hub and a fake S3 stand in for the
internet, and each claim is a host folder (so a re-run finds the files). When the command exits,
its exit code and termination message go onto the pod as annotations, which the project's kwok
stage (e2e/cluster/kwok/pod-complete.yaml) turns into the container status a kubelet reports.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kimik3_operator.contract.stager import STAGER_MODULE
from tests.stager.fake_hub import FakeHub
from tests.stager.fake_s3 import FakeS3
from tests.support.kubelet import argv, container_env

from .kube import LIST_ERRORS, api_list, host_daemon, kubectl_until_ok

SELECTOR = "app.kubernetes.io/component=weights,app.kubernetes.io/managed-by=kimik3-operator"
EXIT_CODE = "kwok.kimik3.dev/exit-code"
MESSAGE = "kwok.kimik3.dev/termination-message"
CACHE_MOUNT = "/cache"
TERMINATION_LOG = "/dev/termination-log"
HUB_REPOS = {
    "moonshotai/Kimi-K3": {"config.json": b'{"model_type": "kimi_k3"}',
                           "model-00001-of-00002.safetensors": os.urandom(48_000),
                           "model-00002-of-00002.safetensors": os.urandom(32_000)},
    "moonshotai/Kimi-K3-DSpark": {"config.json": b'{"architectures": ["K3DSparkModel"]}',
                                  "model.safetensors": os.urandom(16_000)},
}
S3_OBJECTS = {("models", "kimi-k3/config.json"): b'{"model_type": "kimi_k3"}',
              ("models", "kimi-k3/model-00001-of-00001.safetensors"): os.urandom(40_000)}


@dataclass
class Run:
    namespace: str
    pod: str
    job: str
    exit_code: int
    stderr: str
    message: str


@dataclass
class Stager:
    root: Path
    hub: FakeHub = field(default_factory=FakeHub)
    s3: FakeS3 = field(default_factory=FakeS3)
    runs: list[Run] = field(default_factory=list)
    held: set[str] = field(default_factory=set)
    """Namespaces whose staging pods are left running (a test that wants to see them mid-way)."""
    _done: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Stager:
        self.commits = {repo: self.hub.add_repo(repo, files) for repo, files in HUB_REPOS.items()}
        for (bucket, key), data in S3_OBJECTS.items():
            self.s3.put(bucket, key, data)
        self.hub.start()
        self.s3.start()
        self._ca = self.root / "ca.crt"
        kubeconfig = yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text())
        cluster = kubeconfig["clusters"][0]["cluster"]
        self.server = cluster["server"]
        if "certificate-authority-data" in cluster:
            self._ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        else:
            self._ca.write_bytes(Path(cluster["certificate-authority"]).read_bytes())
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="staging-pod")
        self._providing = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="stager", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.hub.stop()
        self.s3.stop()

    def runs_in(self, namespace: str) -> list[Run]:
        return [r for r in list(self.runs) if r.namespace == namespace]

    # ---------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            try:
                pods = api_list("/api/v1/pods", labelSelector=SELECTOR)
            except LIST_ERRORS:
                continue
            for pod in pods:
                meta = pod["metadata"]
                key = f"{meta['namespace']}/{meta['name']}/{meta['uid']}"
                if (key in self._done or meta["namespace"] in self.held or meta.get("deletionTimestamp")
                        or (pod.get("status") or {}).get("phase") != "Running"
                        or EXIT_CODE in (meta.get("annotations") or {})):
                    continue
                self._done.add(key)
                # Like a kubelet, pods run side by side (a fuzzed sample stages dozens of checkpoints).
                self._pool.submit(self._run_safely, pod)

    def _run_safely(self, pod: dict[str, Any]) -> None:
        try:
            self._run(pod)
        except Exception as exc:  # noqa: BLE001 - a broken run must show in the test, not kill the loop
            meta = pod["metadata"]
            self.runs.append(Run(meta["namespace"], meta["name"], "", -1, repr(exc), ""))
            print(f"stager: {meta['namespace']}/{meta['name']} left Running: {exc!r}", file=sys.stderr, flush=True)

    def _env(self, pod: dict[str, Any], container: dict[str, Any], workdir: Path) -> dict[str, str]:
        ns = pod["metadata"]["namespace"]
        names = {s["secretRef"]["name"] for s in container.get("envFrom") or []} | {
            v["valueFrom"]["secretKeyRef"]["name"] for v in container.get("env") or []
            if "secretKeyRef" in (v.get("valueFrom") or {})}
        env = {"PATH": os.environ["PATH"], "HOME": str(workdir), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        env.update(container_env(container, secrets={n: self._secret(ns, n) for n in names},
                                 fields={"metadata.namespace": ns}))
        # The internet this pod would reach, on loopback.
        env["HF_ENDPOINT"] = self.hub.endpoint
        env["AWS_ENDPOINT_URL_S3"] = self.s3.endpoint  # what the Job gets for an S3 endpoint
        env.update({k: v for k, v in self.s3.env().items() if k not in env or not env[k]})
        # In-cluster API access as the pod's ServiceAccount.
        sa_dir = workdir / "serviceaccount"
        sa_dir.mkdir(parents=True, exist_ok=True)
        account = pod["spec"]["serviceAccountName"]
        token = kubectl_until_ok("-n", ns, "create", "token", account, "--duration=10m").stdout
        (sa_dir / "token").write_text(token.strip())
        (sa_dir / "namespace").write_text(ns)
        (sa_dir / "ca.crt").write_bytes(self._ca.read_bytes())
        host, _, port = self.server.removeprefix("https://").rpartition(":")
        env.update(KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT=port, KIMIK3_SERVICEACCOUNT_DIR=str(sa_dir),
                   NO_PROXY="127.0.0.1,127.0.0.2,localhost")
        return env

    def _secret(self, namespace: str, name: str) -> dict[str, str]:
        secret = json.loads(kubectl_until_ok("-n", namespace, "get", "secret", name, "-o", "json").stdout)
        return {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}

    def _provide(self, uri: str, volume: Path) -> None:
        """Make the checkpoint `uri` names exist in this fake world (the stager's own failure modes
        are tested in tests/stager; here every referenced checkpoint is there)."""
        scheme, _, rest = uri.partition("://")
        if scheme == "hf" and rest not in self.hub.repos:
            self.commits[rest] = self.hub.add_repo(rest, HUB_REPOS["moonshotai/Kimi-K3"])
        elif scheme == "s3":
            bucket, _, prefix = rest.partition("/")
            if not any(key.startswith(prefix) for key in self.s3.buckets.get(bucket, {})):
                for (_, key), data in S3_OBJECTS.items():
                    self.s3.put(bucket, f"{prefix.strip('/')}/{key.rsplit('/', 1)[-1]}".lstrip("/"), data)
        elif scheme == "pvc":
            folder = volume / rest.partition("/")[2]
            if not folder.exists():
                folder.mkdir(parents=True)
                (folder / "config.json").write_text('{"model_type": "kimi_k3"}')
                (folder / "model.safetensors").write_bytes(b"\1" * 4096)

    def _run(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        ns = meta["namespace"]
        (container,) = pod["spec"]["containers"]
        claim = next(v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]
                     if "persistentVolumeClaim" in v)
        workdir = self.root / "pods" / ns / meta["name"]
        workdir.mkdir(parents=True, exist_ok=True)
        volume = self.root / "claims" / ns / claim
        volume.mkdir(parents=True, exist_ok=True)
        env = self._env(pod, container, workdir)
        command = argv(container, env)
        with self._providing:  # runs share the fake Hub and S3: a checkpoint is added once
            self._provide(command[command.index("--uri") + 1], volume)
        termination_log = workdir / "termination-log"
        args = []
        for arg in command:
            if arg.startswith(CACHE_MOUNT + "/") or arg == CACHE_MOUNT:
                arg = str(volume) + arg[len(CACHE_MOUNT):]
            args.append(str(termination_log) if arg == TERMINATION_LOG else arg)
        assert args[:3] == ["python", "-m", STAGER_MODULE], args
        result = subprocess.run([sys.executable, *args[1:]], env=env,
                                capture_output=True, text=True, timeout=180)
        message = termination_log.read_text()[-4096:] if termination_log.exists() else ""
        if result.returncode and not message:
            message = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ""
        self.runs.append(Run(ns, meta["name"], meta["labels"].get("batch.kubernetes.io/job-name", ""),
                             result.returncode, result.stderr, message))
        kubectl_until_ok("-n", ns, "annotate", "pod", meta["name"], "--overwrite",
                         f"{EXIT_CODE}={result.returncode}", f"{MESSAGE}={message}")


def main() -> None:
    """`python -m e2e.harness.stager DIR [PIDFILE]`: keep staging until SIGTERM (scripts/demo.sh)."""
    root, stop = host_daemon()
    stager = Stager(root).start()
    print(f"staging pods' commands run here; fake Hub {stager.hub.endpoint}, fake S3 {stager.s3.endpoint}", flush=True)
    shown = 0
    while not stop.wait(1):
        for run in stager.runs[shown:]:
            print(f"{run.namespace}/{run.pod}: exit {run.exit_code} {run.message[:200]}", flush=True)
            shown += 1
    stager.stop()


if __name__ == "__main__":
    main()
