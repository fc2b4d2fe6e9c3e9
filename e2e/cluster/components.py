"""The local cluster's components and setup steps, one row each: what `cluster.sh` runs and in what order.

Why a table: each process used to be described in about ten parallel places of cluster.sh (start
order, binary, command line, ports, health check, environment, stop order, restart order). Here a
component is one `Component` row (binary, arguments, ports, environment, health check, the nodes it
needs); a setup step of cluster.sh (CRDs, webhooks, the node's network) is one `Step` row with what it
needs. `supervisor.py` derives the start order, the stop order and the waits from `needs` alone.

`needs` means: started and healthy (a component) or done (a step) before this one starts. A step's
body is the shell function `step_<name>` of cluster.sh (dashes as underscores); with `undo=True`,
`down` runs `undo_<name>` once everything that needs the step is gone.

A row also says what cluster.sh prepares for it: its ports (key, upstream default, offset from
KIMIK3_PORT_BASE), its identity (the certificate it proves itself with, and its kubeconfig) and where
its binary is built (`BINARIES`). cluster.sh reads them as shell (`components.py shell`, evaluated at
its start) and keeps only what a shell must do: resolve the ports, issue the certificates, write the
files. Paths, resolved ports and the node's addresses come back from cluster.sh (`export_layout`)
as K3E_* variables.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

# ---------------------------------------------------------------------------------------------
# What cluster.sh decided


@dataclass(frozen=True)
class Layout:
    """The cluster's paths, ports and addresses, as cluster.sh exported them (K3E_*)."""

    env: Mapping[str, str]

    @classmethod
    def from_environment(cls) -> Layout:
        return cls({k[4:]: v for k, v in os.environ.items() if k.startswith("K3E_")})

    def __getattr__(self, name: str) -> str:
        try:
            return self.env[name.upper()]
        except KeyError:
            raise AttributeError(f"K3E_{name.upper()} is not set (cluster.sh export_layout)") from None

    def port(self, key: str) -> int:
        return int(self.env[f"PORT_{key}"])

    def bin(self, key: str) -> str:
        return self.env[f"BIN_{key}"]

    def kubeconfig(self, component: str) -> str:
        return f"{self.state}/kubeconfigs/{component}.kubeconfig"


# ---------------------------------------------------------------------------------------------
# Health probes: loopback only, never through a proxy (the network rule), TLS verified with our CA.

def _tls(layout: Layout, client_cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=f"{layout.pki}/ca.crt")
    if client_cert:
        context.load_cert_chain(f"{layout.pki}/admin.crt", f"{layout.pki}/admin.key")
    return context


def http_get(url: str, context: ssl.SSLContext | None = None, post_json: bool = False) -> tuple[int, str]:
    """Status and body of a GET (or a POST of `{}`); status 0 when nothing answered within 3 s."""
    request = urllib.request.Request(url, data=b"{}" if post_json else None, method="POST" if post_json else "GET")
    if post_json:
        request.add_header("Content-Type", "application/json")
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    try:
        with urllib.request.build_opener(*handlers).open(request, timeout=3) as response:
            return int(response.status), response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return int(error.code), ""
    except (OSError, ValueError):
        return 0, ""


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    return http_get(url, context)[0] == 200


def webhook_served(layout: Layout, health_port: str, webhook_port: str) -> bool:
    """controller-runtime's readyz is a plain ping and its webhooks register later: also POST to
    the LeaderWorkerSet validation handler, where 404 means it is not there yet."""
    if not ok(f"http://127.0.0.1:{layout.port(health_port)}/readyz"):
        return False
    code, _ = http_get(
        f"https://127.0.0.1:{layout.port(webhook_port)}/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
        _tls(layout), post_json=True)
    return code != 0 and code != 404


