"""The kubelet's part for serving and router pods, which kwok cannot play: run each pod's own command.

kwok marks pods Running and runs nothing. For every Running leader pod of a serving role this starts
the Kimi K3 engine simulator (`python -m kimik3_simulator`) with the pod's rendered command
and the environment the kubelet would give it (`$(VAR)` references expanded, the pod IP from its
status); for every Running router pod it starts the real router its image names with the pod's
rendered args: kimik3-router (built from router/ by scripts/router-build.sh; its ServiceAccount's
token and CA in a folder it is pointed at, the API server's address in KUBERNETES_SERVICE_HOST/PORT,
as a kubelet provides them) or vllm-router (from its image's hash-locked requirements,
scripts/router-venv.sh), and its front: Debian's HAProxy, the router image's, on the pod's rendered
configuration (e2e/harness/front_play.py).

Pod IPs are loopback addresses here (the cluster's KIMIK3_POD_CIDR), so each process listens on its
own pod IP at the rendered ports, as it would in its pod's network namespace: the one rewrite is the
rendered listen addresses, since played pods share the host's network namespace (0.0.0.0 and the
pod-local 127.0.0.1 in a pod both mean "my pod IP" here). Nothing else of a command
changes, and no URL is rewritten: the routers find the engines through the API server, as their
Kubernetes discovery does in a cluster, with a token of the pod's own ServiceAccount (what the
kubelet would mount), and reach them at their pod IPs.

It is their kubelet in two more ways. A pod played here (the serving leaders and routers of a
namespace labelled by `play`, marked at admission: e2e/cluster/played-pods.yaml) turns Ready only
when its process answers the pod's own readinessProbe, and unready after its failureThreshold misses
(`_probe_all`); an engine first takes the operator's predicted cold start for it, compressed
(KIMIK3_COLD_START_SECONDS, KIMIK3_COLD_START_TIME_SCALE). Pods of other namespaces
stay kwok's (no process, Ready after KIMIK3_POD_READY_DELAY_MS).

A process that exits is restarted as the kubelet restarts a container (e2e/harness/restarts.py): at
once, then after a back-off that doubles from 10 s to 300 s, reported with restartCount, the
CrashLoopBackOff wait and lastState.terminated (exit code, and OOMKilled when the kernel killed it in
its memory cgroup); LWS then recreates a serving group whose pod restarted.

Headless workers (worker index > 0) serve nothing over HTTP and are not started. A process whose pod
is deleted (or replaced: another uid) is stopped the kubelet's way (`_leave`): preStop pause, SIGTERM,
SIGKILL at the grace period, and only then the pod object goes (a delete with grace 0, the kubelet's
last word). kwok removes a deleted pod at once; each pod played here is marked (PLAYED) so that
kwok's stage for it (e2e/cluster/kwok/pod-delete.yaml) waits for this runner, or for the pod's
deletionTimestamp, as a kubelet's backstop would. `pods.json` in the runner's folder maps each pod to
its address, for tests and for the demo.

Given the cluster's Prometheus file_sd folder (`cluster.sh env` prints it as
KIMIK3_PROMETHEUS_TARGETS), the runner also keeps one target file there, `pod-runner-<pid>.json`,
that lists every live engine process as Prometheus' Kubernetes discovery with a PodMonitor would
see its pod: target `<pod IP>:8000`, labels `namespace`, `pod`, the role's labels as the chart's
PodMonitor relabels them (contract.names.SERIES_LABELS: `kimik3_role`, ...), which the scalers'
queries select by, and every pod label as podTargetLabels would copy it, so the vLLM metrics reach
the SLO scaler, prometheus-adapter and KEDA per pod.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import yaml

from kimik3_operator.api.quantity import quantity
from kimik3_operator.contract.names import SERIES_LABELS
from kimik3_operator.planner.images import VLLM_ROUTER_IMAGE
from kimik3_operator.render.front import API_KEY_ENV, CONFIG_ENV, FRONT_PORT, ROUTER_LOOPBACK_PORT
from kimik3_operator.render.front import CONTAINER as FRONT
from kimik3_operator.render.front import METRICS_PORT as FRONT_METRICS_PORT
from tests.support import kubelet

from .front_play import relocate, start_front
from .kube import LIST_ERRORS, api_list, host_daemon, is_ready, kubectl, kubectl_until_ok
from .restarts import MemoryCgroup, Restarts

ROOT = Path(__file__).resolve().parents[2]
SELECTOR = "app.kubernetes.io/managed-by=kimik3-operator"
SERVING_ROLES = ("prefill", "decode", "aggregated")
ROUTER = "router"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
REVISION_LABEL = "leaderworkerset.sigs.k8s.io/template-revision-hash"
COMPAT_LABEL = "serving.kimik3.dev/compat-hash"
GPU_LABEL = "nvidia.com/gpu.product"
PLAYED = "kwok.kimik3.dev/played"
"""On each pod this runner plays, from its admission (e2e/cluster/played-pods.yaml): kwok then leaves
its readiness and its deletion to this runner, as to a kubelet."""
PROBE_SECONDS = 1.0
STOP_GRACE_SECONDS = 10.0
"""When the runner itself stops: how long each process played may drain before SIGKILL (all at
once, inside the 30 s scripts/demo.sh gives the runner)."""
PREDICTED = "predicted"
COLD_START_TIME_SCALE = "0.003"
"""A Kimi K3 replica's predicted quarter of an hour to half an hour (planner/cold_start.py) in 3 to 5 s:
as long as a test can wait at every rollout and scale-up, and long enough that an engine is seen
starting."""
NOT_IN_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
ENGINE_PORT = 8000
ROUTER_PORT = FRONT_PORT
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def target_label(key: str) -> str:
    """A pod label's key as a Prometheus label name, as Prometheus' Kubernetes discovery and
    prometheus-operator's podTargetLabels make it: `serving.kimik3.dev/role` -> `serving_kimik3_dev_role`."""
    return NOT_IN_LABEL_NAME.sub("_", key)


