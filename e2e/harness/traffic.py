"""An OpenAI client for e2e traffic through the router: loopback only, bounded in time, and measuring
what a user measures (time to first token, inter-token gaps) from the bytes as they arrive."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import requests

from .kube import get_json, wait_for
from .pod_runner import PodRunner, Proc

SESSION = requests.Session()
SESSION.trust_env = False  # loopback only, never through a proxy from the environment
SESSION.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=32))  # the load's clients share it


@dataclass
class Answer:
    status: int
    request_id: str
    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    done: bool = False
    """The stream ended with `data: [DONE]` (a Responses stream: its response.completed or
    response.incomplete event) and carried no error event (always True for a whole JSON answer that
    parsed)."""
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    """Seconds between consecutive content chunks of a stream."""
    error: str = ""
    reasoning: str = ""
    """A chat stream's think channel (delta.reasoning)."""
    token_ids: list[int] = field(default_factory=list)
    """The answer's token ids, when the request asked for them (return_token_ids)."""
    response_ids: set[str] = field(default_factory=set)
    """Every response id the stream's chunks carried (one, unless the stream was not one answer)."""


def prompt(words: int, seed: str) -> str:
    """`words` whitespace tokens (the simulator's tokenizer), unique per seed so no prefix is shared."""
    return " ".join(f"{seed}{i % 997}" for i in range(words))


def post(base: str, path: str, body: dict[str, Any], *, timeout: float = 60, into: Answer | None = None,
         headers: dict[str, str] | None = None) -> Answer:
    """One request; a stream is read chunk by chunk as it arrives and timed. A broken connection is
    an Answer with `error` set, not an exception: a test asserts what the client saw. `into` is
    filled while the stream runs (another thread can watch it)."""
    started = time.monotonic()
    answer = into or Answer(0, "")
    try:
        with SESSION.post(f"{base}{path}", json=body, stream=bool(body.get("stream")), timeout=timeout,
                          headers=headers) as r:
            answer.status, answer.request_id = r.status_code, r.headers.get("x-request-id", "")
            if not body.get("stream"):
                if r.status_code == 200:
                    data = r.json()
                    if data.get("object") == "response":  # the Responses API: output items, not choices
                        answer.text = "".join(part.get("text", "") for item in data["output"]
                                              for part in item.get("content") or [])
                    else:
                        choice = data["choices"][0]
                        answer.text = choice.get("text") or (choice.get("message") or {}).get("content") or ""
                        answer.tool_calls = (choice.get("message") or {}).get("tool_calls") or []
                    answer.usage, answer.done = data.get("usage") or {}, True
                    answer.ttft = time.monotonic() - started
                else:
                    answer.error = r.text[:500]
                return answer
            last = None
            calls: dict[int, dict[str, Any]] = {}
            for line in r.iter_lines(chunk_size=None):  # what has arrived, not 512-byte blocks
                if not line.startswith(b"data: "):
                    continue
                payload = line[len(b"data: "):]
                if payload == b"[DONE]":
                    answer.done = not answer.error  # a stream that carried an error event did not finish
                    break
                chunk = json.loads(payload)
                if "error" in chunk or chunk.get("type") == "error":
                    answer.error = json.dumps(chunk.get("error") or chunk)[:500]
                    continue
                kind = chunk.get("type") or ""
                if kind in ("response.completed", "response.incomplete"):  # a Responses stream's end
                    answer.usage = chunk["response"].get("usage") or answer.usage
                    answer.done = not answer.error
                    break
                answer.usage = chunk.get("usage") or answer.usage
                if chunk.get("id"):
                    answer.response_ids.add(chunk["id"])
                pieces: list[dict[str, Any]] = ([{"text": chunk.get("delta") or ""}]
                                                if kind == "response.output_text.delta" else [])
                for choice in chunk.get("choices") or pieces:
                    delta = choice.get("delta") or {}
                    piece = choice.get("text") or delta.get("content") or ""
                    thought = delta.get("reasoning") or ""
                    answer.reasoning += thought
                    answer.token_ids += choice.get("token_ids") or []
                    for call in delta.get("tool_calls") or []:
                        merged = calls.setdefault(call.get("index", 0), {"function": {"name": "", "arguments": ""}})
                        merged["id"] = call.get("id") or merged.get("id")
                        fn = call.get("function") or {}
                        merged["function"]["name"] += fn.get("name") or ""
                        merged["function"]["arguments"] += fn.get("arguments") or ""
                    if piece or thought or delta.get("tool_calls"):
                        now = time.monotonic()
                        if last is None:
                            answer.ttft = now - started
                        else:
                            answer.gaps.append(now - last)
                        last = now
                        answer.text += piece
            answer.tool_calls = [calls[i] for i in sorted(calls)]
            return answer
    except (requests.RequestException, ValueError) as exc:
        answer.error = f"{type(exc).__name__}: {exc}"[:500]
        return answer


def stats(engine: Proc) -> dict[str, Any]:
    return SESSION.get(f"{engine.url}/sim/stats", timeout=5).json()  # type: ignore[no-any-return]


