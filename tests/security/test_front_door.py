"""The router pod's front (render/front.py) under hostile clients: the rendered configuration run by
the real HAProxy (Debian 12's, the router image's) on 127.0.0.1, in front of a stand-in router that
records every request it gets. The rule each test holds: a client reaches the OpenAI routes and the
health checks, nothing else, and the stand-in never sees anything else."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from e2e.harness.front_play import haproxy, relocate, start_front
from kimik3_operator.planner import FrontPlan
from kimik3_operator.render.front import CONFIG_ENV, HEALTH_PATH, PROBES, ROUTES, front_config
from tests.simulator.sims import free_port

ADMIN = [("GET", "/workers"), ("POST", "/workers"), ("DELETE", "/workers/http%3A%2F%2F10.0.0.1%3A8000"),
         ("GET", "/workers/x"), ("POST", "/add_worker?url=http://x"), ("POST", "/remove_worker?url=http://x"),
         ("GET", "/list_workers"), ("POST", "/flush_cache"), ("GET", "/get_loads"),
         ("GET", "/scheduling/diagnostics"), ("POST", "/finish_session"), ("GET", "/get_server_info"),
         ("GET", "/get_model_info"), ("GET", "/health_generate"), ("POST", "/generate"),
         ("GET", "/v1/responses/resp_1"), ("POST", "/v1/responses/resp_1/cancel"), ("GET", "/metrics"),
         ("POST", "/v1/models"), ("GET", "/v1/completions"),
         ("DELETE", "/v1/chat/completions")]
"""vllm-router 0.1.17's routes no client may call (src/server.rs build_app), and allowed paths with
the wrong method."""
TRICKS = [b"GET //workers HTTP/1.1", b"GET /%2Fworkers HTTP/1.1", b"GET /%2fworkers HTTP/1.1",
          b"GET /v1/models/../workers HTTP/1.1", b"GET /v1/models/%2E%2E/workers HTTP/1.1",
          b"GET /v1/models%2F..%2Fworkers HTTP/1.1", b"GET http://127.0.0.1/workers HTTP/1.1",
          b"GET http://127.0.0.1//workers HTTP/1.1", b"GET /WORKERS HTTP/1.1", b"GET /workers/ HTTP/1.1",
          b"GET /./workers HTTP/1.1", b"GET workers HTTP/1.1", b"GET /v1/models;/workers HTTP/1.1",
          b"GET /v1/models/ HTTP/1.1", b"GET /health/../workers HTTP/1.1", b"GET /workers HTTP/1.0",
          b"GET * HTTP/1.1", b"OPTIONS /workers HTTP/1.1", b"GET /v1/models\t/workers HTTP/1.1"]


@dataclass
class StandIn:
    """A router stand-in on 127.0.0.1: answers every request, records its path and headers."""

    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    delay: float = 0.0
    server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> int:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _body(self) -> bytes:
                """The request body, chunked or not: a smuggled request must show as body, not vanish."""
                if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
                    out = b""
                    while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                        out += self.rfile.read(size)
                        self.rfile.readline()
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return out
                length = int(self.headers.get("content-length") or 0)
                return self.rfile.read(length) if length else b""

            def _answer(self) -> None:
                body = self._body()
                outer.seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
                outer.bodies.append(body)
                asked = json.loads(body) if self.path.startswith("/v1/") and body.startswith(b"{") else {}
                if asked.get("stream"):
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    for i in range(asked["stream"]):
                        event = f"data: {i}\n\n".encode()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                        self.wfile.flush()
                        time.sleep(0.05)
                    self.wfile.write(b"0\r\n\r\n")
                    return
                time.sleep(asked.get("sleep", outer.delay))
                out = json.dumps({"path": self.path}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_DELETE = do_PUT = do_OPTIONS = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return int(self.server.server_address[1])

    def paths(self) -> set[str]:
        """Where the stand-in was asked to go, as the router would read it (an absolute-form target's path)."""
        return {urlsplit(path).path if "://" in path else path.split("?")[0] for _, path, _ in self.seen}


@dataclass
class Front:
    url: str
    metrics: str
    router: StandIn
    log: Path

    def raw(self, request: bytes, pause: float = 0.0) -> bytes:
        """Send bytes as they are and read the answer (a status line, headers, a body)."""
        host, port = urlsplit(self.url).netloc.split(":")
        with socket.create_connection((host, int(port)), timeout=15) as conn:
            conn.sendall(request)
            time.sleep(pause)
            out = b""
            while chunk := conn.recv(65536):
                out += chunk
        return out


def call(url: str, method: str = "GET", body: dict[str, Any] | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={
        **({"content-type": "application/json"} if data else {}), **(headers or {})})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=20) as answer:
            return answer.status, {k.lower(): v for k, v in answer.headers.items()}, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


