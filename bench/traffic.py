"""The endpoint under change: an agentic trace through the router while the deployment scales and
rolls, for two router designs side by side in one run (project issue 21, item 5).

- `static`: the design before discovery, emulated at its best: a real vllm-router started with the
  routed engines listed on its command line (`--prefill URL --decode URL`, the Ready leaders of the
  newest revision that has both kinds), and restarted whenever that set changes: the new router
  first, traffic switched once its /readiness answers, the old one drained (preStop 10 s, then
  SIGTERM), as a rolling Deployment with maxUnavailable 0 would. (The old operator also paused the
  router at 0 replicas between revisions: not emulated, so its figures are a floor.)
- `discovery`: the deployment's own router pods (vllm-router's Kubernetes discovery, one router per
  P/D revision), each request to the next Ready router pod, as its Service spreads them.

The designs run one after the other over the same phases, each with its own conversations and its
own system prompt (so neither warms the other's prefix cache): `steady`, `scale-up` (decode 2 -> 4,
until Ready), `scale-down` (4 -> 2, until the pods are gone), `after-scale`, `rollout` (a change of
the P/D compatibility hash, until the new revision serves alone) and `after-rollout`. The load is
open loop (one request every `--interval` seconds, whatever the answers): each request is the next
turn of an idle conversation, a shared system prompt of `--system-words` words and the conversation
so far, streamed; a conversation restarts after `--turns` turns. Every outcome counts: an HTTP
error, a broken stream, a refused connection, and a moment with no router to send to.

Figures per design and phase: requests sent and failed (by kind), the prefill prefix-hit rate
(tokens the prefill engines found in their prefix cache over prompt tokens, from each engine's
per-request records, polled every second so that engines scaled away still count), TTFT and
inter-token gap p50/p99 at the client, and router starts. Last, `direct`: the same kind of requests,
one at a time, sent straight to one prefill and one decode engine with the two-step NIXL hand-off
the router makes (vllm-router 0.1.17 routers/http/vllm_pd_router.rs, build_prefill_kv_transfer_params),
against the same through the router: what the router adds to TTFT.

Then `policies`: per pair of router policies (prefill/decode; the routers roll onto each), what the
router adds to TTFT, and the prefill prefix-hit rate of the trace through it: vllm-router 0.1.17's
cache_aware tokenizes every prompt on every engine before it picks one, round_robin asks nothing
and keeps no affinity, consistent_hash asks nothing and keeps a conversation (its X-Session-ID
header) on one engine (docs/vllm-facts.md §8).

Two traces (`--trace`): `shared`, one long system prompt in every request (the prefix any engine
holds after a few requests), and `history`, a short system prompt per conversation and long turns
(tool outputs), where what a prefill can reuse is the conversation's own history, held only by the
engine that served its last turn: the trace that shows what prefix affinity buys, and what a router
restart (its prefix tree lost) costs. `--prefill-replicas` adds prefill engines first.

Runs against the demo cluster (`scripts/demo.sh`, which leaves it up; `bench/traffic.sh` does both;
CI runs `--quick --trace history` against its demo's deployment after the tests). Loopback only;
every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import json
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
sys.path[:0] = [str(ROOT), str(ROOT / "operator")]

from e2e.harness.kube import is_ready, kubectl  # noqa: E402
from e2e.harness.pod_runner import free_port, router_venv  # noqa: E402
from e2e.harness.traffic import SESSION, Answer, failure_kinds, post, prompt  # noqa: E402
from kimik3_operator.render.names import LABEL_COMPAT  # noqa: E402
from kimik3_operator.render.router import LABEL_REVISION, POLICY_FLAG  # noqa: E402

COMPONENT = "app.kubernetes.io/component"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
COMPAT, REVISION = LABEL_COMPAT, LABEL_REVISION
"""On serving pods: their P/D revision; on a P/D router's pods: the revision it pairs."""
MODEL = "kimi-k3"
"""The served model name (the rendered --served-model-name)."""
ENGINE_PORT = 8000
DISCOVERY_FLAGS = {"--service-discovery", "--service-discovery-namespace", "--service-discovery-port",
                   "--prefill-selector", "--decode-selector", "--host", "--port", "--prometheus-host",
                   "--prometheus-port", "--health-check-interval-secs"}
