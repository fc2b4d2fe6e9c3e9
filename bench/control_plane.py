"""What the operator costs a real API server as deployments grow, against the kubectl floor.

    bench/control_plane.sh [--sizes 1,100,300] [--nodes 1000] [--rss-size 500] [--idle 120]
                           [--operator-src DIR] [--label NAME]

Run by bench/control_plane.sh on a local real cluster of its own (kube-apiserver, etcd, KCM,
scheduler, kwok, LWS; loopback only) with a fleet of `--nodes` fake HGX B300 nodes. For each size N:

- operator: N KimiK3Deployments (aggregated TP8, one node each) in one `kubectl apply --server-side`;
  the time until every one has all its children (the count it keeps once it is Ready), and until
  every one is Ready. Staging pods are completed as soon as they run (the fake stager below annotates
  them as tests/stager.py does after running the real stager), so staging costs what the cluster's
  Job machinery costs, not a download.
- floor: the same children, rendered by the operator's own planner and renderer for the same specs
  as the operator keeps them once Ready (the router running, its engines listed), applied with
  `kubectl apply --server-side` into a fresh namespace in the two steps the operator must take
  too: the weights children, then (once their Jobs completed) the serving children. (Until
  session 8 the floor applied the router as it is first rendered, paused at 0 replicas: the
  operator's run made 2 router pods per deployment that the floor did not.)
  ratio = operator / floor.
- reconcile p50/p99 from the operator's own histograms (total; API time, pure time and the pure
  part's own CPU time where the operator exports them), over the passes of the run; and the
  operator's writes until all were Ready, per deployment and by kind, from the audit log.
- idle: `--idle` seconds after all are Ready, the operator's requests per minute by verb from the
  audit log, and its writes (Leases aside; the target is 0).
- operator RSS (VmRSS) after each run, and after a run of `--rss-size` deployments.
- where the machine's time went: the CPU seconds each cluster process, the operator and kubectl
  used until all were Ready (and during the floor), the floor's three waits, and the child events
  by kind that asked for the operator's passes (`kimik3_operator_child_events_total`).

The operator runs as a host process (`python -m kimik3_operator run`, no leader election) from
`--operator-src` (default: this checkout), as the audited user kimik3-e2e:operator. Results:
bench/results/control_plane-<label>.json, a Markdown table on stdout.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from kimik3_operator.api import GROUP, KIND, VERSION, KimiK3Deployment  # noqa: E402
from kimik3_operator.contract.kinds import BY_KIND, CHILD_KINDS, WEIGHTS  # noqa: E402
from kimik3_operator.k8s.informer import raw_get  # noqa: E402
from kimik3_operator.planner import plan_deployment, pool_facts, with_staged  # noqa: E402
from kimik3_operator.render import Owner, render_children  # noqa: E402
from kimik3_operator.render.names import (  # noqa: E402
    LABEL_DEPLOYMENT,
    MANAGED_BY,
)

FLEET_LABEL = "bench.kimik3.dev/fleet"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OPERATOR_USER = "kimik3-e2e:operator"
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
EXIT_CODE = "kwok.kimik3.dev/exit-code"
MESSAGE = "kwok.kimik3.dev/termination-message"
WEIGHTS_PODS = f"app.kubernetes.io/component=weights,app.kubernetes.io/managed-by={MANAGED_BY}"
CHILD_EVENTS = "kimik3_operator_child_events_total"
HISTOGRAMS = {"total": "kimik3_operator_reconcile_duration_seconds",
              "api": "kimik3_operator_reconcile_api_seconds",
              "pure": "kimik3_operator_reconcile_pure_seconds",
              # the pure part as the pass's own CPU: its wall time less waits for a core or the GIL
              "pure_cpu": "kimik3_operator_reconcile_pure_cpu_seconds"}


def log(message: str) -> None:
    print(f"[bench {datetime.now(UTC):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def kubectl(*args: str, input: str | None = None, timeout: float = 900) -> str:
    done = subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"kubectl {' '.join(args[:4])} failed: {done.stderr[-2000:]}")
    return done.stdout


# ---- the fleet ----------------------------------------------------------------------------------

def _generate() -> Any:
    spec = importlib.util.spec_from_file_location("nodes_generate", ROOT / "e2e" / "cluster" / "nodes" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fleet_node(generate: Any, index: int) -> dict[str, Any]:
    """An HGX B300 node as the e2e pools are written (generate.py), labelled as the bench's fleet."""
    pool = dict(prefix="bench-b300-", digits=4, gpus=8, product="NVIDIA-B300", memory_mib=275040, cc=(10, 3),
                family="blackwell", arch="amd64", cpu="224", memory="2Ti", instance_type="hgx-b300", clique=None)
    node: dict[str, Any] = yaml.safe_load(generate.node(pool, index))
    node["metadata"]["labels"][FLEET_LABEL] = "yes"
    # Untainted (generate.py taints GPU nodes nvidia.com/gpu since 04ea18d): routers and staging pods
    # land on the fleet as before. Otherwise only the cluster's 4 CPU nodes (256 CPU) take them: 2
    # routers x 1.1 CPU a deployment fill those at ~116 deployments and no staging pod (2 CPU) fits.
    node.pop("spec", None)
    return node