def scrape_labels(namespace: str, pod: str, pod_labels: dict[str, str]) -> dict[str, str]:
    """The labels of a pod's scrape target: every pod label (a key that cannot be a label name, with
    a leading digit, or that would be one of Prometheus' reserved `__` labels is left out: one bad
    name fails the whole file), the chart PodMonitor's relabelled ones, `namespace` and `pod`."""
    labels = {name: value for name, value in ((target_label(k), v) for k, v in sorted(pod_labels.items()))
              if LABEL_NAME.fullmatch(name) and not name.startswith("__")}
    relabelled = {series: pod_labels[key] for key, series in SERIES_LABELS.items() if key in pod_labels}
    return {**labels, **relabelled, "namespace": namespace, "pod": pod}


class KubeletView(TypedDict):
    pre_stop: float
    grace: float
    container: str
    probe: Probe | None
    statuses: list[dict[str, Any]]
    restarts: Restarts


def _kubelet_view(pod: dict[str, Any], container: dict[str, Any]) -> KubeletView:
    """What the kubelet keeps of a pod for its container: the preStop sleep and the grace period it
    honours, the readiness probe it runs, and the container statuses it reports."""
    sleep = ((container.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}
    return {"pre_stop": float(sleep.get("seconds") or 0),
            "grace": float(pod["spec"].get("terminationGracePeriodSeconds", 30)),
            "container": container["name"], "probe": Probe.of(pod, container),
            "statuses": (pod.get("status") or {}).get("containerStatuses") or [],
            "restarts": Restarts(container["name"])}


def router_binary() -> Path:
    """kimik3-router, built by scripts/router-build.sh (cargo, cached)."""
    out = subprocess.run([str(ROOT / "scripts" / "router-build.sh")], capture_output=True, text=True, check=True,
                         timeout=1200).stdout
    return Path(out.strip().splitlines()[-1])


def _service_account_token(pod: dict[str, Any]) -> tuple[str, str]:
    """The pod's ServiceAccount and a token of it (a TokenRequest, as a projected volume would hold)."""
    account = pod["spec"].get("serviceAccountName") or "default"
    token = kubectl_until_ok("create", "token", account, "-n", pod["metadata"]["namespace"], "--duration=2h")
    return account, token.stdout.strip()


def _admin_cluster_entry() -> dict[str, Any]:
    """The `clusters` entry (name and cluster) of the admin kubeconfig this runner talks to the API server with."""
    (cluster,) = yaml.safe_load(Path(os.environ["KUBECONFIG"]).read_text())["clusters"]
    return dict(cluster)


def _admin_cluster() -> dict[str, Any]:
    return dict(_admin_cluster_entry()["cluster"])


def _cluster_ca() -> bytes:
    cluster = _admin_cluster()
    if "certificate-authority-data" in cluster:
        return base64.b64decode(cluster["certificate-authority-data"])
    return Path(cluster["certificate-authority"]).read_bytes()


def _api_server_env() -> dict[str, str]:
    """KUBERNETES_SERVICE_HOST and _PORT as the kubelet sets them, for the API server this runner uses."""
    address = urllib.parse.urlsplit(_admin_cluster()["server"])
    return {"KUBERNETES_SERVICE_HOST": str(address.hostname), "KUBERNETES_SERVICE_PORT": str(address.port or 443)}


def _repository(image: str) -> str:
    """An image reference's repository path without its registry, tag or digest: a release names the
    router images by digest in its own registry (the chart's routerImages), the tree by tag."""
    name = image.partition("@")[0]
    if ":" in name.rpartition("/")[2]:
        name = name.rpartition(":")[0]
    return name.partition("/")[2] if "/" in name else name


def router_venv() -> Path:
    out = subprocess.run([str(ROOT / "scripts" / "router-venv.sh")], capture_output=True, text=True, check=True,
                         timeout=900).stdout
    return Path(out.strip().splitlines()[-1])


@dataclass
class Probe:
    """A container's httpGet readinessProbe and its run of results."""
    path: str
    port: int
    failure_threshold: int = 3
    success_threshold: int = 1
    timeout: float = 1.0
    ready: bool = False
    """What the pod's status says now (taken from the pod when its process starts)."""
    run: int = 0
    """Results in a row that disagree with `ready`."""

    def observe(self, ok: bool) -> bool | None:
        """The pod's new readiness if this result changes it, else None; `settle` once the pod's
        status says so (a status write that failed is tried again at the next result)."""
        self.run = 0 if ok == self.ready else self.run + 1
        return ok if self.run >= (self.success_threshold if ok else self.failure_threshold) else None

    def settle(self, ready: bool) -> None:
        self.ready, self.run = ready, 0

    @classmethod
    def of(cls, pod: dict[str, Any], container: dict[str, Any]) -> Probe | None:
        probe = container.get("readinessProbe") or {}
        if not (get := probe.get("httpGet")):
            return None
        port = get.get("port")
        if isinstance(port, str):
            port = next((p["containerPort"] for p in container.get("ports") or [] if p.get("name") == port), None)
        if port is None:
            return None
        return cls(get.get("path") or "/", int(port), int(probe.get("failureThreshold", 3)),
                   int(probe.get("successThreshold", 1)), float(probe.get("timeoutSeconds", 1)), is_ready(pod))


Respawn = Callable[[], "subprocess.Popen[bytes]"]


@dataclass
class Proc:
    namespace: str
    pod: str
    uid: str
    kind: str  # prefill | decode | aggregated | router
    ip: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    compat: str = ""
    metrics_port: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    """The pod's labels."""
    pre_stop: float = 0.0
    """The container's preStop sleep, seconds."""
    grace: float = 30.0
    """The pod's terminationGracePeriodSeconds."""
    container: str = ""
    """The container's name."""
    statuses: list[dict[str, Any]] = field(default_factory=list)
    """The pod's containerStatuses when its process started (kwok's): a status write sends them
    whole (the list is atomic), with `ready` set."""
    probe: Probe | None = None
    """Its container's readinessProbe (`PodRunner._probe_all`)."""
    deleted: bool = False
    """Its pod was deleted (not merely left unplayed): the object goes once the process has exited."""
    started: float = field(default_factory=time.monotonic)
    """When its process was started (time.monotonic)."""
    cut: threading.Event = field(default_factory=threading.Event)
    """Set when its address is handed to a new pod (below): its preStop pause ends at once."""
    front: subprocess.Popen[bytes] | None = None
    """A router pod's front (HAProxy, e2e/harness/front_play.py), in front of `proc`, the router."""
    respawn: Respawn | None = None
    """Starts its process again, as it was started (a kubelet's restart of the container)."""
    restarts: Restarts = field(default_factory=lambda: Restarts(""))
    """Its container's restarts, back-off and last exit (restarts.py)."""
    cgroup: MemoryCgroup = field(default_factory=lambda: MemoryCgroup(None))

    def container_statuses(self, ready: bool) -> list[dict[str, Any]]:
        """The pod's containerStatuses as its kubelet reports them now: its container's with `ready`,
        its restarts and its last exit; the others as they were."""
        mine = next((c for c in self.statuses if c.get("name") == self.container), None)
        # A container with no readinessProbe is ready while it runs: a router pod's front, played
        # beside the router (`kubectl get pods` then shows 2/2 once the router is ready too).
        front_runs = self.front is not None and self.front.poll() is None
        others = [{**c, "ready": front_runs, "started": front_runs}
                  if c.get("name") == FRONT and self.front is not None else c
                  for c in self.statuses if c.get("name") != self.container]
        return [*others, self.restarts.status(mine, ready, self.pod, self.namespace, self.uid)]

    @property
    def url(self) -> str:
        return f"http://{self.ip}:{self.port}"

    @property
    def admin_url(self) -> str:
        """A router's own listener, behind its front: the pod's loopback in a pod, its IP here."""
        return f"http://{self.ip}:{ROUTER_LOOPBACK_PORT}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@dataclass
class PodRunner:
    root: Path
    time_scale: float = 1.0
    router_health_seconds: int = 1
    procs: dict[str, Proc] = field(default_factory=dict)
    """By pod uid."""
    leaving: list[Proc] = field(default_factory=list)
    """Processes of deleted pods still in their preStop pause or drain."""
    problems: list[str] = field(default_factory=list)
    cold_start: str = field(default_factory=lambda: os.environ.get("KIMIK3_COLD_START_SECONDS", PREDICTED))
    """Seconds each engine takes to load before its /health answers (the simulator's
    K3SIM_STARTUP_SECONDS): its pod turns Ready only then (readiness probe, `_probe_all`). By
    default `predicted`: the planner's cold start for the pod's command line, GPU and the
    deployment's spec.model.readThroughput (planner/cold_start.py), so that a rollout or a scale-up
    takes the time the operator predicts for it, compressed by `cold_start_scale`."""
    cold_start_scale: float = field(default_factory=lambda: float(os.environ.get("KIMIK3_COLD_START_TIME_SCALE",
                                                                                 COLD_START_TIME_SCALE)))
    """Wall seconds per predicted second of start-up (K3SIM_STARTUP_TIME_SCALE)."""
    targets: Path | None = None
    """The cluster's Prometheus file_sd folder, where this runner lists its live engines; None, or a
    folder that does not exist (no cluster), lists none."""
    _targets_written: str | None = None
    _removing: set[str] = field(default_factory=set)
    """Uids of deleted pods without a process, whose object this runner has removed."""
    doomed: set[tuple[str, str, str]] = field(default_factory=set)
    """(namespace, pod name, LWS template revision) of engines that exit at every start (`doom`)."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> PodRunner:
        self.root.mkdir(parents=True, exist_ok=True)
        self.vllm_router_bin = router_venv() / "bin" / "vllm-router"
        self.router_bin = router_binary()
        self._thread = threading.Thread(target=self._loop, name="pod-runner", daemon=True)
        self._thread.start()
        self._prober = threading.Thread(target=self._probe_all, name="pod-runner-probes", daemon=True)
        self._prober.start()
        return self

    def stop(self) -> None:
        """Every process played ends with the runner, those in their preStop pause included (a
        process left behind would hold its pod IP's port, and the next cluster to hand that address
        out would route to it): all of them at once, SIGKILL after STOP_GRACE_SECONDS."""
        self._stop.set()
        self._thread.join(30)
        with self._lock:
            procs = [*self.procs.values(), *self.leaving]
            stoppers = [threading.Thread(target=self._terminate, args=(proc, STOP_GRACE_SECONDS), daemon=True)
                        for proc in procs]
            for thread in stoppers:
                thread.start()
            for thread in stoppers:
                thread.join(STOP_GRACE_SECONDS + 20)
            self.procs.clear()
            self._write_map()
            if self.targets is not None:
                self._targets_file.unlink(missing_ok=True)
        # What a kubelet would still finish: every deleted pod played here goes now (no process is
        # left), not at kwok's backstop minutes later with its fake GPUs held.
        try:
            pods = _managed_pods()
        except (subprocess.SubprocessError, ValueError):
            pods = []
        for pod in pods:
            meta = pod["metadata"]
            if meta.get("deletionTimestamp") and _played(pod):
                _remove(meta["namespace"], meta["name"], meta["uid"])

    # -- what tests use -------------------------------------------------------------------------

    def running(self, namespace: str, kind: str | None = None) -> list[Proc]:
        with self._lock:
            return sorted((p for p in self.procs.values() if p.namespace == namespace and p.alive()
                           and (kind is None or p.kind == kind)), key=lambda p: p.pod)

    @staticmethod
    def play(namespace: str) -> None:
        """Play the serving and router pods `namespace` creates from now on: the label makes the
        cluster's admission policy mark them (e2e/cluster/played-pods.yaml), and marked pods are
        this runner's. Namespaces nobody plays keep kwok's pods (no process, Ready after a delay),
        so the machine's two cores are not spent on tests that send no traffic."""
        kubectl("label", "namespace", namespace, f"{PLAYED}=true", "--overwrite")

    def by_ip(self, ip: str) -> Proc | None:
        with self._lock:
            return next((p for p in self.procs.values() if p.ip == ip and p.kind != ROUTER and p.alive()), None)

    def doom(self, proc: Proc) -> None:
        """A group that crash-loops on its template: from now on every start of `proc`'s pod name on
        its LWS template revision exits at once (the simulator's exit_at_start fault), restarts and
        LWS's recreations of the group included, as an engine does that a node or a template breaks;
        the group on another revision (a rollout's) starts as usual. Then `proc` is killed."""
        self.doomed.add((proc.namespace, proc.pod, proc.labels.get(REVISION_LABEL, "")))
        self.kill(proc)

    def freeze(self, proc: Proc) -> None:
        """An engine that hangs whole (SIGSTOP): its container still runs, so no restart, but its
        readiness probe times out and the pod turns unready; SIGTERM waits until SIGKILL at the grace
        period, as a kubelet's would for a process stuck in the kernel or the driver."""
        proc.proc.send_signal(signal.SIGSTOP)

    def kill(self, proc: Proc, sig: signal.Signals = signal.SIGKILL) -> None:
        """A crashed container: its peers see it go, and the runner then reports the exit and restarts it
        as its kubelet would (`_mind_exits`); the pod object stays (LWS recreates a serving group)."""
        proc.proc.send_signal(sig)
        proc.proc.wait(10)

    # -- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            try:
                pods = _managed_pods()
                nodes = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in api_list("/api/v1/nodes")}
            except LIST_ERRORS:
                continue
            try:
                self._sync(pods, nodes)
                self._mind_exits()
            except Exception as exc:  # noqa: BLE001 - a broken start must show in a test, not end the loop
                self.problems.append(repr(exc))

    def _mind_exits(self) -> None:
        """The kubelet's part when a container exits (restarts.py): report the exit, then start it
        again after its back-off, and report that. The pod object stays; LWS recreates a serving
        group once its restartCount rises."""
        with self._lock:
            procs = list(self.procs.values())
        for proc in procs:
            r = proc.restarts
            if r.restart_at is None and not proc.alive():
                r.crashed(proc.proc.returncode, proc.cgroup.oom_killed(), time.monotonic(), time.time())
                if proc.probe is not None:
                    proc.probe.settle(False)
                if not _set_ready(proc, False):
                    self.problems.append(f"reporting the exit of {proc.namespace}/{proc.pod} failed")
            elif r.restart_at is not None and time.monotonic() >= r.restart_at and proc.respawn is not None:
                with self._lock:
                    if self.procs.get(proc.uid) is not proc:
                        continue  # deleted meanwhile: nothing to restart
                    proc.proc = proc.respawn()
                    r.restarted(time.time())
                    proc.started = time.monotonic()
                _set_ready(proc, False)

    def _sync(self, pods: list[dict[str, Any]], nodes: dict[str, dict[str, str]]) -> None:
        wanted: dict[str, dict[str, Any]] = {}
        for pod in pods:
            meta, status = pod["metadata"], pod.get("status") or {}
            labels = meta.get("labels") or {}
            kind = labels.get("app.kubernetes.io/component", "")
            if meta.get("deletionTimestamp") or status.get("phase") != "Running" or not status.get("podIP"):
                continue
            if not _played(pod):
                continue
            if kind in SERVING_ROLES and labels.get(WORKER_INDEX) == "0" or kind == ROUTER:
                wanted[meta["uid"]] = pod
        with self._lock:
            present = {pod["metadata"]["uid"]: pod for pod in pods}
            for uid in [u for u in self.procs if u not in wanted]:
                meta = present[uid]["metadata"] if uid in present else {}
                proc = self.procs.pop(uid)
                if meta.get("deletionGracePeriodSeconds") is not None:
                    # A delete that set its own grace period (kubectl delete --grace-period, the
                    # operator's restart of a failing group): the kubelet honours it over the spec's.
                    proc.grace = min(proc.grace, float(meta["deletionGracePeriodSeconds"]))
                self._leave(proc, deleted=uid not in present or bool(meta.get("deletionTimestamp")))
            leaving = {p.uid for p in self.leaving}
            for uid, pod in present.items():
                meta = pod["metadata"]
                if meta.get("deletionTimestamp") and _played(pod) and uid not in leaving and uid not in self._removing:
                    # Deleted before its process ran (or after it was gone): nothing to wait for.
                    self._removing.add(uid)
                    threading.Thread(target=self._remove_now, args=(meta["namespace"], meta["name"], uid),
                                     daemon=True).start()
            for uid, pod in sorted(wanted.items(), key=lambda kv: kv[1]["metadata"]["labels"].get(
                    "app.kubernetes.io/component") == ROUTER):
                if uid in self.procs:
                    continue
                holders = [p for p in self.leaving if p.ip == pod["status"]["podIP"] and p.alive()]
                if holders:  # the address is still held by a pod on its way out (see _leave)
                    for holder in holders:
                        holder.cut.set()
                    continue
                kind = pod["metadata"]["labels"]["app.kubernetes.io/component"]
                started = (self._start_router(pod) if kind == ROUTER
                           else self._start_engine(pod, nodes.get(pod["spec"].get("nodeName", ""), {})))
                if started is not None:
                    self.procs[uid] = started
            self._write_map()

    def _env(self, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
        """The container's env as the kubelet resolves it (values and field refs; this project's
        serving pods reference no Secrets)."""
        fields = {"status.podIP": pod["status"]["podIP"], "metadata.name": pod["metadata"]["name"],
                  "metadata.namespace": pod["metadata"]["namespace"], "spec.nodeName": pod["spec"].get("nodeName", "")}
        return kubelet.container_env(container, fields=fields)

    def _spawn(self, name: str, argv: list[str], env: dict[str, str],
               cgroup: MemoryCgroup | None = None) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.root / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=self.root, start_new_session=True)
        if cgroup is not None:
            cgroup.add(proc.pid)
        return proc, log

    def _restartable(self, name: str, argv: list[str], env: Callable[[], dict[str, str]],
                     cgroup: MemoryCgroup) -> tuple[subprocess.Popen[bytes], Path, Respawn]:
        """A started process, and how to start it again the same way (`env` as it is at each start)."""
        proc, log = self._spawn(name, argv, env(), cgroup)
        return proc, log, lambda: self._spawn(name, argv, env(), cgroup)[0]

    def _bindable(self, pod: dict[str, Any]) -> str | None:
        """The pod's IP when this machine can listen on it for the pod (a loopback address, see the
        module docstring), else None with a problem recorded: never listen on, or send to, any
        other address."""
        ip = pod["status"]["podIP"]
        if ipaddress.ip_address(ip) in LOOPBACK:
            return str(ip)
        self.problems.append(f"pod {pod['metadata']['namespace']}/{pod['metadata']['name']} has IP {ip}, outside "
                             "127.0.0.0/8: the cluster's kwok must hand out loopback pod IPs (KIMIK3_POD_CIDR)")
        return None

    def _start_engine(self, pod: dict[str, Any], node_labels: dict[str, str]) -> Proc | None:
        meta = pod["metadata"]
        if (ip := self._bindable(pod)) is None:
            return None
        container = next(c for c in pod["spec"]["containers"] if c.get("command"))
        env = self._env(pod, container)
        argv = kubelet.argv(container, env)
        sim_env = {
            "PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "HOME": str(self.root),
            **env,
            "K3SIM_GPU_PRODUCT": node_labels.get(GPU_LABEL, ""),
            "K3SIM_ROLE": meta["labels"]["app.kubernetes.io/component"],
            "K3SIM_TIME_SCALE": str(self.time_scale),
            "K3SIM_STARTUP_SECONDS": self.cold_start,
            "K3SIM_STARTUP_TIME_SCALE": str(self.cold_start_scale),
            **_read_throughput(meta["namespace"], meta["labels"].get("app.kubernetes.io/instance", "")),
            "K3SIM_COMPAT_EXTRA": meta["labels"].get(COMPAT_LABEL, ""),
            # The chaos tests arm hangs and stalls at run time (POST /sim/fault, loopback peers only;
            # docs/simulator-faults.md §3). The operator never renders it.
            "K3SIM_FAULT_ADMIN": "1",
        }
        doom = (meta["namespace"], meta["name"], meta["labels"].get(REVISION_LABEL, ""))

        def start_env() -> dict[str, str]:
            return {**sim_env, "K3SIM_FAULTS": "exit_at_start"} if doom in self.doomed else sim_env
        cgroup = MemoryCgroup.make(meta["uid"], _memory_limit(container))
        # The rendered listen address is the pod's wildcard; appended flags win (argparse keeps the last).
        proc, log, respawn = self._restartable(f"{meta['namespace']}.{meta['name']}.{meta['uid'][:8]}",
                                               [sys.executable, "-m", "kimik3_simulator", *argv, "--host", ip],
                                               start_env, cgroup)
        return Proc(meta["namespace"], meta["name"], meta["uid"], meta["labels"]["app.kubernetes.io/component"],
                    ip, ENGINE_PORT, proc, log, compat=meta["labels"].get(COMPAT_LABEL, ""),
                    labels=dict(meta["labels"]), respawn=respawn, cgroup=cgroup, **_kubelet_view(pod, container))

    def _router_token_dir(self, pod: dict[str, Any]) -> Path:
        """What the kubelet mounts for the router's ServiceAccount (a projected volume): its token and
        the cluster's CA, in a folder of this pod's own."""
        meta = pod["metadata"]
        _, token = _service_account_token(pod)
        folder: Path = self.root / "tokens" / str(meta["uid"])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "token").write_text(token)
        (folder / "ca.crt").write_bytes(_cluster_ca())
        return folder

    def _router_kubeconfig(self, pod: dict[str, Any]) -> Path:
        """What the kubelet gives the router: its ServiceAccount's token (a TokenRequest, as a projected
        volume would hold), for the API server this runner talks to."""
        meta = pod["metadata"]
        account, token = _service_account_token(pod)
        cluster = _admin_cluster_entry()
        path = self.root / "tokens" / f"{meta['uid']}.kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "clusters": [cluster],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": "pod", "context": {"cluster": cluster["name"], "user": account,
                                                     "namespace": meta["namespace"]}}],
            "current-context": "pod"}))
        path.chmod(0o600)
        return path

    def _start_router(self, pod: dict[str, Any]) -> Proc | None:
        meta = pod["metadata"]
        if (ip := self._bindable(pod)) is None:
            return None
        containers = {c["name"]: c for c in pod["spec"]["containers"]}
        container, front = containers[ROUTER], containers.get(FRONT)
        pod_env = self._env(pod, container)
        args = [kubelet.expand(a, pod_env)
                for a in [*(container.get("command") or [])[1:], *(container.get("args") or [])]]
        # Played pods share the host's network namespace: the pod's wildcard and its loopback are its own IP.
        args = [ip if a in ("0.0.0.0", "127.0.0.1") else a for a in args]
        # The pod's RUST_LOG (render/router.py), unless the test run sets its own.
        env = {"PATH": os.environ["PATH"], "HOME": str(self.root), "NO_PROXY": "127.0.0.0/8,localhost",
               "RUST_LOG": os.environ.get("RUST_LOG") or pod_env.get("RUST_LOG", "info")}
        if _repository(container.get("image", "")) == _repository(VLLM_ROUTER_IMAGE):
            argv = [str(self.vllm_router_bin), *args,
                    # A dead engine must leave the lists within seconds in a test, not the pod's 15 s.
                    "--health-check-interval-secs", str(self.router_health_seconds)]
            env["KUBECONFIG"] = str(self._router_kubeconfig(pod))
        else:
            # kimik3-router reads its ServiceAccount's token and CA as in a pod (--kube-token-dir for
            # the mounted folder) and the API server's address from the kubelet's environment.
            argv = [str(self.router_bin), *args, "--kube-token-dir", str(self._router_token_dir(pod))]
            env.update(_api_server_env())
        name = f"{meta['namespace']}.{meta['name']}.{meta['uid'][:8]}"
        played = self._start_front(pod, front, ip, name) if front is not None else None
        cgroup = MemoryCgroup.make(meta["uid"], _memory_limit(container))
        proc, log, respawn = self._restartable(name, argv, lambda: env, cgroup)
        view = _kubelet_view(pod, container)
        if front is not None:
            view["probe"] = Probe.of(pod, front)  # the pod's readiness is its front's probe
        return Proc(meta["namespace"], meta["name"], meta["uid"], ROUTER, ip, ROUTER_PORT, proc, log,
                    metrics_port=29000, labels=dict(meta["labels"]), front=played, respawn=respawn, cgroup=cgroup,
                    **view)

    def _start_front(self, pod: dict[str, Any], container: dict[str, Any], ip: str,
                     name: str) -> subprocess.Popen[bytes]:
        env = {e["name"]: e for e in container.get("env") or []}
        config = relocate(env[CONFIG_ENV]["value"], f"{ip}:{FRONT_PORT}", f"{ip}:{ROUTER_LOOPBACK_PORT}",
                          f"{ip}:{FRONT_METRICS_PORT}")
        key = None
        if (ref := (env.get(API_KEY_ENV) or {}).get("valueFrom", {}).get("secretKeyRef")) is not None:
            secret = json.loads(kubectl_until_ok("get", "secret", ref["name"], "-n", pod["metadata"]["namespace"],
                                                 "-o", "json").stdout)
            key = base64.b64decode(secret["data"][ref["key"]]).decode()
        folder = self.root / "fronts" / name
        folder.mkdir(parents=True, exist_ok=True)
        return start_front(config, folder, self.root / f"{name}.front.log", key)

    def _leave(self, proc: Proc, deleted: bool = True) -> None:
        """What the kubelet does with a deleted pod: its preStop hook first (the process keeps
        serving: the routers and the Service have already dropped it), then SIGTERM, and SIGKILL
        once the grace period is spent. On a thread: the loop goes on meanwhile.

        The pod object of a `deleted` pod stays (Terminating) until the process has exited; then
        `_remove`. kwok frees a pod's IP once the object is gone and hands it to the next pod at once; should its
        backstop (the deletionTimestamp) remove the object first, a new pod could get the address
        of a process still draining, and a router that added the new pod would reach the old
        process: another revision, a NIXL mismatch no cluster could produce. So a new pod on the
        address ends the old pod's preStop pause at once (`cut`): SIGTERM, which closes its
        listener and lets what it is serving finish, and the new pod starts once the old process
        has exited."""
        def run() -> None:
            started = time.monotonic()
            deadline = started + min(proc.pre_stop, proc.grace)  # the grace period bounds the preStop hook too
            while time.monotonic() < deadline and not proc.cut.is_set():
                if self._stop.wait(0.1):
                    return  # the runner itself stops: stop() ends it, and it stays on `leaving` till then
            try:
                self._terminate(proc, max(1.0, proc.grace - (time.monotonic() - started)))
                proc.cgroup.remove()
                if proc.deleted:
                    # Should it fail, the loop removes the pod once this one is off `leaving`.
                    _remove(proc.namespace, proc.pod, proc.uid)
            finally:
                with self._lock:
                    self.leaving.remove(proc)

        proc.deleted = deleted
        self.leaving.append(proc)  # under the caller's lock
        threading.Thread(target=run, name=f"leave-{proc.pod}", daemon=True).start()

    def _remove_now(self, namespace: str, name: str, uid: str) -> None:
        if not _remove(namespace, name, uid):
            with self._lock:
                self._removing.discard(uid)  # tried again at the next pass

    def _probe_all(self) -> None:
        """The kubelet's readiness probes, for every process played: a pod is Ready only while its
        process answers its readinessProbe (an engine once loaded, a router once it has a pair), and
        turns unready after failureThreshold misses in a row (a crashed or hung process). Probed
        every PROBE_SECONDS rather than the rendered periodSeconds (5-10 s): the test's clock is
        compressed, as the routers' health checks are (router_health_seconds)."""
        while not self._stop.wait(PROBE_SECONDS):
            with self._lock:
                procs = list(self.procs.values())
            for proc in procs:
                try:
                    probe = proc.probe
                    if probe is not None and (ready := probe.observe(_answers(proc.ip, probe))) is not None:
                        if _set_ready(proc, ready):
                            probe.settle(ready)
                except Exception as exc:  # noqa: BLE001 - one bad write must not end every pod's probes
                    self.problems.append(f"probing {proc.namespace}/{proc.pod}: {exc!r}")

    def _terminate(self, proc: Proc, grace: float = 15.0) -> None:
        """SIGTERM, and SIGKILL after `grace`. A router pod's front goes first, as in its pod: it
        stops accepting and finishes what it carries (SIGUSR1, HAProxy's soft stop), then the router."""
        if (front := proc.front) is not None and front.poll() is None:
            started = time.monotonic()
            front.send_signal(signal.SIGUSR1)
            try:
                front.wait(grace)
            except subprocess.TimeoutExpired:
                front.kill()
                front.wait(10)
            grace = max(1.0, grace - (time.monotonic() - started))
        if proc.alive():
            proc.proc.send_signal(signal.SIGTERM)
            try:
                proc.proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.proc.kill()
                proc.proc.wait(10)

    def _write_map(self) -> None:
        body = {f"{p.namespace}/{p.pod}": {"kind": p.kind, "ip": p.ip, "url": p.url, "compat": p.compat,
                                           "alive": p.alive(), "metrics_port": p.metrics_port, "log": str(p.log)}
                for p in self.procs.values()}
        tmp = self.root / "pods.json.tmp"
        tmp.write_text(json.dumps(body, indent=1, sort_keys=True))
        tmp.replace(self.root / "pods.json")
        self._write_targets()

    @property
    def _targets_file(self) -> Path:
        assert self.targets is not None
        return self.targets / f"pod-runner-{os.getpid()}.json"

    def _write_targets(self) -> None:
        """Rewritten only when the list changes (Prometheus rereads a file on every write), through a
        temporary name outside its `*.json` pattern and a rename, so it never reads half a file."""
        if self.targets is None or not self.targets.is_dir():
            return
        groups = [{"targets": [f"{p.ip}:{p.port}"], "labels": scrape_labels(p.namespace, p.pod, p.labels)}
                  for p in sorted(self.procs.values(), key=lambda p: (p.namespace, p.pod))
                  if p.kind != ROUTER and p.alive()]
        text = json.dumps(groups, indent=1, sort_keys=True)
        if text == self._targets_written and self._targets_file.exists():
            return
        tmp = self.targets / f".{self._targets_file.name}.tmp"
        tmp.write_text(text)
        tmp.replace(self._targets_file)
        self._targets_written = text


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""Probes go straight to the pod's (loopback) address, never through a proxy from the environment."""