@pytest.fixture
def front(tmp_path: Path) -> Iterator[Callable[..., Front]]:
    """front(plan, api_key=None) -> a running front on free loopback ports (stopped after the test)."""
    procs = []

    def make(plan: FrontPlan | None = None, api_key: str | None = None, router_up: bool = True) -> Front:
        plan = plan or FrontPlan()
        router = StandIn()
        router_port = router.start() if router_up else free_port()
        port, metrics = free_port(), free_port()
        config = relocate(front_config(plan, drain_seconds=5), f"127.0.0.1:{port}",
                          f"127.0.0.1:{router_port}", f"127.0.0.1:{metrics}")
        log = tmp_path / f"front-{port}.log"
        procs.append(start_front(config, tmp_path, log, api_key))
        out = Front(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics}", router, log)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if call(out.metrics + HEALTH_PATH)[0] == 200:
                    return out
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"the front did not start: {log.read_text()}")

    yield make
    for proc in procs:
        proc.terminate()
        proc.wait(10)


def test_the_client_routes_pass_and_nothing_else_reaches_the_router(front: Callable[..., Front]) -> None:
    f = front()
    for method, path in ROUTES:
        status, _, body = call(f.url + path, method, {"prompt": "x"} if method == "POST" else None)
        assert status == 200 and json.loads(body)["path"] == path
    for path in PROBES:
        assert call(f.url + path)[0] == 200
    for model in ("kimi-k3", "Kimi-K3.v1:fp8_x"):  # one model by name (kimik3-router answers it)
        status, _, body = call(f.url + f"/v1/models/{model}")
        assert status == 200 and json.loads(body)["path"] == f"/v1/models/{model}"
    for refused in ("/v1/models/.hidden", "/v1/models/a/b", "/v1/models/a%2Fb", "/v1/models/" + "x" * 129):
        assert call(f.url + refused)[0] == 404, refused
    passed = set(f.router.paths())
    for method, path in ADMIN:
        status, _, body = call(f.url + path, method, {} if method in ("POST", "PUT") else None)
        assert status == 404, (method, path, status)
        assert json.loads(body)["error"]["code"] == 404
    assert f.router.paths() == passed == {p for _, p in ROUTES} | set(PROBES) | {
        "/v1/models/kimi-k3", "/v1/models/Kimi-K3.v1:fp8_x"}


@pytest.mark.parametrize("line", TRICKS, ids=lambda b: b.decode().replace("\t", "\\t"))
def test_path_tricks_never_reach_an_admin_route(front: Callable[..., Front], line: bytes) -> None:
    f = front()
    answer = f.raw(line + b"\r\nHost: x\r\nConnection: close\r\n\r\n")
    status = int(answer.split(b" ", 2)[1])
    assert status in (400, 404), answer[:200]
    assert f.router.seen == []


def test_a_smuggled_request_behind_an_allowed_one_is_not_passed(front: Callable[..., Front]) -> None:
    """Content-Length beside chunked Transfer-Encoding: HAProxy must not let the router read the
    tail as a second request to an admin route."""
    f = front()
    smuggled = b"GET /workers HTTP/1.1\r\nHost: x\r\n\r\n"
    body = b"0\r\n\r\n" + smuggled
    f.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Content-Length: " + str(len(body)).encode() + b"\r\nTransfer-Encoding: chunked\r\n"
          b"Connection: close\r\n\r\n" + body)
    assert f.router.paths() <= {"/v1/completions"}, f.router.seen