def containerd_answers(layout: Layout) -> bool:
    sock = layout.containerd_sock
    if not Path(sock).is_socket():
        return False
    try:
        return subprocess.run(["ctr", "--address", sock, "version"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# ---------------------------------------------------------------------------------------------
# The rows


@dataclass(frozen=True)
class Port:
    """A port a component listens on. `default` is upstream's where it does not clash with another
    component's; `offset` its place after KIMIK3_PORT_BASE, fixed once given (a new port takes the
    next free one, so the other ports of a test cluster stay where they were)."""

    key: str
    default: int
    offset: int
    loopback: bool = True
    """On 127.0.0.1: the supervisor checks it is free before a start and closed after a stop."""


@dataclass(frozen=True)
class Identity:
    """The certificate a component proves itself with, signed by the cluster CA: a client certificate
    (O=system:masters, so the audit log names it by `cn`), also a serving one when `serving` is given
    (for localhost, 127.0.0.1 and those names: DNS names, or IP:ADDRESS). Text in `cn` and `serving`
    is expanded by cluster.sh ($NODE_NAME, $(node_ip)). With `kubeconfig`, cluster.sh writes
    kubeconfigs/<component>.kubeconfig for it."""

    cn: str
    serving: tuple[str, ...] | None = None
    kubeconfig: bool = True


BINARIES: dict[str, tuple[str, str]] = {
    "K8S": ("k8s", "K8S_VERSION"), "ETCD": ("etcd", "ETCD_VERSION"), "KWOK": ("kwok", "KWOK_VERSION"),
    "LWS": ("lws", "LWS_VERSION"), "KUEUE": ("kueue", "KUEUE_VERSION"), "HELM": ("helm", "HELM_VERSION"),
    "PROMETHEUS": ("prometheus", "PROMETHEUS_DEB_VERSION"), "KEDA": ("keda", "KEDA_VERSION"),
    "PROMETHEUS_ADAPTER": ("prometheus-adapter", "PROMETHEUS_ADAPTER_VERSION"),
}
"""Where build.sh puts each pinned build: $CACHE/bin/<folder>-v$<version variable of versions.env>
(helm is no component: the tests and the demo run it)."""


Argv = Callable[[Layout], list[str]]
Probe = Callable[[Layout], bool]


def _running(_: Layout) -> bool:
    return True  # no server: running is all there is to check (the supervisor checks that first)


@dataclass(frozen=True)
class Component:
    """A process of the cluster. `probe` runs only while the process runs."""

    name: str
    binary: Callable[[Layout], str]
    args: Argv
    probe: Probe = _running
    ports: tuple[Port, ...] = ()
    needs: tuple[str, ...] = ()
    env: Callable[[Layout], dict[str, str]] = lambda _: {}
    ready_timeout: int = 60
    before_start: tuple[str, ...] = ()  # steps run again before each (re)start
    # A Python script run by the project venv's Python: argv[1] is the script, not argv[0].
    script: bool = False
    identity: Identity | None = None

    @property
    def port_keys(self) -> tuple[str, ...]:
        """The keys of the ports it listens on at 127.0.0.1."""
        return tuple(p.key for p in self.ports if p.loopback)

    def argv(self, layout: Layout) -> list[str]:
        head = [layout.env.get("PYTHON") or "python3"] if self.script else []
        return [*head, self.binary(layout), *self.args(layout)]


@dataclass(frozen=True)
class Step:
    """A setup step of cluster.sh (`step_<name>`), and with `undo` its teardown (`undo_<name>`)."""

    name: str
    needs: tuple[str, ...] = ()
    undo: bool = False


def _secure(layout: Layout, component: str) -> list[str]:
    """KCM and the scheduler serve /healthz with our serving certificate, so probes verify TLS."""
    kc = layout.kubeconfig(component)
    return [
        "--bind-address=127.0.0.1", f"--tls-cert-file={layout.pki}/admin.crt",
        f"--tls-private-key-file={layout.pki}/admin.key",
        f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
    ]


def _etcd(c: Layout) -> list[str]:
    client, peer = f"http://127.0.0.1:{c.port('ETCD_PORT')}", f"http://127.0.0.1:{c.port('ETCD_PEER_PORT')}"
    return ["--name=kimik3-e2e", f"--data-dir={c.state}/etcd", f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}", f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}", f"--initial-cluster=kimik3-e2e={peer}",
            "--unsafe-no-fsync=true", "--quota-backend-bytes=4294967296", "--log-level=warn"]


def _apiserver(c: Layout) -> list[str]:
    # --endpoint-reconciler-type=none: Endpoints validation rejects the loopback address.
    # --shutdown-watch-termination-grace-period: on TERM, end open watches after 2 s; without it the
    # server holds them until the 60 s request timeout before it exits (restart, down).
    # Service and pod CIDRs are labels only: nothing routes them, never connect to them.
    # The aggregation layer (README-aggregated-apis.md): the aggregator calls the metrics API servers
    # with the front-proxy client certificate and the user in X-Remote-* headers, which the API server
    # publishes in kube-system/extension-apiserver-authentication for them to trust;
    # --enable-aggregator-routing=false (the default, stated because the loopback trick needs it)
    # resolves an APIService's ExternalName Service to https://localhost:<APIService port>.
    pki = c.pki
    return [f"--etcd-servers=http://127.0.0.1:{c.port('ETCD_PORT')}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={c.port('APISERVER_PORT')}",
            f"--cert-dir={c.state}/apiserver",
            f"--tls-cert-file={pki}/admin.crt", f"--tls-private-key-file={pki}/admin.key",
            f"--client-ca-file={pki}/ca.crt", "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki}/sa.pub", f"--service-account-signing-key-file={pki}/sa.key",
            f"--service-cluster-ip-range={c.service_cidr}", "--allow-privileged=true",
            f"--kubelet-client-certificate={pki}/admin.crt", f"--kubelet-client-key={pki}/admin.key",
            "--kubelet-preferred-address-types=InternalIP",
            "--endpoint-reconciler-type=none", "--profiling=false",
            f"--audit-policy-file={c.conf}/audit-policy.yaml", f"--audit-log-path={c.audit_log}",
            "--audit-log-format=json", "--audit-log-mode=blocking",
            "--audit-log-maxsize=200", "--audit-log-maxbackup=5", "--shutdown-watch-termination-grace-period=2s",
            f"--requestheader-client-ca-file={pki}/front-proxy-ca.crt",
            f"--requestheader-allowed-names={c.front_proxy_client}",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki}/front-proxy-client.crt",
            f"--proxy-client-key-file={pki}/front-proxy-client.key",
            "--enable-aggregator-routing=false"]