"""Flags of the rendered router command line that the static router replaces (each with its values)."""
PRE_STOP_SECONDS = 10.0
BENCH_IMAGE = "vllm/vllm-openai:v0.33.0-rebuilt"
"""A serving image tag for the rollouts (kwok runs no image; the simulator plays every engine alike)."""


def _static_base(args: list[str]) -> list[str]:
    """vllm-router's arguments for the static design, less its engine lists: the rendered ones without
    discovery when the deployment runs vllm-router; when it runs kimik3-router (every flag of which
    takes a value), the same policies and body cap on vllm-router's P/D flags."""
    if "--service-discovery" in args:
        return _without(args, DISCOVERY_FLAGS)
    flags = dict(zip(args[::2], args[1::2], strict=False))
    return ["--vllm-pd-disaggregation", "--kv-connector", "nixl", "--prefill-policy", flags["--prefill-policy"],
            "--decode-policy", flags["--decode-policy"], "--max-payload-size", flags["--max-payload-size"]]


def _ready(pod: dict[str, Any]) -> bool:
    """Ready and not on its way out (what a Service would still send to)."""
    return not pod["metadata"].get("deletionTimestamp") and is_ready(pod)


@dataclass
class Cluster:
    namespace: str
    name: str

    def pods(self) -> list[dict[str, Any]]:
        out = kubectl("get", "pods", "-n", self.namespace, "-l", f"serving.kimik3.dev/deployment={self.name}",
                      "-o", "json", check=False)
        return json.loads(out.stdout)["items"] if out.returncode == 0 else []

    def leaders(self, pods: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
        return [p for p in pods if p["metadata"]["labels"].get(COMPONENT) == kind
                and p["metadata"]["labels"].get(WORKER_INDEX) == "0" and p.get("status", {}).get("podIP")]

    def routers(self, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [p for p in pods if p["metadata"]["labels"].get(COMPONENT) == "router"]

    def patch(self, body: dict[str, Any]) -> None:
        kubectl("patch", "k3", self.name, "-n", self.namespace, "--type=merge", "-p", json.dumps(body))

    def get(self) -> dict[str, Any]:
        return json.loads(kubectl("get", "k3", self.name, "-n", self.namespace, "-o", "json").stdout)  # type: ignore[no-any-return]


# -- the two designs' endpoints ---------------------------------------------------------------------

class Discovery:
    """The deployment's own router pods, each request to the next Ready one."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster, self.uids, self._urls, self._next = cluster, set[str](), list[str](), 0
        self.stop = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while not self.stop.wait(0.5):
            routers = self.cluster.routers(self.cluster.pods())
            self.uids |= {p["metadata"]["uid"] for p in routers}
            self._urls = [f"http://{p['status']['podIP']}:8000" for p in routers if _ready(p)]

    def endpoint(self) -> str | None:
        urls = self._urls
        self._next += 1
        return urls[self._next % len(urls)] if urls else None

    def starts(self, before: set[str]) -> int:
        return len(self.uids - before)


class Static:
    """A router with static engine lists, restarted on every change of the routed set."""

    def __init__(self, cluster: Cluster, root: Path) -> None:
        self.cluster, self.root = cluster, root
        self.current: tuple[subprocess.Popen[bytes], str, tuple[Any, ...]] | None = None
        self.starts = 0
        self.stop = threading.Event()
        pods = cluster.pods()
        router = next(p for p in cluster.routers(pods) if not p["metadata"].get("deletionTimestamp"))
        container = next(c for c in router["spec"]["containers"] if c["name"] == "router")  # not the front
        self.base = _static_base(container.get("args") or [])
        threading.Thread(target=self._follow, daemon=True).start()

    def _wanted(self) -> tuple[Any, ...] | None:
        """(prefill URLs, decode URLs) of the newest revision with a Ready leader of each kind."""
        pods = self.cluster.pods()
        by_revision: dict[str, dict[str, list[str]]] = {}
        newest: dict[str, str] = {}
        for kind in ("prefill", "decode"):
            for pod in self.cluster.leaders(pods, kind):
                if _ready(pod):
                    revision = pod["metadata"]["labels"].get(COMPAT, "")
                    by_revision.setdefault(revision, {}).setdefault(kind, []).append(
                        f"http://{pod['status']['podIP']}:{ENGINE_PORT}")
                    newest[revision] = max(newest.get(revision, ""), pod["metadata"]["creationTimestamp"])
        whole = [r for r, kinds in by_revision.items() if len(kinds) == 2]
        if not whole:
            return None
        revision = max(whole, key=lambda r: newest[r])
        return tuple(sorted(by_revision[revision]["prefill"])), tuple(sorted(by_revision[revision]["decode"]))

    def _follow(self) -> None:
        while not self.stop.wait(0.5):
            wanted = self._wanted()
            if wanted is None or (self.current and self.current[2] == wanted):
                continue
            started = self._start(wanted)
            if started is None:
                continue
            old, self.current = self.current, started
            if old is not None:
                self.starts += 1
                threading.Thread(target=_drain, args=(old[0],), daemon=True).start()
        if self.current:
            _drain(self.current[0], 0)

    def _start(self, wanted: tuple[Any, ...]) -> tuple[subprocess.Popen[bytes], str, tuple[Any, ...]] | None:
        port, metrics = free_port(), free_port()
        lists = [*(a for url in wanted[0] for a in ("--prefill", url)),
                 *(a for url in wanted[1] for a in ("--decode", url))]
        argv = [str(router_venv() / "bin" / "vllm-router"), *self.base, "--host", "127.0.0.1", "--port", str(port),
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics),
                "--health-check-interval-secs", "1", *lists]
        log = (self.root / f"static-router-{port}.log").open("ab")
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.root), "NO_PROXY": "127.0.0.0/8"}
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if SESSION.get(f"{url}/readiness", timeout=1).status_code == 200:
                    return proc, url, wanted
            except OSError:
                pass
            time.sleep(0.2)
        _drain(proc, 0)
        return None

    def endpoint(self) -> str | None:
        return self.current[1] if self.current else None


def _without(args: list[str], flags: set[str]) -> list[str]:
    out, skipping = [], False
    for arg in args:
        if arg.startswith("--"):
            skipping = arg in flags
        if not skipping:
            out.append(arg)
    return out


def _drain(proc: subprocess.Popen[bytes], pre_stop: float = PRE_STOP_SECONDS) -> None:
    time.sleep(pre_stop)
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


# -- the trace --------------------------------------------------------------------------------------

@dataclass
class Conversation:
    system: str
    tag: str
    messages: list[dict[str, str]] = field(default_factory=list)
    busy: bool = False

    def turn(self, index: int, words: int) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, *self.messages,
                {"role": "user", "content": prompt(words, f"{self.tag}u{index}-")}]


@dataclass
class Outcome:
    design: str
    phase: str
    at: float
    answer: Answer


class Load:
    """Open-loop agentic traffic for one design: bounded in requests and time."""

    def __init__(self, design: str, endpoint: Any, args: argparse.Namespace) -> None:
        self.design, self.endpoint, self.args = design, endpoint, args
        system = prompt(args.system_words, f"{design}-agent-")
        self.conversations = [
            Conversation(prompt(args.system_words, f"{design}-agent{i}-") if args.trace == "history" else system,
                         f"{design}-c{i}-") for i in range(args.conversations)]
        self.phase = "steady"
        self.outcomes: list[Outcome] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._sent = 0

    def run(self) -> None:
        threads = []
        while not self.stop.is_set() and self._sent < self.args.max_requests:
            threads.append(threading.Thread(target=self._one, args=(self._sent,), daemon=True))
            threads[-1].start()
            self._sent += 1
            self.stop.wait(self.args.interval)
        for thread in threads:
            thread.join(60)

    def _one(self, index: int) -> None:
        with self._lock:
            conversation = next((c for c in self.conversations if not c.busy), None)
            if conversation is None:  # every conversation waits for an answer: a new one starts
                conversation = Conversation(self.conversations[0].system, f"{self.design}-x{index}-")
            if len(conversation.messages) >= 2 * self.args.turns:
                conversation.messages.clear()
            conversation.busy = True
            messages = conversation.turn(index, self.args.user_words)
            phase = self.phase
        url = self.endpoint()
        if url is None:
            answer = Answer(0, "", error="no endpoint: no router to send to")
        else:
            # X-Session-ID names the conversation: ConsistentHash keys on it (vllm-router 0.1.17
            # policies/hash_key.rs). Not the body's `user`: the router finds only the first `"user"`
            # in the text, which in a chat request is a message's role (docs/vllm-facts.md §8).
            answer = post(url, "/v1/chat/completions", {"model": MODEL, "messages": messages, "stream": True,
                                                        "max_tokens": self.args.max_tokens}, timeout=60,
                          headers={"X-Session-ID": conversation.tag})
        with self._lock:
            if answer.status == 200 and answer.done:
                conversation.messages += [messages[-1], {"role": "assistant", "content": answer.text}]
            conversation.busy = False
            self.outcomes.append(Outcome(self.design, phase, time.monotonic(), answer))


class PrefixRecords:
    """Every prefill engine's per-request records (the simulator's /sim/stats), polled every second,
    each with the time it was first seen: engines scaled away still count."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.seen: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
        self.stop = threading.Event()
        threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self) -> None:
        while not self.stop.wait(1):
            for pod in self.cluster.leaders(self.cluster.pods(), "prefill"):
                url = f"http://{pod['status']['podIP']}:{ENGINE_PORT}/sim/stats"
                try:
                    records = SESSION.get(url, timeout=2).json()["by_request_id"]
                except (OSError, ValueError, KeyError):
                    continue
                now = time.monotonic()
                for key, record in records.items():
                    self.seen.setdefault((pod["metadata"]["uid"], key), (now, record))

    def hit_rate(self, start: float, end: float) -> float | None:
        """Over the records first seen in [start, end), both shifted by the polling lag: a request
        sent in a phase is seen at most about a second and a half later."""
        records = [r for t, r in list(self.seen.values()) if start + 1.5 <= t < end + 1.5]
        prompt_tokens = sum(r["prompt_tokens"] for r in records)
        return sum(r["local_cache_hit_tokens"] for r in records) / prompt_tokens if prompt_tokens else None