def _answers(ip: str, probe: Probe) -> bool:
    """What the kubelet counts as a passed httpGet probe: a 2xx or 3xx answer within its timeout."""
    try:
        with _DIRECT.open(f"http://{ip}:{probe.port}{probe.path}", timeout=probe.timeout) as answer:
            return bool(200 <= answer.status < 400)
    except Exception:  # noqa: BLE001 - refused, reset, timed out, a malformed answer: all a failed probe
        return False


def _set_ready(proc: Proc, ready: bool) -> bool:
    """The kubelet's status update for a readiness change or a container's exit or restart, on this
    pod only (its uid: a group's pod comes back under the same name): the Ready and ContainersReady
    conditions (merged by type; the reason goes when ready) and containerStatuses whole (an atomic
    list) with `ready`, the restarts and the last exit (Proc.container_statuses). True once the API
    server took it."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    condition = {"status": "True" if ready else "False", "lastTransitionTime": now,
                 "reason": None if ready else "ContainersNotReady"}
    patch = {"metadata": {"uid": proc.uid}, "status": {
        "conditions": [{"type": kind, **condition} for kind in ("Ready", "ContainersReady")],
        "containerStatuses": proc.container_statuses(ready)}}
    try:
        return kubectl("patch", "pod", proc.pod, "-n", proc.namespace, "--subresource=status", "--type=strategic",
                       "-p", json.dumps(patch), check=False, timeout=20).returncode == 0
    except subprocess.TimeoutExpired:  # the API server is away: the next probe round writes it
        return False


def _memory_limit(container: dict[str, Any]) -> int | None:
    """The container's memory limit in bytes, if it has one."""
    limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
    return int(quantity(str(limit))) if limit else None