def _kcm(c: Layout) -> list[str]:
    # Leader election off: a restarted process would otherwise wait for its old lease.
    # The HPA controller (on by default) syncs every 5 s, not 15 s, and scales down after 15 s of
    # lower recommendations, not 5 min, so autoscaling tests take seconds.
    grace = c.env.get("NODE_GRACE_SECONDS", "")
    return [f"--kubeconfig={c.kubeconfig('kube-controller-manager')}", *_secure(c, "kube-controller-manager"),
            f"--secure-port={c.port('KCM_PORT')}", "--leader-elect=false", "--cluster-name=kimik3-e2e",
            f"--root-ca-file={c.pki}/ca.crt", f"--service-account-private-key-file={c.pki}/sa.key",
            "--use-service-account-credentials=false",
            "--horizontal-pod-autoscaler-sync-period=5s", "--horizontal-pod-autoscaler-downscale-stabilization=15s",
            *([f"--node-monitor-grace-period={grace}s"] if grace else [])]


def _keda_operator(c: Layout) -> list[str]:
    # As KEDA's config/manager, minus leader election, certificate rotation (our CA signs its pair)
    # and the APIService/webhook patching that goes with it. Its controller-runtime metrics are off
    # ("0"); health and the gRPC metrics service the metrics API server calls on loopback.
    return [f"--kubeconfig={c.kubeconfig('keda-operator')}", "--leader-elect=false", "--zap-log-level=info",
            "--zap-encoder=console", "--zap-time-encoding=rfc3339", "--metrics-bind-address=0",
            f"--health-probe-bind-address=127.0.0.1:{c.port('KEDA_HEALTH_PORT')}",
            f"--metrics-service-bind-address=127.0.0.1:{c.port('KEDA_GRPC_PORT')}",
            f"--cert-dir={c.pki}/keda-operator-certs", f"--ca-dir={c.pki}/keda-ca", "--enable-cert-rotation=false",
            "--enable-webhook-patching=false", "--enable-apiservice-patching=false"]