def test_pipelined_requests_are_each_checked(front: Callable[..., Front]) -> None:
    f = front()
    answer = f.raw(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\nGET /workers HTTP/1.1\r\nHost: x\r\n\r\n"
                   b"DELETE /workers/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.count(b"HTTP/1.1 404") == 2 and answer.startswith(b"HTTP/1.1 200")
    assert f.router.paths() == {"/v1/models"}


def test_no_upgrade_reaches_the_router(front: Callable[..., Front]) -> None:
    """A 101 from the router would turn the connection into a tunnel past every rule: the router
    never sees an Upgrade header."""
    f = front()
    for path in ("/health", "/v1/models"):
        assert call(f.url + path, headers={"Upgrade": "websocket"})[0] == 200
    assert len(f.router.seen) == 2 and all("upgrade" not in headers for _, _, headers in f.router.seen)
    # with a request pipelined behind it, HAProxy refuses the lot
    answer = f.raw(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
                   b"GET /workers HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400") and f.router.paths() == {"/health", "/v1/models"}


def test_a_slow_body_takes_no_router_slot(front: Callable[..., Front]) -> None:
    """A client that sends its headers and then its body a byte at a time holds a connection of the
    front, not one of the router's admitted slots (`http-request wait-for-body`)."""
    f = front(FrontPlan(max_concurrent=1, queue_size=0))
    host, port = urlsplit(f.url).netloc.split(":")
    slow = [socket.create_connection((host, int(port)), timeout=15) for _ in range(3)]
    try:
        for conn in slow:
            conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        for _ in range(3):
            time.sleep(0.5)
            for conn in slow:
                conn.sendall(b" ")
        assert call(f.url + "/v1/completions", "POST", {"sleep": 0})[0] == 200
        assert f.router.paths() == {"/v1/completions"} and len(f.router.seen) == 1
    finally:
        for conn in slow:
            conn.close()


def test_oversized_headers_and_slow_clients_are_cut_before_the_router(front: Callable[..., Front]) -> None:
    f = front()
    big = f.raw(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000 + b"\r\nConnection: close\r\n\r\n")
    assert big.split(b" ", 2)[1] in (b"400", b"431"), big[:100]
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(200))
    assert f.raw(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n").split(b" ", 2)[1] == b"400"
    started = time.monotonic()
    slow = f.raw(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
    assert slow.split(b" ", 2)[1] == b"408" and time.monotonic() - started < 15
    assert f.router.seen == []


def test_a_body_over_the_limit_is_refused_before_the_router_reads_it(front: Callable[..., Front]) -> None:
    """maxRequestBytes at the front: a body one byte over gets a JSON 413 from its Content-Length,
    without the front waiting for the body (a client that announces 100 MB and sends nothing is
    answered at once) and without the router seeing it; a body of exactly the limit passes whole."""
    limit = 1024 * 1024
    f = front(FrontPlan(max_request_bytes=limit))
    filler = b'{"prompt": "' + b"x" * (limit - 15) + b'"}'
    assert len(filler) == limit - 1
    for body, status in ((filler + b" ", 200), (filler + b"  ", 413)):
        answer = f.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        assert answer.startswith(b"HTTP/1.1 %d" % status), answer[:300]
    assert f.router.bodies == [filler + b" "]
    error = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == 413 and str(limit) in error["message"]
    started = time.monotonic()
    announced = f.raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100000000\r\nConnection: close\r\n\r\n{")
    assert announced.startswith(b"HTTP/1.1 413") and time.monotonic() - started < 5
    assert len(f.router.seen) == 1


def test_an_oversized_body_without_the_key_is_told_about_the_key(front: Callable[..., Front]) -> None:
    """The key is checked first: a client without it learns nothing of the endpoint's limits."""
    f = front(FrontPlan(api_key=("s", "k"), max_request_bytes=1024 * 1024), api_key="secret")
    answer = f.raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n"
                   b"Connection: close\r\n\r\n{")
    assert answer.startswith(b"HTTP/1.1 401") and f.router.seen == []


def test_the_api_key_is_asked_compared_and_not_passed_on(front: Callable[..., Front]) -> None:
    key = "sk-kimi,with;odd=chars"
    f = front(FrontPlan(api_key=("secret", "key")), api_key=key)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {key}x"},
                    {"Authorization": key}, {"Authorization": f"bearer {key}"}, {"X-Api-Key": key}):
        status, answer_headers, _ = call(f.url + "/v1/models", headers=headers)
        assert status == 401 and answer_headers.get("www-authenticate") == "Bearer", headers
    assert f.router.seen == []
    assert call(f.url + "/readiness")[0] == 200  # the kubelet's probes carry no key
    assert call(f.url + "/workers", headers={"Authorization": f"Bearer {key}"})[0] == 404
    status, _, body = call(f.url + "/v1/chat/completions", "POST", {"m": 1}, {"Authorization": f"Bearer {key}"})
    assert status == 200
    assert all("authorization" not in headers for _, _, headers in f.router.seen)
    assert key not in f.log.read_text()


def test_an_empty_key_refuses_every_request(front: Callable[..., Front]) -> None:
    f = front(FrontPlan(api_key=("secret", "key")), api_key="")
    for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": "Bearer"}):
        assert call(f.url + "/v1/models", headers=headers)[0] == 401
    assert call(f.url + "/health")[0] == 200


def test_admission_queues_then_refuses_with_retry_after(front: Callable[..., Front]) -> None:
    f = front(FrontPlan(max_concurrent=2, queue_size=1, queue_timeout_seconds=2))
    results: list[tuple[int, dict[str, str]]] = []

    def slow(seconds: float) -> None:
        status, headers, _ = call(f.url + "/v1/completions", "POST", {"sleep": seconds})
        results.append((status, headers))

    threads = [threading.Thread(target=slow, args=(3.5,)) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    queued = threading.Thread(target=slow, args=(0,))
    queued.start()  # waits for a slot; both stay taken past the 2 s queue timeout
    time.sleep(0.5)
    status, headers, body = call(f.url + "/v1/completions", "POST", {"sleep": 0})
    assert status == 429 and headers.get("retry-after") == "1", body
    assert json.loads(body)["error"]["code"] == 429
    assert call(f.url + "/readiness")[0] == 200  # probes are never queued nor refused
    for t in [*threads, queued]:
        t.join(20)
    assert sorted(s for s, _ in results) == [200, 200, 503]
    assert next(h for s, h in results if s == 503).get("retry-after") == "1"
    metrics = call(f.metrics + "/metrics")[2].decode()
    assert 'haproxy_frontend_http_responses_total{proxy="front",code="4xx"} 1' in metrics
    assert 'haproxy_backend_http_responses_total{proxy="router",code="5xx"}' in metrics


def test_a_dead_router_gets_a_json_503_and_the_front_stays_alive(front: Callable[..., Front]) -> None:
    f = front(router_up=False)
    status, headers, body = call(f.url + "/v1/models")
    assert status == 503 and headers.get("retry-after") == "1"
    assert json.loads(body)["error"]["code"] == 503
    assert call(f.metrics + HEALTH_PATH)[0] == 200
    assert call(f.metrics + "/v1/models")[0] == 404  # no inference on the metrics port


def _rendered_fronts() -> dict[str, str]:
    """The front configuration of every golden router Deployment, and of one with every option."""
    from tests.golden.scenarios import SCENARIOS
    from tests.golden.test_golden import rendered_objects

    out = {}
    for scenario in sorted(SCENARIOS):
        for obj in rendered_objects(scenario):
            if obj["kind"] == "Deployment":
                (front_c,) = [c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == "front"]
                out[f"{scenario}/{obj['metadata']['name']}"] = next(
                    e["value"] for e in front_c["env"] if e["name"] == CONFIG_ENV)
    out["every-option"] = front_config(FrontPlan(max_concurrent=64, queue_size=0, queue_timeout_seconds=1,
                                                 api_key=("s", "k")), drain_seconds=600)
    return out


@pytest.mark.parametrize(("name", "config"), sorted(_rendered_fronts().items()))
def test_haproxy_accepts_every_rendered_configuration(tmp_path: Path, name: str, config: str) -> None:
    """HAProxy's own parser, with warnings as failures (-dW): what the router pods would run."""
    path = tmp_path / "front.cfg"
    path.write_text(config + "\n")
    result = subprocess.run([haproxy(), "-c", "-dW", "-f", str(path)], capture_output=True, text=True, timeout=30,
                            env={"KIMIK3_API_KEY": "k", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_stream_passes_token_by_token(front: Callable[..., Front]) -> None:
    """Each event leaves the front as the router sends it (`option http-no-delay`), not in bursts."""
    import http.client

    f = front()
    host, port = urlsplit(f.url).netloc.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    conn.request("POST", "/v1/completions", body=json.dumps({"stream": 20}),
                 headers={"content-type": "application/json"})
    answer = conn.getresponse()
    arrivals = []
    while line := answer.readline():  # de-chunked, as it arrives
        if line.startswith(b"data:"):
            arrivals.append(time.monotonic())
    conn.close()
    gaps = sorted(b - a for a, b in zip(arrivals, arrivals[1:], strict=False))
    assert len(arrivals) == 20 and gaps[len(gaps) // 2] > 0.03, gaps  # the stand-in's 50 ms, not ~0
