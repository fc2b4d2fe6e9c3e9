"""kimik3-router against vllm-router 0.1.17, side by side on the same simulators and the same trace
(project issue 40, item 7). Loopback only; no cluster needed; every loop is bounded in count and time.

Each run starts a fresh fleet of engine simulators for each router (the golden scenario
`b200-dep16-disaggregated`'s rendered prefill and decode commands, DP2 each, NIXL hand-off on
loopback): neither router warms the other's prefix caches. The routers get the same engines by URL
(static lists: discovery is timed separately, by `router/tests/discovery.rs` and the e2e suite) and
the deployment's default policies, `cache_aware` for prefill and for decode.

Per router and run:
- the `history` trace of bench/traffic.py (a short system prompt per conversation, long turns,
  what a prefill can reuse is the conversation's own history), open loop, streamed; every outcome
  counts (HTTP errors, broken streams, refused connections);
- the prefill prefix-hit rate: prompt tokens the prefill engines found in their own cache over prompt
  tokens, from each simulator's per-request records;
- the router's CPU (utime + stime of its process, from /proc) over the trace, per request and per
  relayed chunk (the chunks the client received);
- for kimik3-router, the time it adds, measured inside it (`kimik3_router_added_seconds`: request
  headers in -> the first leg sent upstream; an upstream chunk in -> handed to the client), from the
  histogram's buckets as Prometheus' histogram_quantile interpolates them;
- routed-minus-direct TTFT: the same requests, one at a time, straight to one prefill and one decode
  with the hand-off the router makes (bench/traffic.py direct_pair), against the same through the
  router; the p50 of the difference and its spread (p10-p90).

`--smoke` is what CI runs: one run, a few dozen requests, both routers; it fails loudly when a router
cannot serve the trace. The full run's table is committed in bench/results/router.md.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "operator"), str(ROOT / "simulator"), str(ROOT / "bench")]

from kubernetes import client, config  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from traffic import MODEL, TRACES, Load, direct_pair  # noqa: E402

from e2e.harness.kube import kubectl, wait_for  # noqa: E402
from e2e.harness.pod_runner import (  # noqa: E402
    _api_server_env,
    _cluster_ca,
    free_port,
    router_binary,
    router_venv,
)
from e2e.harness.traffic import SESSION, Answer, metric_line, post, prompt  # noqa: E402
from tests.simulator import sims  # noqa: E402

SCENARIO = "b200-dep16-disaggregated"
PREFILL_POLICY, DECODE_POLICY = "cache_aware", "cache_aware"
"""The deployment's defaults (api/router_policies.py): both routers spell them alike."""
TICK = os.sysconf("SC_CLK_TCK")


def kimik3_argv(port: int, metrics: int, prefills: list[str], decodes: list[str],
                prefill_policy: str = PREFILL_POLICY) -> list[str]:
    return [str(router_binary()), "--mode", "pd", "--served-model-name", MODEL,
            "--host", "127.0.0.1", "--port", str(port), "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics),
            "--prefill-policy", prefill_policy, "--decode-policy", DECODE_POLICY,
            *(a for u in prefills for a in ("--prefill", u)), *(a for u in decodes for a in ("--decode", u))]


def vllm_argv(port: int, metrics: int, prefills: list[str], decodes: list[str]) -> list[str]:
    return [str(router_venv() / "bin" / "vllm-router"), "--vllm-pd-disaggregation", "--kv-connector", "nixl",
            "--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(metrics), "--prefill-policy", PREFILL_POLICY, "--decode-policy", DECODE_POLICY,
            "--health-check-interval-secs", "1",
            *(a for u in prefills for a in ("--prefill", u)), *(a for u in decodes for a in ("--decode", u))]


def kimik3_no_migration_argv(port: int, metrics: int, prefills: list[str], decodes: list[str]) -> list[str]:
    return [*kimik3_argv(port, metrics, prefills, decodes), "--max-migrations", "0"]


def kimik3_precise_argv(port: int, metrics: int, prefills: list[str], decodes: list[str]) -> list[str]:
    return [*kimik3_argv(port, metrics, prefills, decodes, "precise_prefix"), "--kv-events", "true"]