def _keda_metrics_apiserver(c: Layout) -> list[str]:
    # As KEDA's config/metrics-server, on loopback: the aggregator reaches it through the ExternalName
    # Service keda/keda-metrics-apiserver (step metrics-apiservices). Callers are authenticated and
    # authorized by the API server (the delegating kubeconfigs); --port is its own /metrics, which
    # build.sh binds to 127.0.0.1 (KEDA binds it to all interfaces).
    kc, certs = c.kubeconfig("keda-metrics-apiserver"), f"{c.pki}/keda-metrics-apiserver-certs"
    return [f"--kubeconfig={kc}", f"--lister-kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1", f"--secure-port={c.port('KEDA_METRICS_API_PORT')}",
            f"--cert-dir={certs}", f"--tls-cert-file={certs}/tls.crt", f"--tls-private-key-file={certs}/tls.key",
            f"--metrics-service-address=127.0.0.1:{c.port('KEDA_GRPC_PORT')}",
            f"--port={c.port('KEDA_METRICS_API_METRICS_PORT')}", "--zap-log-level=info"]


def _prometheus_adapter(c: Layout) -> list[str]:
    # Custom metrics only (the rules file has no resource or external rules: KEDA owns
    # external.metrics.k8s.io). It relists Prometheus' series every 5 s (default 10 min) so a new
    # pod's metrics are served within seconds; max age covers a relist plus a few scrapes.
    kc = c.kubeconfig("prometheus-adapter")
    return [f"--lister-kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1", f"--secure-port={c.port('PROMETHEUS_ADAPTER_PORT')}",
            f"--tls-cert-file={c.pki}/prometheus-adapter.crt", f"--tls-private-key-file={c.pki}/prometheus-adapter.key",
            f"--prometheus-url=http://{c.prometheus_host}:{c.port('PROMETHEUS_PORT')}/",
            f"--config={c.conf}/prometheus-adapter-rules.yaml", "--metrics-relist-interval=5s", "--metrics-max-age=10s"]


def _keda_env(c: Layout) -> dict[str, str]:
    # Where KEDA runs (POD_NAMESPACE; KEDA_CLUSTER_OBJECT_NAMESPACE for the Secrets of cluster-wide
    # trigger authentications) and which namespaces it watches (WATCH_NAMESPACE empty: all).
    return {"WATCH_NAMESPACE": "", "POD_NAMESPACE": c.keda_namespace, "KEDA_CLUSTER_OBJECT_NAMESPACE": c.keda_namespace}


def _https_ok(path: str, port: str, client_cert: bool = False) -> Probe:
    return lambda c: ok(f"https://127.0.0.1:{c.port(port)}{path}", _tls(c, client_cert))


def _http_ok(path: str, port: str) -> Probe:
    return lambda c: ok(f"http://127.0.0.1:{c.port(port)}{path}")


def _ready_file(name: str) -> Probe:
    """A client-only process that creates this file while its last list or sync succeeded."""
    return lambda c: Path(f"{c.run}/{name}.ready").exists()


def _bin(key: str, name: str) -> Callable[[Layout], str]:
    return lambda c: f"{c.bin(key)}/{name}"


def _here(script: str) -> Callable[[Layout], str]:
    return lambda c: f"{c.here}/{script}"


def _usr(path: str) -> Callable[[Layout], str]:
    return lambda _: path