# -- phases -----------------------------------------------------------------------------------------

def _replicas(cluster: Cluster, role: str) -> int:
    return sum(1 for p in cluster.leaders(cluster.pods(), role) if _ready(p))


def _wait(what: str, done: Any, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if done():
            return time.monotonic() - started
        time.sleep(1)
    raise SystemExit(f"bench/traffic.py: {what} did not happen within {timeout:.0f} s")


def _scale(cluster: Cluster, replicas: int, role: str = "decode") -> None:
    """The first pool with `role` to `replicas`."""
    cr = cluster.get()
    pools = cr["spec"]["pools"]
    next(pool for pool in pools if pool.get(role))[role]["replicas"] = replicas
    cluster.patch({"spec": {"pools": pools}})


def _rollout(cluster: Cluster) -> None:
    """A change of the P/D compatibility hash that leaves the engines' behaviour alone: the serving
    image's tag (in the hash since vLLM's NIXL compatibility hash includes its version), between the
    project's default and a rebuilt tag, as an image upgrade would. (A KV-dtype change would also
    change the prefix cache's block layout, and with it the hit rates being compared.)"""
    cr = cluster.get()
    image = (cr["spec"].get("engine") or {}).get("image")
    cluster.patch({"spec": {"engine": {"image": None if image else BENCH_IMAGE}}})


def _rolled(cluster: Cluster, old: set[str]) -> bool:
    """Only the new revision serves: every leader on it and Ready, and every router pod left is
    the new revision's, Ready."""
    pods = cluster.pods()
    leaders = cluster.leaders(pods, "prefill") + cluster.leaders(pods, "decode")
    revisions = {p["metadata"]["labels"].get(COMPAT) for p in leaders}
    routers = cluster.routers(pods)
    return (bool(leaders) and not revisions & old and all(_ready(p) for p in leaders) and bool(routers)
            and all(_ready(p) and p["metadata"]["labels"].get(REVISION) not in old for p in routers))


def run_design(design: str, endpoint: Any, cluster: Cluster, args: argparse.Namespace,
               marks: dict[str, tuple[float, float]]) -> Load:
    load = Load(design, endpoint, args)
    thread = threading.Thread(target=load.run, daemon=True)
    thread.start()

    def phase(name: str, body: Any) -> None:
        load.phase = name
        start = time.monotonic()
        body()
        marks[f"{design}/{name}"] = (start, time.monotonic())
        print(f"  {design}: {name} done in {time.monotonic() - start:.0f} s", flush=True)

    decode = _replicas(cluster, "decode")
    old = {p["metadata"]["labels"].get(COMPAT) for p in cluster.leaders(cluster.pods(), "decode")}

    def steady() -> None:
        time.sleep(args.steady)

    def scale_up() -> None:
        _scale(cluster, decode * 2)
        _wait("scale-up", lambda: _replicas(cluster, "decode") >= decode * 2, 240)
        time.sleep(5)

    def scale_down() -> None:
        _scale(cluster, decode)
        _wait("scale-down", lambda: len(cluster.leaders(cluster.pods(), "decode")) <= decode, 240)
        time.sleep(5)

    def rollout() -> None:
        _rollout(cluster)
        _wait("the rollout", lambda: _rolled(cluster, old), 600)
        time.sleep(5)

    for name, body in (("steady", steady), ("scale-up", scale_up), ("scale-down", scale_down),
                       ("after-scale", steady), ("rollout", rollout), ("after-rollout", steady)):
        if name in args.phases:
            phase(name, body)
    load.stop.set()
    thread.join(90)
    return load


# -- direct against the router ------------------------------------------------------------------

def direct_pair(prefill: str, decode: str, body: dict[str, Any]) -> Answer:
    """The router's two steps, made by the client itself: prefill with do_remote_decode (one token),
    then decode with the kv_transfer_params the prefill answered; TTFT from the first byte sent."""
    started = time.monotonic()
    rid = f"bench-{uuid.uuid4().hex}"
    first = {**body, "stream": False, "max_tokens": 1, "kv_transfer_params": {
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None}}
    try:
        answer = SESSION.post(f"{prefill}/v1/chat/completions", json=first, headers={"X-Request-Id": rid}, timeout=60)
        params = answer.json().get("kv_transfer_params") if answer.status_code == 200 else None
    except (OSError, ValueError) as exc:
        return Answer(0, rid, error=f"prefill: {exc}")
    if not params:  # the decode would prefill on its own: not the path being measured
        return Answer(answer.status_code, rid, error=f"prefill: {answer.status_code} without kv_transfer_params")
    handed = time.monotonic()
    second = post(decode, "/v1/chat/completions", {**body, "kv_transfer_params": params}, timeout=60,
                  headers={"X-Request-Id": rid})
    if second.ttft is not None:
        second.ttft += handed - started
    return second


def compare_direct(cluster: Cluster, discovery: Discovery, args: argparse.Namespace,
                   tag: str = "direct") -> dict[str, list[Answer]]:
    pods = cluster.pods()
    prefill = next(p for p in cluster.leaders(pods, "prefill") if _ready(p))
    decode = next(p for p in cluster.leaders(pods, "decode") if _ready(p))
    pre, dec = (f"http://{p['status']['podIP']}:{ENGINE_PORT}" for p in (prefill, decode))
    out: dict[str, list[Answer]] = {"direct": [], "router": []}
    system = prompt(args.direct_words, f"{tag}-agent-")
    for i in range(args.direct_requests):
        for way in ("direct", "router"):
            body = {"model": MODEL, "stream": True, "max_tokens": args.max_tokens, "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": prompt(40, f"{tag}{way}{i}-")}]}
            if way == "direct":
                out[way].append(direct_pair(pre, dec, body))
            elif (url := discovery.endpoint()) is not None:
                out[way].append(post(url, "/v1/chat/completions", body, timeout=60))
    return out