ROUTERS = {"kimik3-router": (kimik3_argv, "/health"), "vllm-router 0.1.17": (vllm_argv, "/readiness")}
"""One row per router: its command line and the path that answers 200 once it can route."""
MIGRATION_OFF = "kimik3-router --max-migrations 0"
PRECISE = "kimik3-router precise_prefix"
VARIANTS = {MIGRATION_OFF: (kimik3_no_migration_argv, "/health"), PRECISE: (kimik3_precise_argv, "/health")}
"""Rows --migration-ab and --precise add: what a stream's migration state costs per chunk
(docs/migration.md); the prefill hit rate of routing by the engines' KV events (docs/kv-events.md)."""


@dataclass
class Fleet:
    prefills: list[sims.Sim]
    decodes: list[sims.Sim]
    stack: contextlib.ExitStack

    @classmethod
    def start(cls, tmp: Path, prefills: int, decodes: int) -> Fleet:
        """The simulators, each healthy (tests/simulator/sims.py `simulator`, stopped with the stack)."""
        stack = contextlib.ExitStack()

        def role(name: str, count: int) -> list[sims.Sim]:
            report = sims.role_report(SCENARIO, name, scale_out=True)
            env = {"K3SIM_GPU_PRODUCT": report["gpuProduct"]}
            return [stack.enter_context(sims.simulator([*report["command"], *events(name)], tmp, env))
                    for _ in range(count)]

        def events(name: str) -> list[str]:
            """Prefills publish KV events (what precise_prefix follows; the other routers ignore them)."""
            if name != "prefill":
                return []
            base = sims.free_port_base(16)
            config = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{base}",
                      "replay_endpoint": f"tcp://*:{base + 8}"}
            return ["--kv-events-config", json.dumps(config)]
        with stack:
            fleet = cls(role("prefill", prefills), role("decode", decodes), stack.pop_all())
        return fleet

    def hit_rate(self) -> float | None:
        records = [r for sim in self.prefills for r in sim.stats()["by_request_id"].values()]
        tokens = sum(r["prompt_tokens"] for r in records)
        return sum(r["local_cache_hit_tokens"] for r in records) / tokens if tokens else None

    def stop(self) -> None:
        self.stack.close()


@dataclass
class Running:
    process: subprocess.Popen[bytes]
    url: str
    metrics_url: str

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (proc(5): fields 14 and 15)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)


def start_router(name: str, fleet: Fleet, tmp: Path) -> Running:
    argv_of, ready_path = {**ROUTERS, **VARIANTS}[name]
    port, metrics = free_port(), free_port()
    argv = argv_of(port, metrics, [s.url for s in fleet.prefills], [s.url for s in fleet.decodes])
    log = (tmp / f"router-{port}.log").open("ab")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               env={"PATH": "/usr/bin:/bin", "HOME": str(tmp), "NO_PROXY": "127.0.0.0/8"})
    running = Running(process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics}/metrics")
    try:
        wait_for(f"{name} ready ({argv[0]}; log {log.name})", lambda: _answers(running, running.url + ready_path),
                 timeout=60, interval=0.2)
    except BaseException:
        running.stop()
        raise
    return running


def _answers(running: Running, url: str) -> bool:
    """`url` answers 200; a router that exited fails at once, with its code."""
    if running.process.poll() is not None:
        raise SystemExit(f"FAILED: the router exited with {running.process.returncode}")
    try:
        return SESSION.get(url, timeout=1).status_code == 200
    except OSError:
        return False


def added_buckets(metrics_url: str) -> dict[str, dict[float, float]]:
    """kimik3_router_added_seconds' cumulative bucket counts by stage."""
    out: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(SESSION.get(metrics_url, timeout=5).text):
        if family.name == "kimik3_router_added_seconds":
            for s in family.samples:
                if s.name.endswith("_bucket"):
                    out.setdefault(s.labels["stage"], {})[float(s.labels["le"])] = s.value
    return out


def quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float | None:
    """histogram_quantile over the increase between two scrapes: linear within the bucket, from 0 for
    the first. None with no observation; the top bound when the quantile is past the last finite one."""
    bounds = sorted(b for b in after if b != float("inf"))
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = after.get(float("inf"), counts[-1] if counts else 0.0) - before.get(float("inf"), 0.0)
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound, cumulative in zip(bounds, counts, strict=True):
        if cumulative >= rank:
            return lower + (bound - lower) * ((rank - below) / (cumulative - below) if cumulative > below else 1.0)
        lower, below = bound, cumulative
    return bounds[-1] if bounds else None


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Result:
    router: str
    run: int
    sent: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    chunks: int = 0
    cpu: float = 0.0
    seconds: float = 0.0
    hit_rate: float | None = None
    added: dict[str, tuple[float | None, float | None, float]] = field(default_factory=dict)
    """stage -> (p50, p99, observations)"""
    ttft_p50: float | None = None
    routed_minus_direct: list[float] = field(default_factory=list)
    stream_cpu_per_chunk: float | None = None
    """CPU seconds per relayed chunk over long streams, where relaying is nearly all the router does."""


def failure_of(answer: Answer) -> str | None:
    if answer.status == 200 and answer.done and not answer.error:
        return None
    if answer.status == 0:
        return f"no answer: {answer.error[:60]}"
    return f"HTTP {answer.status}" if answer.status != 200 else f"stream: {answer.error[:60] or 'no [DONE]'}"


def run_one(name: str, run: int, args: argparse.Namespace, tmp: Path) -> Result:
    fleet = Fleet.start(tmp, args.prefills, args.decodes)
    result = Result(name, run)
    router = None
    try:
        router = start_router(name, fleet, tmp)
        trace = argparse.Namespace(trace="history", conversations=args.conversations, turns=args.turns,
                                   interval=args.interval, max_requests=args.requests, max_tokens=args.max_tokens,
                                   **TRACES["history"])
        load = Load(f"{name.split()[0]}{run}", lambda: router.url, trace)
        before = added_buckets(router.metrics_url) if name == "kimik3-router" else {}
        cpu0, t0 = router.cpu_seconds(), time.monotonic()
        runner = threading.Thread(target=load.run, daemon=True)
        runner.start()
        runner.join(args.requests * args.interval + 180)
        load.stop.set()
        runner.join(70)
        result.cpu, result.seconds = router.cpu_seconds() - cpu0, time.monotonic() - t0
        answers = [o.answer for o in load.outcomes]
        result.sent = load._sent
        for answer in answers:
            if (kind := failure_of(answer)) is not None:
                result.failed[kind] = result.failed.get(kind, 0) + 1
        unanswered = result.sent - len(answers)
        if unanswered:
            result.failed["no outcome within the bound"] = unanswered
        result.chunks = sum(len(a.gaps) + 1 for a in answers if a.status == 200 and a.ttft is not None)
        result.ttft_p50 = pct([a.ttft for a in answers if a.ttft is not None], 0.5)
        result.hit_rate = fleet.hit_rate()
        if before:
            after = added_buckets(router.metrics_url)
            for stage, buckets in after.items():
                count = buckets.get(float("inf"), 0.0) - before.get(stage, {}).get(float("inf"), 0.0)
                result.added[stage] = (quantile(0.5, before.get(stage, {}), buckets),
                                       quantile(0.99, before.get(stage, {}), buckets), count)
        result.routed_minus_direct = compare_direct(router.url, fleet, args.direct)
        result.stream_cpu_per_chunk = long_streams(router, args.streams)
    finally:
        if router is not None:
            router.stop()
        fleet.stop()
    return result