def ensure_fleet(core: client.CoreV1Api, count: int, folder: Path) -> None:
    generate = _generate()
    have = {n.metadata.name for n in core.list_node(label_selector=FLEET_LABEL).items}
    missing = [fleet_node(generate, i) for i in range(count)]
    missing = [n for n in missing if n["metadata"]["name"] not in have]
    if missing:
        log(f"creating {len(missing)} fake B300 nodes")
        nodes = folder / "fleet.yaml"
        nodes.write_text(yaml.safe_dump_all(missing))
        kubectl("create", "-f", str(nodes))  # create keeps status (capacity): see generate.py

    def ready() -> int:
        return sum(1 for n in core.list_node(label_selector=FLEET_LABEL).items
                   if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or []))
    deadline = time.monotonic() + 900
    while (count_ready := ready()) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {count_ready} of {count} fleet nodes Ready after 900 s")
        time.sleep(2)
    log(f"{count} fleet nodes Ready")


# ---- deployments, and their children as the operator renders them --------------------------------

def deployment(namespace: str, index: int) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": f"k3-{index:04d}", "namespace": namespace},
            "spec": {"model": {"uri": "hf://moonshotai/Kimi-K3", "revision": COMMIT},
                     "pools": [{"name": "b300", "nodeSelector": {FLEET_LABEL: "yes"},
                                "aggregated": {"replicas": 1, "parallelism": {"tensor": 8}}}]}}