# -- router policies: what prefix affinity costs and buys ------------------------------------------

def _policies_of(pod: dict[str, Any]) -> tuple[str | None, str | None]:
    """(prefill, decode) policy flags on a router pod's command line."""
    args = next(c for c in pod["spec"]["containers"] if c["name"] == "router").get("args") or []
    value = {flag: args[i + 1] for i, flag in enumerate(args[:-1]) if flag in ("--prefill-policy", "--decode-policy")}
    return value.get("--prefill-policy"), value.get("--decode-policy")


def _set_policies(cluster: Cluster, prefill: str, decode: str) -> float:
    """spec.router's two policies; returns once every router pod left runs them and is Ready."""
    cluster.patch({"spec": {"router": {"prefillPolicy": prefill, "decodePolicy": decode}}})
    wanted = (POLICY_FLAG[prefill], POLICY_FLAG[decode])

    def rolled() -> bool:
        routers = cluster.routers(cluster.pods())
        return bool(routers) and all(_ready(p) and _policies_of(p) == wanted for p in routers)
    return _wait(f"the routers on {prefill}/{decode}", rolled, 240)


@dataclass
class PolicyRun:
    policies: str
    direct: dict[str, list[Answer]]
    load: Load
    window: tuple[float, float]


def run_policies(cluster: Cluster, discovery: Discovery, args: argparse.Namespace) -> list[PolicyRun]:
    """Per (prefill, decode) policy pair: the routers rolled onto it, then what the router adds to
    TTFT (compare_direct) and the prefill prefix-hit rate of the trace through it (open loop,
    --policy-seconds). vllm-router 0.1.17's cache_aware asks every engine of the role to tokenize the
    prompt before it picks one (routers/http/pd_router.rs, prepare_http_token_inputs); round_robin
    asks none and keeps no affinity; consistent_hash hashes the conversation's X-Session-ID onto a
    ring of the engines (policies/consistent_hash.rs): affinity without a tokenizer call."""
    out = []
    for pair in args.policies.split(","):
        prefill, decode = pair.split("/")
        print(f"== policies {pair}: routers rolled in {_set_policies(cluster, prefill, decode):.0f} s", flush=True)
        direct = compare_direct(cluster, discovery, args, tag=f"policy-{prefill}-{decode}")
        load = Load(f"{prefill}/{decode}", discovery.endpoint, args)
        thread = threading.Thread(target=load.run, daemon=True)
        start = time.monotonic()
        thread.start()
        time.sleep(args.policy_seconds)
        load.stop.set()
        thread.join(90)
        out.append(PolicyRun(pair, direct, load, (start, time.monotonic())))
    return out