def _samples(url: str, name: str, labels: dict[str, str]) -> list[float]:
    found = []
    for line in SESSION.get(url, timeout=5).text.splitlines():
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] == name and all(f'{k}="{v}"' in head for k, v in labels.items()):
            found.append(float(value))
    return found


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels` (0 when absent)."""
    return sum(_samples(url, name, labels))


def metric_line(url: str, name: str, **labels: str) -> float | None:
    """The one sample of a metric with these labels, None while it is not exported."""
    found = _samples(url, name, labels)
    return found[0] if len(found) == 1 else None


def failure_kind(answer: Answer) -> str:
    """How a request failed, for a load's summary: no endpoint (no ready router to send to), an HTTP
    status, a broken stream (200 without its end), or the connection (refused, reset, timed out)."""
    if answer.error.startswith("no endpoint"):
        return "no endpoint"
    if answer.status == 200:
        # An error event marks a cut stream (kimik3-router, vLLM); a stream that just stops does not.
        return "stream error event" if answer.error.startswith("{") else "broken stream"
    return f"HTTP {answer.status}" if answer.status else "connection"


def failure_kinds(answers: list[Answer]) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for answer in answers:
        if not (answer.status == 200 and answer.done):
            kinds[failure_kind(answer)] = kinds.get(failure_kind(answer), 0) + 1
    return kinds


def router_uids(namespace: str) -> set[str]:
    """The uids of the router pods in `namespace` now: a router that restarted has a new one."""
    return {p["metadata"]["uid"] for p in get_json("pods", "-n", namespace, "-l",
                                                 "app.kubernetes.io/component=router")["items"]}


def _router_metrics(router: Proc) -> str | None:
    try:
        return SESSION.get(f"http://{router.ip}:{router.metrics_port}/metrics", timeout=2).text
    except requests.RequestException:
        return None


def is_kimik3_router(router: Proc) -> bool:
    """The pod runs kimik3-router (spec.router.implementation KimiK3Router), not vllm-router."""
    argv = router.proc.args
    return isinstance(argv, list) and bool(argv) and "kimik3-router" in str(argv[0])


def router_workers(router: Proc) -> set[str] | None:
    """The engine IPs a router has found, None when it does not answer. kimik3-router: the engines
    its metrics list (kimik3_router_engine_healthy has one series per engine found, healthy or not).
    vllm-router: its GET /workers, asked of the router itself, behind its front (which never passes
    the admin API): in a pod that is its loopback, which a played pod's IP stands for (pod_runner)."""
    if is_kimik3_router(router):
        text = _router_metrics(router)
        if text is None:
            return None
        return set(re.findall(r'^kimik3_router_engine_healthy\{[^}]*engine="\[?([0-9a-fA-F.:]+?)\]?:\d+', text,
                              re.M))
    try:
        body = SESSION.get(f"{router.admin_url}/workers", timeout=2).text
    except requests.RequestException:
        return None
    return set(re.findall(r"http://\[?([0-9a-fA-F.:]+?)\]?:\d+", body))


def engine_routable(router: Proc, engine: Proc) -> float | None:
    """1 while the router would send the engine requests, 0 once its health check gave it up, None
    while the router does not list it."""
    url = f"http://{router.ip}:{router.metrics_port}/metrics"
    if is_kimik3_router(router):
        return metric_line(url, "kimik3_router_engine_healthy", engine=f"{engine.ip}:{engine.port}")
    return metric_line(url, "vllm_router_worker_health", worker=engine.url)


def decode_legs(router: Proc) -> float:
    """Requests the router sent to decode engines (answered or not)."""
    url = f"http://{router.ip}:{router.metrics_port}/metrics"
    if is_kimik3_router(router):
        return metric(url, "kimik3_router_leg_requests_total", role="decode")
    return metric(url, "vllm_router_pd_decode_requests_total")


def ready_router(runner: PodRunner, namespace: str, name: str, timeout: float = 120) -> Proc:
    """A router process playing one of `name`'s router pods, once it answers /readiness (a healthy
    engine of each kind) and has found every engine of its revision running now (its discovery adds
    them one at a time)."""
    def probe() -> Proc | None:
        for proc in runner.running(namespace, "router"):
            revision = proc.labels.get("serving.kimik3.dev/router-revision")
            engines = {p.ip for p in runner.running(namespace) if p.kind != "router"
                       and (revision is None or p.kind == "aggregated" or p.compat == revision)}
            if proc.pod.startswith(f"{name}-") and _ok(f"{proc.url}/readiness") and router_workers(proc) == engines:
                return proc
        return None
    return wait_for(f"router {namespace}/{name} ready", probe, timeout=timeout)


def _ok(url: str) -> bool:
    try:
        return SESSION.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def main() -> None:
    """`python -m e2e.harness.traffic PODS_JSON NAMESPACE NAME`: one streamed chat request through the
    deployment's router (as the pod runner plays it on loopback); prints the answer and its TTFT."""
    import sys
    from pathlib import Path

    pods_json, namespace, name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]

    def router() -> str | None:
        pods = json.loads(pods_json.read_text()) if pods_json.exists() else {}
        for key, pod in sorted(pods.items()):
            if key.startswith(f"{namespace}/{name}-router-") and pod["alive"] and _ok(f"{pod['url']}/readiness"):
                return str(pod["url"])
        return None

    url = wait_for(f"the router of {namespace}/{name}", router, timeout=120)
    question = "In one sentence: what does a prefill/decode split buy a Kimi K3 deployment?"
    answer = post(url, "/v1/chat/completions", {"model": "kimi-k3", "stream": True, "max_tokens": 48,
                                                "stream_options": {"include_usage": True},
                                                "messages": [{"role": "user", "content": question}]})
    if answer.status != 200 or not answer.done or answer.error or answer.ttft is None:
        raise SystemExit(f"the request failed: HTTP {answer.status} {answer.error or 'no token came'}")
    print(f"Q: {question}\nA: {answer.text.strip()}")
    print(f"TTFT {answer.ttft * 1000:.0f} ms, {len(answer.gaps) + 1} chunks, "
          f"usage {answer.usage or 'n/a'} (router {url})")


if __name__ == "__main__":
    main()