def compare_direct(url: str, fleet: Fleet, count: int) -> list[float]:
    """Pairs of one request straight to the first prefill and decode, then the same request (a new
    prompt of the same size, so neither hits the other's cache) through the router: TTFT differences."""
    differences = []
    for _ in range(count):
        tag = uuid.uuid4().hex[:12]
        body: dict[str, Any] = {"model": MODEL, "max_tokens": 4, "stream": True,
                                "messages": [{"role": "user", "content": prompt(2000, f"direct{tag}-")}]}
        direct = direct_pair(fleet.prefills[0].url, fleet.decodes[0].url, body)
        routed_body = {**body, "messages": [{"role": "user", "content": prompt(2000, f"routed{tag}-")}]}
        routed = post(url, "/v1/chat/completions", routed_body, timeout=60)
        if direct.ttft is not None and routed.ttft is not None:
            differences.append(routed.ttft - direct.ttft)
    return differences


def long_streams(router: Running, count: int, tokens: int = 256, at_once: int = 4) -> float | None:
    """`count` streams of `tokens` tokens each, `at_once` at a time: the router's CPU per chunk relayed."""
    answers: list[Answer] = []

    def one() -> None:
        body = {"model": MODEL, "max_tokens": tokens, "stream": True, "ignore_eos": True,
                "messages": [{"role": "user", "content": prompt(64, f"stream{uuid.uuid4().hex[:12]}-")}]}
        answers.append(post(router.url, "/v1/chat/completions", body, timeout=120))

    cpu0 = router.cpu_seconds()
    for first in range(0, count, at_once):
        threads = [threading.Thread(target=one) for _ in range(first, min(count, first + at_once))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(150)
    chunks = sum(len(a.gaps) + 1 for a in answers if a.status == 200 and a.done)
    return (router.cpu_seconds() - cpu0) / chunks if chunks else None


def _ms(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value * 1000:.{digits}f}"


def report(results: list[Result], args: argparse.Namespace) -> str:
    lines = [f"# kimik3-router against vllm-router 0.1.17 ({'smoke' if args.smoke else 'full'})", "",
             f"Trace: history, {args.requests} requests per router and run, one every {args.interval} s, "
             f"{args.conversations} conversations of up to {args.turns} turns, {args.max_tokens} tokens each; "
             f"{args.prefills} prefill + {args.decodes} decode simulators (DP2 each, {SCENARIO}); policies "
             f"{PREFILL_POLICY}/{DECODE_POLICY}; {args.runs} run(s); "
             f"{os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d')}.", "",
             "| router | run | sent | failed | prefix-hit | CPU ms/request | CPU us/chunk | client TTFT p50 ms "
             "| routed-minus-direct TTFT p50 ms (p10..p90) | CPU us/chunk, long streams |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        rmd = r.routed_minus_direct
        spread = f"{_ms(pct(rmd, 0.5))} ({_ms(pct(rmd, 0.1))}..{_ms(pct(rmd, 0.9))})" if rmd else "-"
        lines.append(
            f"| {r.router} | {r.run} | {r.sent} | {sum(r.failed.values())} {r.failed or ''} | "
            f"{'-' if r.hit_rate is None else f'{r.hit_rate:.3f}'} | "
            f"{r.cpu * 1000 / max(r.sent, 1):.3f} | {r.cpu * 1e6 / max(r.chunks, 1):.1f} | "
            f"{_ms(r.ttft_p50, 1)} | {spread} | "
            f"{'-' if r.stream_cpu_per_chunk is None else f'{r.stream_cpu_per_chunk * 1e6:.1f}'} |")
    lines += ["", "Means over the runs:", "", "| router | prefix-hit | CPU ms/request | CPU us/chunk |",
              "|---|---|---|---|"]
    for name in dict.fromkeys(r.router for r in results):
        mine = [r for r in results if r.router == name]
        hits = [r.hit_rate for r in mine if r.hit_rate is not None]
        lines.append(f"| {name} | {statistics.mean(hits):.3f} | "
                     f"{statistics.mean(r.cpu * 1000 / max(r.sent, 1) for r in mine):.3f} | "
                     f"{statistics.mean(r.cpu * 1e6 / max(r.chunks, 1) for r in mine):.1f} |" if hits else
                     f"| {name} | - | - | - |")
    lines += ["", "Time kimik3-router adds, measured inside it (kimik3_router_added_seconds, "
              "interpolated within its buckets):", "", "| run | stage | observations | p50 ms | p99 ms |",
              "|---|---|---|---|---|"]
    for r in results:
        for stage, (p50, p99, count) in sorted(r.added.items()):
            lines.append(f"| {r.run} | {stage} | {count:.0f} | {_ms(p50, 3)} | {_ms(p99, 3)} |")
    return "\n".join(lines) + "\n"


# -- discovery: Ready -> routable and terminating -> unrouted, on a real API server ------------------

BENCH_LABEL = "kimik3-router-bench"
HEALTHY = "kimik3_router_engine_healthy"
"""1 while the router routes to the engine (its `engine` label: address:port)."""
POLL = 0.005
"""Seconds between looks at the router's metrics while an event is timed."""
DISCOVERY_RBAC = """
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: pod-reader, namespace: {ns}}}
rules: [{{apiGroups: [""], resources: [pods], verbs: [get, list, watch]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: pod-reader, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: pod-reader}}
subjects: [{{kind: ServiceAccount, name: default, namespace: {ns}}}]
"""


class _Engine(http.server.BaseHTTPRequestHandler):
    """Enough of an engine for discovery: /health 200, /metrics with no rank (one worker)."""

    def do_GET(self) -> None:
        self.send_response(200 if self.path in ("/health", "/metrics") else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _pod(ns: str, name: str, role: str) -> dict[str, Any]:
    """A pod no scheduler takes (its schedulerName is nobody's) and no kubelet runs: this bench sets its
    status, as a kubelet would; a finalizer holds it while it terminates."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": ns, "labels": {"app": BENCH_LABEL, "role": role},
        "finalizers": ["kimik3.dev/router-bench"]}, "spec": {
        "schedulerName": "kimik3-router-bench-nobody", "containers": [{"name": "engine", "image": "none"}]}}


def _status(ip: str) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": now}]}}


def discovery(events: int, tmp: Path) -> tuple[list[float], list[float]]:
    """`events` pods, one after another: each turned Ready (status written as a kubelet writes it),
    timed until the router lists it routable; then deleted (terminating, held by a finalizer), timed
    until the router no longer routes it. Times start when the API server has accepted the write."""
    if "KUBECONFIG" not in os.environ:
        raise SystemExit("FAILED: --discovery needs a cluster: eval \"$(e2e/cluster/cluster.sh env)\" first")
    ns = f"router-bench-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", ns)
    servers = []
    try:
        kubectl("apply", "-f", "-", input=DISCOVERY_RBAC.format(ns=ns))
        token = kubectl("create", "token", "default", "-n", ns, "--duration=1h").stdout.strip()
        folder = tmp / "token"
        folder.mkdir()
        (folder / "token").write_text(token)
        (folder / "ca.crt").write_bytes(_cluster_ca())
        engine_port = free_port()
        addresses = [f"127.0.0.{i}" for i in range(2, 12)]
        for address in addresses:
            server = http.server.ThreadingHTTPServer((address, engine_port), _Engine)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            servers.append(server)
        port, metrics = free_port(), free_port()
        argv = [str(router_binary()), "--mode", "pd", "--served-model-name", MODEL, "--namespace", ns,
                "--host", "127.0.0.1", "--port", str(port), "--metrics-host", "127.0.0.1",
                "--metrics-port", str(metrics), "--engine-port", str(engine_port), "--kube-token-dir", str(folder),
                "--prefill-selector", f"app={BENCH_LABEL},role=prefill",
                "--decode-selector", f"app={BENCH_LABEL},role=decode"]
        log = (tmp / "discovery-router.log").open("ab")
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={"PATH": "/usr/bin:/bin", "HOME": str(tmp), "NO_PROXY": "127.0.0.0/8",
                                        **_api_server_env()})
        router = Running(process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics}/metrics")
        try:
            wait_for("the router answering", lambda: _answers(router, router.metrics_url), timeout=30, interval=0.05)
            ready, gone = [], []
            api = client.CoreV1Api(config.new_client_from_config(config_file=os.environ["KUBECONFIG"]))
            for i in range(events):
                name, ip = f"decode-{i}", addresses[i % len(addresses)]
                engine = f"{ip}:{engine_port}"
                api.create_namespaced_pod(ns, _pod(ns, name, "decode"))
                # Timed from before the write is sent: an upper bound on what the router takes.
                sent = time.monotonic()
                api.patch_namespaced_pod_status(name, ns, _status(ip))
                wait_for(f"{name} routable", lambda e=engine: metric_line(router.metrics_url, HEALTHY, engine=e) == 1.0,
                         timeout=30, interval=POLL)
                ready.append(time.monotonic() - sent)
                sent = time.monotonic()
                api.delete_namespaced_pod(name, ns)
                wait_for(f"{name} unrouted", lambda e=engine: metric_line(router.metrics_url, HEALTHY, engine=e) != 1.0,
                         timeout=30, interval=POLL)
                gone.append(time.monotonic() - sent)
                api.patch_namespaced_pod(name, ns, [{"op": "remove", "path": "/metadata/finalizers"}])
            return ready, gone
        finally:
            router.stop()
    finally:
        for server in servers:
            server.shutdown()
        kubectl("delete", "namespace", ns, "--wait=false", check=False)


SMOKE = {"runs": 1, "requests": 40, "interval": 0.1, "direct": 4, "streams": 8}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1000, help="per router and run")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between requests (open loop)")
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--prefills", type=int, default=2)
    parser.add_argument("--decodes", type=int, default=2)
    parser.add_argument("--direct", type=int, default=30, help="direct/routed pairs per router and run")
    parser.add_argument("--streams", type=int, default=40, help="long streams per router and run (CPU per chunk)")
    parser.add_argument("--discovery", type=int, default=0,
                        help="pods turned Ready then deleted, one after another, on the cluster of $KUBECONFIG")
    parser.add_argument("--smoke", action="store_true", help=f"CI: {SMOKE}")
    parser.add_argument("--precise", action="store_true",
                        help=f"also run `{PRECISE}` (prefill routed by the engines' KV events)")
    parser.add_argument("--migration-ab", action="store_true",
                        help=f"also run `{MIGRATION_OFF}` (kimik3-router without its migration state)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "router.md")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    results = []
    found: tuple[list[float], list[float]] = ([], [])
    with tempfile.TemporaryDirectory(prefix="kimik3-router-bench-") as tmp:
        for run in range(1, args.runs + 1):
            names = [*ROUTERS, *([MIGRATION_OFF] if args.migration_ab else []), *([PRECISE] if args.precise else [])]
            for name in names:  # alternated, so a drift of the machine touches both
                print(f"[router-bench] run {run}: {name}", file=sys.stderr, flush=True)
                results.append(run_one(name, run, args, Path(tmp)))
        if args.discovery:
            print(f"[router-bench] discovery: {args.discovery} pods", file=sys.stderr, flush=True)
            found = discovery(args.discovery, Path(tmp))
    text = report(results, args) if results else f"# kimik3-router discovery ({time.strftime('%Y-%m-%d')})\n"
    if found[0]:
        text += ("\nDiscovery on a real API server (kimik3-router's watch; a pod's status written as a kubelet "
                 "writes it, timed from before the write until the router's metrics say so, polled every 5 ms):\n\n"
                 "| event | count | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|\n")
        for what, times in (("Ready -> routable", found[0]), ("terminating -> unrouted", found[1])):
            text += (f"| {what} | {len(times)} | {_ms(pct(times, 0.5), 1)} | {_ms(pct(times, 0.99), 1)} | "
                     f"{_ms(max(times), 1)} |\n")
    args.out.write_text(text)
    print(text)
    # Ours must serve every request of a healthy fleet; the baseline's failures are reported, not judged.
    broken = [r for r in results if r.hit_rate is None or (r.router == "kimik3-router" and r.failed)]
    if broken:
        raise SystemExit(f"FAILED: the trace was not served: {[(r.router, r.run, r.failed) for r in broken]}")


if __name__ == "__main__":
    main()