COMPONENTS: tuple[Component | Step, ...] = (
    Step("node-network", undo=True),  # the real node's bridge and guards: before anything calls a Service address
    Component("etcd", _bin("ETCD", "etcd"), _etcd, ports=(Port("ETCD_PORT", 2379, 0), Port("ETCD_PEER_PORT", 2380, 1)),
              ready_timeout=30,
              probe=lambda c: '"health":"true"' in http_get(f"http://127.0.0.1:{c.port('ETCD_PORT')}/health")[1]),
    Component("kube-apiserver", _bin("K8S", "kube-apiserver"), _apiserver, ports=(Port("APISERVER_PORT", 6443, 2),),
              needs=("etcd", "node-network"), ready_timeout=120,
              probe=_https_ok("/readyz", "APISERVER_PORT", client_cert=True)),
    # The CRDs before KCM: its garbage collector discovers resource types when it starts and then only
    # every 30 s, so objects owned by a kind whose CRD came later would outlive their owner by 30 s.
    Step("crds", needs=("kube-apiserver",)),
    Component("kube-controller-manager", _bin("K8S", "kube-controller-manager"), _kcm,
              ports=(Port("KCM_PORT", 10257, 3),),
              identity=Identity("system:kube-controller-manager"),
              needs=("crds",), probe=_https_ok("/healthz", "KCM_PORT")),
    Component("kube-scheduler", _bin("K8S", "kube-scheduler"),
              lambda c: [f"--kubeconfig={c.kubeconfig('kube-scheduler')}", *_secure(c, "kube-scheduler"),
                         f"--secure-port={c.port('SCHEDULER_PORT')}", "--leader-elect=false"],
              ports=(Port("SCHEDULER_PORT", 10259, 4),), needs=("kube-apiserver",),
              probe=_https_ok("/healthz", "SCHEDULER_PORT"), identity=Identity("system:kube-scheduler")),
    # Each kwok process holds the node Leases under a new identity and waits for its predecessor's to
    # expire (~40 s): release-node-leases hands them over before every start. The lease duration
    # makes kwok renew node Leases (without them KCM marks nodes NotReady after ~50 s); the pod CIDR
    # must not overlap the Service CIDR; no --node-ip: nothing ever reaches a fake kubelet.
    Step("release-node-leases", needs=("kube-apiserver",)),
    Component("kwok", _bin("KWOK", "kwok"),
              lambda c: [f"--kubeconfig={c.kubeconfig('kwok')}", f"--config={c.conf}/kwok.yaml",
                         "--manage-all-nodes=false",
                         f"--manage-nodes-with-annotation-selector={c.fake_node_annotation}",
                         f"--cidr={c.pod_cidr}", "--node-lease-duration-seconds=40"],
              needs=("kube-apiserver",), before_start=("release-node-leases",), identity=Identity("kimik3-e2e:kwok")),
    # The web UI's assets are not unpacked (other Debian packages); the HTTP API is all we use.
    Component("prometheus", _bin("PROMETHEUS", "prometheus"),
              lambda c: [f"--config.file={c.conf}/prometheus.yml", f"--storage.tsdb.path={c.prom_dir}/data",
                         "--storage.tsdb.retention.time=1d",
                         f"--web.listen-address={c.prometheus_host}:{c.port('PROMETHEUS_PORT')}", "--log.level=warn"],
              ports=(Port("PROMETHEUS_PORT", 9090, 7),),
              probe=lambda c: ok(f"http://{c.prometheus_host}:{c.port('PROMETHEUS_PORT')}/-/ready")),
    # The real node: its state folders and cgroups, its registry (with the pause image) and containerd,
    # then the kubelet, which serves on the bridge's address; the Service rules beside them.
    Step("node-state", undo=True),
    Component("registry", _usr("/usr/bin/docker-registry"), lambda c: ["serve", f"{c.conf}/registry.yml"],
              ports=(Port("REGISTRY_PORT", 5000, 13),), needs=("node-state",), ready_timeout=30,
              probe=lambda c: ok(f"http://{c.registry}/v2/")),
    # containerd pulls only from the loopback registry (node.sh's hosts.toml for it and for ghcr.io);
    # any other registry name goes to a proxy address nothing listens on, never off the machine.
    Component("containerd", _usr("/usr/bin/containerd"), lambda c: [f"--config={c.conf}/containerd.toml"],
              needs=("node-state",), ready_timeout=30, probe=containerd_answers,
              env=lambda _: {"HTTP_PROXY": "http://127.0.0.1:1", "HTTPS_PROXY": "http://127.0.0.1:1",
                             "NO_PROXY": "127.0.0.1,localhost"}),
    Component("lws-manager", _bin("LWS", "lws-manager"),  # after its CRDs: it fails on unknown kinds
              lambda c: [f"--kubeconfig={c.kubeconfig('lws-manager')}", f"--config={c.conf}/lws.yaml",
                         "--zap-log-level=info"],
              ports=(Port("LWS_WEBHOOK_PORT", 9443, 5), Port("LWS_HEALTH_PORT", 8081, 6)), needs=("crds",),
              identity=Identity("kimik3-e2e:lws-manager"),
              probe=lambda c: webhook_served(c, "LWS_HEALTH_PORT", "LWS_WEBHOOK_PORT")),
    Step("python"),  # the project venv's, for the two scripts (K3E_PYTHON)
    Component("compute-domain-controller", _here("compute_domain_controller.py"),
              lambda c: [c.kubeconfig("compute-domain-controller"), f"{c.run}/compute-domain-controller.ready"],
              needs=("crds", "python"), script=True, ready_timeout=30, probe=_ready_file("compute-domain-controller"),
              identity=Identity("kimik3-e2e:compute-domain-controller")),
    Component("service-proxy", _here("service_proxy.py"),
              lambda c: [f"--kubeconfig={c.kubeconfig('service-proxy')}", f"--chain={c.node_chain}",
                         f"--kubernetes-ip={c.kubernetes_ip}", f"--apiserver=127.0.0.1:{c.port('APISERVER_PORT')}",
                         f"--pod-subnet={c.node_subnet}", f"--ready-file={c.run}/service-proxy.ready"],
              needs=("kube-apiserver", "node-network", "python"), script=True, ready_timeout=30,
              probe=_ready_file("service-proxy"), identity=Identity("kimik3-e2e:service-proxy")),
    Step("cluster-objects", needs=("crds",)),  # storage class, played-pods policy, fake nodes
    Step("lws-webhooks", needs=("lws-manager",)),  # only once the manager serves them
    # Kueue manages LeaderWorkerSets: after the LWS CRDs and webhooks. Its metrics server's certificate
    # folder is an environment variable (build.sh makes it one).
    Component("kueue-manager", _bin("KUEUE", "kueue-manager"),
              lambda c: [f"--kubeconfig={c.kubeconfig('kueue-manager')}", f"--config={c.conf}/kueue.yaml",
                         "--zap-log-level=info"],
              ports=(Port("KUEUE_WEBHOOK_PORT", 9444, 16), Port("KUEUE_HEALTH_PORT", 8084, 17)),
              needs=("lws-webhooks",),
              identity=Identity("kimik3-e2e:kueue-manager"),
              env=lambda c: {"KUEUE_METRICS_CERT_DIR": f"{c.pki}/kueue-webhook"},
              probe=lambda c: webhook_served(c, "KUEUE_HEALTH_PORT", "KUEUE_WEBHOOK_PORT")),
    Step("kueue-webhooks", needs=("kueue-manager",)),
    Step("metrics-services", needs=("kube-apiserver",)),
    # readyz is a plain ping; the gRPC metrics service starts with the manager, a moment later.
    Component("keda-operator", _bin("KEDA", "keda"), _keda_operator,
              ports=(Port("KEDA_GRPC_PORT", 9666, 8), Port("KEDA_HEALTH_PORT", 8082, 9)), needs=("crds",),
              env=_keda_env,
              identity=Identity("kimik3-e2e:keda-operator", serving=("keda-operator.$KEDA_NAMESPACE.svc",)),
              probe=lambda c: ok(f"http://127.0.0.1:{c.port('KEDA_HEALTH_PORT')}/readyz")
              and port_open(c.port("KEDA_GRPC_PORT"))),
    # Once Prometheus answers: it lists the series at start.
    Component("prometheus-adapter", _bin("PROMETHEUS_ADAPTER", "prometheus-adapter"), _prometheus_adapter,
              ports=(Port("PROMETHEUS_ADAPTER_PORT", 6445, 12),), needs=("prometheus", "metrics-services"),
              identity=Identity("kimik3-e2e:prometheus-adapter",
                                serving=("prometheus-adapter.$ADAPTER_NAMESPACE.svc",)),
              probe=_https_ok("/readyz", "PROMETHEUS_ADAPTER_PORT")),
    # Once the operator's gRPC metrics service answers.
    Component("keda-metrics-apiserver", _bin("KEDA", "keda-adapter"), _keda_metrics_apiserver,
              ports=(Port("KEDA_METRICS_API_PORT", 6444, 10), Port("KEDA_METRICS_API_METRICS_PORT", 8083, 11)),
              identity=Identity("kimik3-e2e:keda-metrics-apiserver",
                                serving=("keda-metrics-apiserver.$KEDA_NAMESPACE.svc",)),
              needs=("keda-operator", "metrics-services"), env=_keda_env,
              probe=_https_ok("/readyz", "KEDA_METRICS_API_PORT")),
    # Only once their servers answer: an unavailable aggregated API fails discovery, which stalls
    # namespace deletion and the garbage collector cluster-wide.
    Step("metrics-apiservices", needs=("keda-metrics-apiserver", "prometheus-adapter")),
    # The pods' sandbox image in the registry; its undo removes the node's pods before containerd goes.
    Step("pause-image", needs=("registry", "containerd"), undo=True),
    Component("kubelet", _bin("K8S", "kubelet"),
              lambda c: [f"--config={c.conf}/kubelet.yaml", f"--kubeconfig={c.kubeconfig('kubelet')}",
                         f"--root-dir={c.node_dir}/kubelet", f"--hostname-override={c.node_name}",
                         f"--node-ip={c.node_ip}", "--node-labels=kimik3.dev/e2e-node=real"],
              ports=(Port("KUBELET_HEALTHZ_PORT", 10248, 15), Port("KUBELET_PORT", 10250, 14, loopback=False)),
              identity=Identity("system:node:$NODE_NAME", serving=("$NODE_NAME", "IP:$(node_ip)")),
              needs=("pause-image", "kube-apiserver", "node-network"),
              probe=_http_ok("/healthz", "KUBELET_HEALTHZ_PORT")),
)