def rendered(cr: dict[str, Any], nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The children the operator keeps for `cr` once it is Ready (weights staged, its router
    running), without owner references (the floor has no KimiK3Deployment to point at). The
    router finds its engines itself, so what the operator first renders is what it keeps."""
    spec = KimiK3Deployment.model_validate(cr).spec
    plan = plan_deployment(spec, {p.name: pool_facts(p.node_selector, nodes) for p in spec.pools})
    plan = with_staged(plan, {source.name: COMMIT for source in plan.weights.sources})
    owner = Owner(name=cr["metadata"]["name"], namespace=cr["metadata"]["namespace"], uid="floor")
    out = []
    for obj in render_children(owner, plan):
        meta = {k: v for k, v in obj["metadata"].items() if k != "ownerReferences"}
        out.append({**obj, "metadata": meta})
    return out


class Reader:
    """Raw JSON lists (no model objects: the bench's polling must cost the machine little)."""

    def __init__(self) -> None:
        from kubernetes.dynamic import DynamicClient
        from kubernetes.dynamic.exceptions import ResourceNotFoundError
        self.api = client.ApiClient()
        dyn = DynamicClient(self.api)
        self.paths: dict[str, Any] = {}
        for kind in [*CHILD_KINDS, BY_KIND["Job"]]:
            try:
                self.paths[kind.kind] = dyn.resources.get(api_version=kind.api_version, kind=kind.kind)
            except ResourceNotFoundError:
                pass  # not served here (e.g. KEDA): none exist
        self.paths[KIND] = dyn.resources.get(api_version=f"{GROUP}/{VERSION}", kind=KIND)

    def items(self, kind: str, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        if kind not in self.paths:
            return []
        query = [("labelSelector", selector)] if selector else []
        return list(json.loads(raw_get(self.api, self.paths[kind].path(namespace=namespace), query, 120).data)["items"])

    def children_per_deployment(self, namespace: str) -> Counter[str]:
        """How many objects of the child kinds each deployment has now (by its label)."""
        counts: Counter[str] = Counter()
        for kind in CHILD_KINDS:
            counts.update(o["metadata"]["labels"][LABEL_DEPLOYMENT]
                          for o in self.items(kind.kind, namespace, LABEL_DEPLOYMENT))
        return counts

    def ready_deployments(self, namespace: str) -> int:
        return sum(1 for cr in self.items(KIND, namespace)
                   if any(c["type"] == "Ready" and c["status"] == "True"
                          for c in (cr.get("status") or {}).get("conditions") or []))

    def succeeded_jobs(self, namespace: str) -> int:
        return sum(1 for j in self.items("Job", namespace) if (j.get("status") or {}).get("succeeded"))


class FakeStager(threading.Thread):
    """Completes every running staging pod as tests/stager.py does after running the real stager:
    its exit code and the final progress record (the staged commit) as annotations, which the
    cluster's kwok stage turns into the container status a kubelet reports."""

    RECORD = json.dumps({"phase": "Complete", "commit": COMMIT, "filesDone": 1, "filesTotal": 1,
                         "bytesDone": 1, "bytesTotal": 1, "percent": 100})

    def __init__(self, core: client.CoreV1Api) -> None:
        super().__init__(daemon=True, name="fake-stager")
        self.core, self.stop = core, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            try:
                pods = self.core.list_pod_for_all_namespaces(label_selector=WEIGHTS_PODS).items
            except Exception as exc:  # noqa: BLE001 - the API server may be busy: next round
                log(f"fake stager: {exc}")
                continue
            for pod in pods:
                if pod.status.phase == "Running" and EXIT_CODE not in (pod.metadata.annotations or {}):
                    try:
                        self.core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace, {
                            "metadata": {"annotations": {EXIT_CODE: "0", MESSAGE: self.RECORD}}})
                    except Exception as exc:  # noqa: BLE001 - deleted since the list, or a busy server: next round
                        log(f"fake stager: {exc}")


# ---- the operator -------------------------------------------------------------------------------

class Operator:
    def __init__(self, src: Path, state: Path, folder: Path) -> None:
        port = _free_port()
        self.metrics = f"http://127.0.0.1:{port}/metrics"
        env = {**os.environ, "KUBECONFIG": str(state / "kubeconfigs" / "operator.kubeconfig"),
               "PYTHONPATH": str(src), "KIMIK3_RESYNC_SECONDS": "30", "KIMIK3_RETRY_SECONDS": "10"}
        self.log = folder / "operator.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "kimik3_operator", "run", f"--metrics-port={port}"],
                                         stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(folder))
        deadline = time.monotonic() + 60
        while not self.scrape():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the operator did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.5)

    def scrape(self) -> str:
        import urllib.request
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(self.metrics, timeout=5) as response:
                return str(response.read().decode())
        except OSError:
            return ""

    def rss_mb(self) -> float:
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) / 1024  # type: ignore[union-attr]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def buckets(text: str, metric: str) -> dict[float, float]:
    """Cumulative bucket counts of a histogram, summed over its labels."""
    out: Counter[float] = Counter()
    for line in text.splitlines():
        if line.startswith(f"{metric}_bucket{{"):
            le = re.search(r'le="([^"]+)"', line).group(1)  # type: ignore[union-attr]
            out[float("inf") if le == "+Inf" else float(le)] += float(line.rsplit(" ", 1)[1])
    return dict(out)