def _managed_pods() -> list[dict[str, Any]]:
    """Every pod the operator manages, in every namespace (raises on a failed or garbled listing)."""
    return api_list("/api/v1/pods", labelSelector=SELECTOR)


def _read_throughput(namespace: str, deployment: str) -> dict[str, str]:
    """K3SIM_READ_BYTES_PER_S from the deployment's spec.model.readThroughput, as its storage
    would read (none: the planner's default, which the simulator applies itself)."""
    out = kubectl_until_ok("-n", namespace, "get", "kimik3deployments", deployment, "-o",
                           "jsonpath={.spec.model.readThroughput}",
                           ok=lambda r: r.returncode == 0 or "NotFound" in r.stderr)
    given = out.stdout.strip() if out.returncode == 0 else ""
    return {"K3SIM_READ_BYTES_PER_S": str(float(quantity(given)))} if given else {}


def _played(pod: dict[str, Any]) -> bool:
    """Marked at admission, and not bound to the cluster's real node (`cluster.sh env`'s
    KIMIK3_REAL_NODE), whose kubelet runs it for real (a router placed there by spec.router)."""
    return ((pod["metadata"].get("annotations") or {}).get(PLAYED) == "true"
            and pod["spec"].get("nodeName") != os.environ.get("KIMIK3_REAL_NODE", "\0"))