# -- the report -------------------------------------------------------------------------------------

def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _first_tokens(direct: dict[str, list[Answer]]) -> dict[str, list[float]]:
    """Per way (direct, router): the TTFTs of the requests that completed."""
    return {way: [a.ttft for a in answers if a.ttft is not None and a.done] for way, answers in direct.items()}


def _added(direct: dict[str, list[Answer]]) -> float | None:
    """Router minus direct, TTFT p50, in seconds."""
    first = _first_tokens(direct)
    return statistics.median(first["router"]) - statistics.median(first["direct"]) \
        if first["direct"] and first["router"] else None


def _direct_line(direct: dict[str, list[Answer]]) -> str:
    first = _first_tokens(direct)
    between = {way: [g for a in answers if a.done for g in a.gaps] for way, answers in direct.items()}
    served = {way: sum(1 for a in answers if a.done) for way, answers in direct.items()}
    return (f"direct vs router, one request at a time ({served['direct']} and {served['router']} served of "
            f"{len(direct['direct'])} and {len(direct['router'])}): "
            f"TTFT p50 {_ms(_pct(first['direct'], 50))} vs {_ms(_pct(first['router'], 50))} ms, p99 "
            f"{_ms(_pct(first['direct'], 99))} vs {_ms(_pct(first['router'], 99))} ms; gap p50 "
            f"{_ms(_pct(between['direct'], 50))} vs {_ms(_pct(between['router'], 50))} ms")