def shell() -> str:
    """What cluster.sh evaluates at its start: the ports (PORT_KEYS in offset order, PORT_DEFAULT),
    the build folders (BIN_<KEY>), the components with a kubeconfig, and `issue_component_certs`."""
    components = [r for r in COMPONENTS if isinstance(r, Component)]
    ports = sorted((p for c in components for p in c.ports), key=lambda p: p.offset)
    if [p.offset for p in ports] != list(range(len(ports))):
        raise SystemExit(f"port offsets must be 0..{len(ports) - 1}, each once: {[(p.key, p.offset) for p in ports]}")
    lines = [f"PORT_KEYS=({' '.join(p.key for p in ports)})",
             "declare -A PORT_DEFAULT=(" + " ".join(f"[{p.key}]={p.default}" for p in ports) + ")",
             f"BIN_KEYS=({' '.join(BINARIES)})",
             *(f'BIN_{key}="$CACHE/bin/{folder}-v${version}"' for key, (folder, version) in BINARIES.items()),
             "KUBECONFIG_COMPONENTS=(" + " ".join(c.name for c in components
                                                  if c.identity and c.identity.kubeconfig) + ")",
             "issue_component_certs() {"]
    for c in components:
        if c.identity is not None:
            serving = "" if c.identity.serving is None else " serving" + "".join(f' "{n}"' for n in c.identity.serving)
            lines.append(f'  issue {c.name} "/O=system:masters/CN={c.identity.cn}"{serving}')
    return "\n".join([*lines, "}"]) + "\n"


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["shell"]:
        raise SystemExit("usage: components.py shell")
    sys.stdout.write(shell())