def _remove(namespace: str, name: str, uid: str) -> bool:
    """The kubelet's last step for a deleted pod whose containers have exited (or never ran): delete
    it with grace 0, on the condition that it is still the same pod (a group's pod comes back under
    the same name). True once it is gone (or was already)."""
    body = json.dumps({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                       "preconditions": {"uid": uid}})
    try:
        out = kubectl("delete", "--raw", f"/api/v1/namespaces/{namespace}/pods/{name}", "-f", "-",
                      input=body, check=False, timeout=20)
    except subprocess.SubprocessError:
        return False
    return out.returncode == 0 or "NotFound" in out.stderr or "not found" in out.stderr


def prometheus_targets() -> Path | None:
    """The cluster's file_sd folder, from `cluster.sh env` (KIMIK3_PROMETHEUS_TARGETS), if any."""
    folder = os.environ.get("KIMIK3_PROMETHEUS_TARGETS")
    return Path(folder) if folder else None


def main() -> None:
    """`python -m e2e.harness.pod_runner DIR [PIDFILE]`: keep playing pods until SIGTERM (scripts/demo.sh)."""
    root, stop = host_daemon()
    runner = PodRunner(root, targets=prometheus_targets()).start()
    print(f"serving and router pods run here, on their (loopback) pod IPs: {root / 'pods.json'}", flush=True)
    while not stop.wait(1):
        for problem in runner.problems:
            print(problem, flush=True)
        runner.problems.clear()
    runner.stop()


if __name__ == "__main__":
    main()