def _outcomes(answers: list[Answer]) -> tuple[list[Answer], str, list[float]]:
    """(failed, failures by kind, TTFTs of the served)."""
    failed = [a for a in answers if not (a.status == 200 and a.done)]
    kinds = ", ".join(f"{k} {n}" for k, n in failure_kinds(failed).items()) or "-"
    return failed, kinds, [a.ttft for a in answers if a.status == 200 and a.done and a.ttft is not None]


def report(loads: list[Load], records: PrefixRecords, marks: dict[str, tuple[float, float]],
           starts: dict[str, int], direct: dict[str, list[Answer]], policies: list[PolicyRun],
           args: argparse.Namespace) -> str:
    lines = [f"trace: {args.trace} ({args.conversations} conversations, system prompt {args.system_words} words"
             f"{' each' if args.trace == 'history' else ' shared'}, turns of {args.user_words} words, "
             f"{args.max_tokens} tokens out, a request every {args.interval} s); prefill replicas: "
             f"{args.prefill_replicas or 'as deployed'}", "",
             "| design | phase | sent | failed | failures | prefix hit | TTFT p50/p99 ms | gap p50/p99 ms |",
             "|---|---|---|---|---|---|---|---|"]
    for load in loads:
        for phase in args.phases:
            start, end = marks[f"{load.design}/{phase}"]
            answers = [o.answer for o in load.outcomes if o.phase == phase]
            failed, kinds, ttft = _outcomes(answers)
            gaps = [g for a in answers if a.status == 200 and a.done for g in a.gaps]
            rate = records.hit_rate(start, end)
            lines.append(f"| {load.design} | {phase} | {len(answers)} | {len(failed)} | {kinds} | "
                         f"{'-' if rate is None else f'{rate:.3f}'} | {_ms(_pct(ttft, 50))} / {_ms(_pct(ttft, 99))} | "
                         f"{_ms(_pct(gaps, 50))} / {_ms(_pct(gaps, 99))} |")
    lines.append("")
    lines.append("router starts during the run (restarts of the static router; router pods created "
                 "for discovery): " + ", ".join(f"{d} {n}" for d, n in starts.items()))
    lines.append(_direct_line(direct))
    if (added := _added(direct)) is not None:
        lines.append(f"router-added TTFT p50: {added * 1000:.1f} ms")
    if policies:
        lines += ["", f"router policies (prefill/decode): router-added TTFT p50 over {args.direct_requests} "
                      f"requests of {args.direct_words} words one at a time, then the trace for "
                      f"{args.policy_seconds:.0f} s", "",
                  "| policies | router-added TTFT p50 ms | router TTFT p50/p99 ms | trace sent | failed | "
                  "trace TTFT p50/p99 ms | prefix hit |", "|---|---|---|---|---|---|---|"]
        for run in policies:
            alone = _first_tokens(run.direct)["router"]
            failed, kinds, ttft = _outcomes([o.answer for o in run.load.outcomes])
            rate = records.hit_rate(*run.window)
            lines.append(f"| {run.policies} | {_ms(_added(run.direct))} | {_ms(_pct(alone, 50))} / "
                         f"{_ms(_pct(alone, 99))} | {len(run.load.outcomes)} | {len(failed)} ({kinds}) | "
                         f"{_ms(_pct(ttft, 50))} / {_ms(_pct(ttft, 99))} | {'-' if rate is None else f'{rate:.3f}'} |")
    return "\n".join(lines)