def labelled(text: str, metric: str, label: str) -> Counter[str]:
    """A counter's values by one label, from a scrape."""
    out: Counter[str] = Counter()
    for m in re.finditer(rf'^{metric}{{[^}}]*{label}="([^"]*)"[^}}]*}} ([0-9.e+]+)$', text, re.M):
        out[m.group(1)] += float(m.group(2))
    return out


def quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The q-quantile of the observations made between two scrapes (linear inside a bucket)."""
    delta = sorted((le, after.get(le, 0) - before.get(le, 0)) for le in after)
    total = delta[-1][1] if delta else 0
    if not total:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for le, count in delta:
        if count >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * ((rank - below) / max(count - below, 1e-9))
        lower, below = le, count
    return lower


# ---- the audit log ------------------------------------------------------------------------------

def cpu_seconds(state: Path, operator_pid: int | None = None) -> dict[str, float]:
    """CPU seconds (user + system) each cluster process (by its pidfile) and the operator have used
    so far: on a 2-core machine every component takes from the same cores, so where the time went
    explains a ratio better than the ratio does. kubectl (the floor) is counted as this process's
    waited-for children."""
    tick = os.sysconf("SC_CLK_TCK")
    pids = {f.stem: int(text) for f in (state / "run").glob("*.pid") if (text := f.read_text().strip()).isdigit()}
    if operator_pid is not None:
        pids["operator"] = operator_pid
    out = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime (stat fields 14, 15)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    out["kubectl"] = usage.ru_utime + usage.ru_stime
    return out


def cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before.get(k, 0.0), 1) for k in sorted(after) if after[k] - before.get(k, 0.0) >= 0.05}


def operator_requests(state: Path, since: datetime, until: datetime) -> list[dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(state.glob("audit*.log")):
        with path.open() as lines:
            for line in lines:
                if OPERATOR_USER not in line:
                    continue
                event = json.loads(line)
                if (event.get("user") or {}).get("username") != OPERATOR_USER:
                    continue
                received = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
                if since <= received < until:
                    found[event["auditID"]] = event
    return list(found.values())


def _what(event: dict[str, Any]) -> str:
    """"patch leaderworkersets", "patch kimik3deployments/status", "create events"..."""
    ref = event.get("objectRef") or {}
    sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
    return f"{event['verb']} {ref.get('resource', '?')}{sub}"


def _is_lease(event: dict[str, Any]) -> bool:
    return (event.get("objectRef") or {}).get("resource") == "leases"


# ---- one size -----------------------------------------------------------------------------------

def delete_namespace(namespace: str) -> None:
    subprocess.run(["kubectl", "delete", "namespace", namespace, "--ignore-not-found", "--timeout=900s"],
                   capture_output=True, text=True, timeout=960)


def run_operator(n: int, op: Operator, reader: Reader, state: Path, idle: float, folder: Path) -> dict[str, Any]:
    namespace = f"bench-op-{n}"
    delete_namespace(namespace)
    kubectl("create", "namespace", namespace)
    crs = [deployment(namespace, i) for i in range(n)]
    manifest = folder / f"deployments-{n}.yaml"
    manifest.write_text(yaml.safe_dump_all(crs))
    scraped = op.scrape()
    histograms = {k: buckets(scraped, m) for k, m in HISTOGRAMS.items()}
    events_before = labelled(scraped, CHILD_EVENTS, "kind")
    log(f"N={n}: applying {n} KimiK3Deployments")
    cpu_before = cpu_seconds(state, op.proc.pid)
    started, applied_at = time.monotonic(), datetime.now(UTC)
    kubectl("apply", "--server-side", "-f", str(manifest))
    timeline: list[tuple[float, Counter[str]]] = []
    deadline = started + 600 + 4 * n
    while True:
        counts = reader.children_per_deployment(namespace)
        timeline.append((time.monotonic() - started, counts))
        ready = reader.ready_deployments(namespace)
        if ready == n:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"N={n}: only {ready} of {n} Ready after {deadline - started:.0f} s; "
                               f"operator log:\n{op.log.read_text()[-3000:]}")
        time.sleep(1)
    ready_seconds = time.monotonic() - started
    cpu = cpu_used(cpu_before, cpu_seconds(state, op.proc.pid))
    final = reader.children_per_deployment(namespace)
    children_seconds = next(t for t, c in timeline if all(c[d] >= final[d] for d in final))
    after = op.scrape()
    quantiles = {f"{kind}_{name}_ms": (round(v * 1000, 1) if (v := quantile(histograms[kind], buckets(after, m), q))
                                        is not None else None)
                 for kind, m in HISTOGRAMS.items() for name, q in (("p50", 0.5), ("p99", 0.99))}
    passes = buckets(after, HISTOGRAMS["total"]).get(float("inf"), 0) - histograms["total"].get(float("inf"), 0)
    child_events = labelled(after, CHILD_EVENTS, "kind")
    child_events.subtract(events_before)
    log(f"N={n}: children in {children_seconds:.1f} s, all Ready in {ready_seconds:.1f} s; idle for {idle:.0f} s")
    # What the operator wrote to bring them up (the floor writes each child once: 10 per deployment).
    writes = Counter(_what(e) for e in operator_requests(state, applied_at, datetime.now(UTC))
                     if e["verb"] in WRITES and not _is_lease(e))
    since = datetime.now(UTC)
    time.sleep(idle)
    until = datetime.now(UTC)
    requests = operator_requests(state, since, until)
    minutes = (until - since).total_seconds() / 60
    by_verb = Counter(e["verb"] for e in requests if not _is_lease(e))
    result = {
        "n": n, "children": sum(final.values()), "operator_seconds": round(children_seconds, 2),
        "ready_seconds": round(ready_seconds, 2), "passes": int(passes), **quantiles,
        "child_events_per_deployment": {k: round(v / n, 2) for k, v in sorted(child_events.items()) if v},
        "writes_per_deployment": round(sum(writes.values()) / n, 1),
        "writes_by_kind": {k: round(c / n, 2) for k, c in sorted(writes.items())},
        "idle_requests_per_minute": {v: round(c / minutes, 1) for v, c in sorted(by_verb.items())},
        "idle_reads_per_minute": round(sum(c for v, c in by_verb.items() if v not in WRITES) / minutes, 1),
        "idle_writes": sum(c for v, c in by_verb.items() if v in WRITES),
        "rss_mb": round(op.rss_mb(), 1),
        "cpu_seconds_until_ready": cpu,
    }
    delete_namespace(namespace)
    return result


def run_floor(n: int, reader: Reader, state: Path, folder: Path) -> dict[str, Any]:
    namespace = f"bench-floor-{n}"
    delete_namespace(namespace)
    kubectl("create", "namespace", namespace)
    nodes = json.loads(kubectl("get", "nodes", "-l", FLEET_LABEL, "-o", "json"))["items"]
    objects = [o for i in range(n) for o in rendered(deployment(namespace, i), nodes)]
    stages = {stage: [o for o in objects if (BY_KIND[o["kind"]].stage == WEIGHTS) == (stage == "weights")]
              for stage in ("weights", "serving")}
    files = {}
    for stage, objs in stages.items():
        files[stage] = folder / f"floor-{n}-{stage}.yaml"
        files[stage].write_text(yaml.safe_dump_all(objs))
    jobs = sum(1 for o in stages["weights"] if o["kind"] == "Job")
    log(f"N={n}: floor: applying {len(objects)} objects with kubectl in two steps")
    cpu_before = cpu_seconds(state)
    started = time.monotonic()
    kubectl("apply", "--server-side", "--field-manager=floor", "-f", str(files["weights"]))
    weights_applied = time.monotonic()
    while reader.succeeded_jobs(namespace) < jobs:
        if time.monotonic() > started + 600 + 4 * n:
            raise RuntimeError(f"N={n}: floor Jobs did not complete")
        time.sleep(1)
    jobs_done = time.monotonic()
    kubectl("apply", "--server-side", "--field-manager=floor", "-f", str(files["serving"]))
    done = time.monotonic()
    cpu = cpu_used(cpu_before, cpu_seconds(state))
    delete_namespace(namespace)
    return {"floor_seconds": round(done - started, 2),
            "floor_steps_seconds": {"apply weights": round(weights_applied - started, 1),
                                    "Jobs complete": round(jobs_done - weights_applied, 1),
                                    "apply serving": round(done - jobs_done, 1)},
            "floor_cpu_seconds": cpu}


def table(runs: list[dict[str, Any]]) -> str:
    head = ("| N | operator s | floor s | ratio | Ready s | pass p50/p99 ms | pure p50/p99 ms | pure CPU p50/p99 ms "
            "| API p50/p99 ms | idle reads/min | idle writes | RSS MB |")
    rows = [head, "|" + "---|" * 12]
    for r in runs:
        def pair(kind: str, r: dict[str, Any] = r) -> str:
            return f"{r.get(f'{kind}_p50_ms')} / {r.get(f'{kind}_p99_ms')}"
        rows.append(f"| {r['n']} | {r.get('operator_seconds', '')} | {r.get('floor_seconds', '')} | "
                    f"{r.get('ratio', '')} | {r.get('ready_seconds', '')} | {pair('total')} | {pair('pure')} | "
                    f"{pair('pure_cpu')} | {pair('api')} | {r.get('idle_reads_per_minute', '')} | "
                    f"{r.get('idle_writes', '')} | {r.get('rss_mb', '')} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,100,300")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rss-size", type=int, default=500)
    parser.add_argument("--idle", type=float, default=120.0)
    parser.add_argument("--operator-src", type=Path, default=ROOT / "operator")
    parser.add_argument("--label", default=None, help="results file suffix (default: the checkout's commit)")
    parser.add_argument("--no-floor", action="store_true", help="skip the kubectl floor runs")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if max([*sizes, args.rss_size]) > args.nodes:
        parser.error("each deployment takes one node: --nodes must be at least the largest size")
    state = Path(os.environ["KIMIK3_STATE"])
    label = args.label or subprocess.run(["git", "-C", str(args.operator_src), "rev-parse", "--short", "HEAD"],
                                         capture_output=True, text=True).stdout.strip() or "unknown"
    folder = Path(os.environ.get("KIMIK3_BENCH_WORK", state / "bench")) / label
    folder.mkdir(parents=True, exist_ok=True)
    config.load_kube_config()
    core = client.CoreV1Api()
    kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
    deadline = time.monotonic() + 60
    while True:  # kubectl wait fails at once (not waits) while the new CRD's status.conditions is still null
        try:
            kubectl("wait", "--for=condition=Established", f"crd/kimik3deployments.{GROUP}", "--timeout=60s")
            break
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    ensure_fleet(core, args.nodes, folder)
    stager = FakeStager(core)
    stager.start()
    reader = Reader()
    op = Operator(args.operator_src, state, folder)
    runs: list[dict[str, Any]] = []
    try:
        for n in sizes:
            result = run_operator(n, op, reader, state, args.idle, folder)
            if not args.no_floor:
                result.update(run_floor(n, reader, state, folder))
                result["ratio"] = round(result["operator_seconds"] / result["floor_seconds"], 2)
            runs.append(result)
            log(json.dumps(result))
        rss = None
        if args.rss_size:
            big = run_operator(args.rss_size, op, reader, state, min(args.idle, 30.0), folder)
            rss = {"n": args.rss_size, "rss_mb": big["rss_mb"], "operator_seconds": big["operator_seconds"]}
            log(json.dumps(big))
    finally:
        op.stop()
        stager.stop.set()
    out = {"label": label, "operator_src": str(args.operator_src), "nodes": args.nodes, "idle_seconds": args.idle,
           "finished": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "runs": runs, "rss": rss}
    results = ROOT / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / f"control_plane-{label}.json").write_text(json.dumps(out, indent=2) + "\n")
    print(table(runs))
    if rss:
        print(f"\noperator RSS at N={rss['n']}: {rss['rss_mb']} MB")


if __name__ == "__main__":
    main()