PHASES = ("steady", "scale-up", "scale-down", "after-scale", "rollout", "after-rollout")
QUICK = {"steady": 4.0, "direct_requests": 12, "policy_seconds": 10.0, "designs": "discovery",
         "policies": "CacheAware/CacheAware"}
"""--quick (CI): short phases and samples, the shipped design and the default policies only (the
static design and the other policy pairs are compared by the full run, results committed)."""
TRACES = {"shared": {"system_words": 3000, "user_words": 40},
          "history": {"system_words": 150, "user_words": 600}}
"""shared: one long system prompt dominates every prompt (agents on one tool set). history: each
conversation its own short system prompt and long turns (tool outputs), so what a prefill can reuse
is the conversation's own history, which only the engine that served its last turn holds."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namespace", default="inference")
    parser.add_argument("--name", default="k3-pd")
    parser.add_argument("--trace", choices=sorted(TRACES), default="shared")
    parser.add_argument("--interval", type=float, default=0.4, help="seconds between requests (open loop)")
    parser.add_argument("--steady", type=float, default=20, help="seconds of each steady phase")
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--turns", type=int, default=10, help="turns before a conversation starts again")
    parser.add_argument("--system-words", type=int, help="the system prompt (default: the trace's)")
    parser.add_argument("--user-words", type=int, help="each user turn (default: the trace's)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-requests", type=int, default=2000, help="per design")
    parser.add_argument("--prefill-replicas", type=int, default=0,
                        help="scale the prefill role to this many replicas first (0: as deployed)")
    parser.add_argument("--direct-requests", type=int, default=30)
    parser.add_argument("--direct-words", type=int, default=3000, help="the system prompt of the direct comparison")
    parser.add_argument("--designs", default="static,discovery")
    parser.add_argument("--phases", type=lambda text: [p for p in PHASES if p in text.split(",")],
                        default=list(PHASES), help=f"the phases to run, of {','.join(PHASES)} (a rollout needs "
                        "room for a surge group of each role beside its replicas)")
    parser.add_argument("--policies", default="CacheAware/RoundRobin,ConsistentHash/RoundRobin,RoundRobin/RoundRobin,"
                                              "CacheAware/CacheAware",
                        help="prefill/decode policy pairs to compare, comma-separated ('' for none); the "
                             "last one stays")
    parser.add_argument("--policy-seconds", type=float, default=30)
    parser.add_argument("--quick", action="store_true", help=f"CI: {QUICK}")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "traffic.md")
    args = parser.parse_args()
    for key, value in (QUICK.items() if args.quick else ()):
        setattr(args, key, value)
    for key, value in TRACES[args.trace].items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    cluster = Cluster(args.namespace, args.name)
    if args.prefill_replicas:
        _scale(cluster, args.prefill_replicas, "prefill")
        _wait("the prefill replicas", lambda: _replicas(cluster, "prefill") == args.prefill_replicas
              and not any(p["metadata"].get("deletionTimestamp") for p in cluster.routers(cluster.pods())), 300)
    logs = Path(tempfile.mkdtemp(prefix="kimik3-traffic-"))
    records = PrefixRecords(cluster)
    discovery = Discovery(cluster)
    time.sleep(1.5)
    marks: dict[str, tuple[float, float]] = {}
    loads, starts = [], {}
    for design in filter(None, args.designs.split(",")):
        print(f"== {design}", flush=True)
        if design == "static":
            static = Static(cluster, logs)
            _wait("the static router", lambda s=static: s.endpoint() is not None, 60)
            loads.append(run_design(design, static.endpoint, cluster, args, marks))
            starts[design] = static.starts
            static.stop.set()
        else:
            uids = set(discovery.uids)
            loads.append(run_design(design, discovery.endpoint, cluster, args, marks))
            starts[design] = discovery.starts(uids)
    print("== direct against the router", flush=True)
    direct = compare_direct(cluster, discovery, args)
    policies = run_policies(cluster, discovery, args) if args.policies else []
    discovery.stop.set()
    time.sleep(1.5)
    records.stop.set()
    text = report(loads, records, marks, starts, direct, policies, args)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(f"# bench/traffic.py {' '.join(sys.argv[1:])}, "
                        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n{text}\n")


if __name__ == "__main__":
    main()
