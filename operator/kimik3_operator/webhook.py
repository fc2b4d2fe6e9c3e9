"""The validating admission webhook: HTTPS with aiohttp on the operator's event loop, in every replica.

It answers from the pure planner alone (planner/admission.py), reads nothing from the cluster and
writes nothing, so the standby replica serves it as well as the active one and a webhook call
never waits on leader election. The API server sends AdmissionReview v1; we answer allowed, or
refused with the planner's reason as the message `kubectl apply` prints.

The port is reachable from wherever the API server's traffic comes from, which is often anywhere
(see the chart's NetworkPolicy), and this process is also the operator's leader, so no caller may
cost more than `Limits` allows. asyncio does each TLS handshake as the bytes arrive (a silent
caller costs a socket, not a thread, and never holds up another's handshake), under a deadline;
connections beyond a cap, handshaking ones included, are closed as soon as they are accepted;
aiohttp's parser bounds the header lines and their number and its idle timer the time headers may
take; a body is read only when its declared length is within bounds, under a deadline; and the
decoding and judging, the only CPU-heavy part, runs on a small pool of its own, one body at a time
(a parsed JSON document can be twenty times its text), so kopf's loop goes on turning meanwhile.
Whatever is not an AdmissionReview gets a 400 with a JSON error.

The certificate is read from files and read again when they change (a mounted Secret that
cert-manager or the operator's own certificate keeper rotated): new connections get the new one,
open ones keep theirs, nothing restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import ssl
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.web_protocol import RequestHandler

from .planner.admission import admission_verdict

log = logging.getLogger(__name__)
PATH = "/validate"
API_VERSION = "admission.k8s.io/v1"


@dataclass(frozen=True)
class Limits:
    """What one caller may cost. The API server sends a few hundred bytes of headers and a body
    well under `max_body`, may keep the connection for the next review, and gives up after the
    webhook's timeoutSeconds (5 s in the chart): a caller slower than that is not it."""

    max_body: int = 3 * 1024 * 1024
    """The API server's own limit on a request body; larger is refused (413) unread."""
    max_header_line: int = 8 * 1024
    """The request line and each header line (aiohttp's max_line_size and max_field_size)."""
    max_headers: int = 32
    """Header lines per request: with `max_header_line`, what the headers of one request hold."""
    connections: int = 16
    """Connections open at once, those still in their TLS handshake included; more are closed as
    soon as they are accepted."""
    decoding: int = 1
    """Bodies decoded and judged at once: the memory of parsed JSON, and CPU-bound anyway."""
    handshake_seconds: float = 5.0
    header_seconds: float = 5.0
    """From the handshake, or from the previous answer on a kept-alive connection, until the
    request's headers are in: aiohttp's keep-alive timer, which also closes an idle connection."""
    body_seconds: float = 10.0
    """Also how long a body waits for its turn to be decoded."""
    reload_seconds: float = 5.0
    """How often the certificate files are checked for a change."""


class MalformedReview(ValueError):
    """The body is not an AdmissionReview v1 request."""


def parse_review(body: bytes) -> dict[str, Any]:
    """The AdmissionReview in `body`, or MalformedReview saying what is wrong with it."""
    try:
        review = json.loads(body)
    except RecursionError as exc:  # nested deeper than the decoder's stack
        raise MalformedReview("JSON nested too deeply") from exc
    except ValueError as exc:  # not UTF-8, not JSON, or an integer too long to convert
        raise MalformedReview(f"not JSON: {exc}") from exc
    if not isinstance(review, dict):
        raise MalformedReview(f"not a JSON object but {type(review).__name__}")
    if (review.get("apiVersion"), review.get("kind")) != (API_VERSION, "AdmissionReview"):
        raise MalformedReview(f"not an AdmissionReview {API_VERSION}")
    request = review.get("request")
    if not isinstance(request, dict):
        raise MalformedReview("request is not an object")
    if not isinstance(request.get("uid"), str) or not request["uid"]:
        raise MalformedReview("request.uid is not a non-empty string")
    if not isinstance(request.get("operation"), str):
        raise MalformedReview("request.operation is not a string")
    if not isinstance(request.get("object"), dict | None):
        raise MalformedReview("request.object is not an object")
    return review


def review_response(review: dict[str, Any]) -> dict[str, Any]:
    request = review.get("request") or {}
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    obj = request.get("object")
    if request.get("operation") in ("CREATE", "UPDATE") and isinstance(obj, dict):
        try:
            verdict = admission_verdict(obj)
        except RecursionError:  # valid JSON nested deeper than validation recurses
            verdict = "InvalidSpec: the object is nested too deeply"
        if verdict is not None:
            response.update(allowed=False, status={"code": 422, "reason": "Invalid", "message": verdict})
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def judge(body: bytes) -> dict[str, Any]:
    """The answer to `body`: the pool's work, decoding and planning in one go."""
    return review_response(parse_review(body))


def _error(code: int, message: str) -> web.Response:
    response = web.json_response({"code": code, "error": message}, status=code)
    response.force_close()
    return response


class _JsonErrors(RequestHandler):
    """aiohttp's connection handler, refusing what its parser refuses with a JSON error, quietly."""

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if isinstance(exc, LineTooLong) or (isinstance(exc, BadHttpMessage) and "Too many headers" in str(exc)):
            limits = self._manager.limits if isinstance(self._manager, _Server) else Limits()
            status, message = 431, (f"request headers over {limits.max_headers} lines of "
                                    f"{limits.max_header_line} bytes")
        if status >= 500:
            log.error("Webhook: answering %s failed", request.remote, exc_info=exc)
        else:
            log.debug("Webhook: refused a request from %s: %s", request.remote, exc)
        return _error(status, message or HTTPStatus(status).phrase)


class _Server(web.Server):
    def __init__(self, handler: Any, limits: Limits, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.limits = limits

    def __call__(self) -> RequestHandler:
        return _JsonErrors(self, loop=self._loop, **self._kwargs)


class CertificateFiles:
    """A PEM certificate chain and key on disk, as an SSLContext made again when they change."""

    def __init__(self, certfile: str | os.PathLike[str], keyfile: str | os.PathLike[str]) -> None:
        self.certfile, self.keyfile = Path(certfile), Path(keyfile)
        self._seen: tuple[Any, ...] | None = None

    def _signature(self) -> tuple[Any, ...] | None:
        """What changes when either file is replaced, rewritten, or a mounted Secret's link
        swapped (os.stat follows the link); None while either is missing."""
        try:
            return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in map(os.stat, (self.certfile, self.keyfile)))
        except FileNotFoundError:
            return None

    def changed(self) -> bool:
        return (signature := self._signature()) is not None and signature != self._seen

    def context(self) -> ssl.SSLContext:
        """A server context with the files as they are now (ssl.SSLError if they do not match,
        e.g. read between the writes of a new certificate and its key: try again later)."""
        signature = self._signature()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.certfile, self.keyfile)
        self._seen = signature
        return context


class WebhookServer:
    """The webhook on (host, port): `await start()` on the operator's loop, `await stop()` at the
    end. Until the certificate files exist (the keeper writes them) nothing listens."""

    def __init__(self, host: str, port: int, certificate: CertificateFiles, limits: Limits | None = None) -> None:
        self.host, self.limits, self.certificate = host, limits or Limits(), certificate
        self.port = port
        """The bound port once listening (port 0 picks a free one)."""
        self.listening: asyncio.Event | None = None
        """Set once listening (made in start(), on the loop)."""
        self._context: ssl.SSLContext | None = None
        self._sock: socket.socket | None = None
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._handshakes: set[asyncio.Task[None]] = set()
        self._handshaking = 0
        self._decoding: asyncio.Semaphore | None = None
        self._pool = ThreadPoolExecutor(max_workers=self.limits.decoding, thread_name_prefix="webhook")
        self._warned = float("-inf")

    def alive(self) -> bool:
        """The accept loop runs (or waits for its certificate): what the liveness probe adds to
        the loop's own answer."""
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        self.listening = asyncio.Event()
        self._decoding = asyncio.Semaphore(self.limits.decoding)
        self._server = _Server(self._handle, self.limits, loop=asyncio.get_running_loop(), access_log=None,
                               keepalive_timeout=self.limits.header_seconds, tcp_keepalive=False,
                               max_line_size=self.limits.max_header_line,
                               max_field_size=self.limits.max_header_line, max_headers=self.limits.max_headers,
                               lingering_time=0)
        self._task = asyncio.create_task(self._serve(), name="kimik3-webhook")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._handshakes):
            task.cancel()
        if self._server is not None:
            self._server.pre_shutdown()
            await self._server.shutdown(1.0)
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._context = await self._first_context()
        self._sock = socket.create_server((self.host, self.port), backlog=self.limits.connections)
        self._sock.setblocking(False)
        self.port = self._sock.getsockname()[1]
        reloading = asyncio.create_task(self._reload(), name="kimik3-webhook-reload")
        log.info("Validating webhook on https://%s:%s%s", self.host, self.port, PATH)
        if self.listening is not None:
            self.listening.set()
        try:
            while True:
                try:
                    conn, address = await loop.sock_accept(self._sock)
                except OSError as exc:  # e.g. out of file descriptors: the loop must go on
                    log.warning("Webhook: accept failed: %s", exc)
                    await asyncio.sleep(0.1)
                    continue
                if self._handshaking + len(self._server.connections if self._server else ()) >= self.limits.connections:
                    self._refuse(conn, address)
                    continue
                self._handshaking += 1  # now: the next accept may come before the task starts
                task = asyncio.create_task(self._connect(conn, address))
                self._handshakes.add(task)
                task.add_done_callback(self._handshakes.discard)
        finally:
            reloading.cancel()
            self._sock.close()

    def _refuse(self, conn: socket.socket, address: Any) -> None:
        conn.close()
        now = asyncio.get_running_loop().time()
        if now - self._warned > 10:
            self._warned = now
            log.warning("Webhook: %d connections open, closing new ones (from %s)",
                        self.limits.connections, address[0])

    async def _connect(self, conn: socket.socket, address: Any) -> None:
        """The TLS handshake, as the bytes come; then aiohttp has the connection."""
        assert self._server is not None and self._context is not None
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                self._server, conn, ssl=self._context, ssl_handshake_timeout=self.limits.handshake_seconds)
        except (TimeoutError, OSError) as exc:  # ssl.SSLError, a timeout, a reset: the caller is gone
            log.debug("Webhook: TLS handshake with %s failed: %s", address[0], exc)
            conn.close()
        finally:
            self._handshaking -= 1

    async def _first_context(self) -> ssl.SSLContext:
        waiting = False
        while True:
            if self.certificate.changed():
                try:
                    return self.certificate.context()
                except (OSError, ssl.SSLError) as exc:
                    log.warning("Webhook: certificate %s not usable yet: %s", self.certificate.certfile, exc)
            elif not waiting:
                log.info("Webhook: waiting for its certificate %s", self.certificate.certfile)
            waiting = True
            await asyncio.sleep(min(self.limits.reload_seconds, 0.2))  # a stat: listen soon after the keeper wrote

    async def _reload(self) -> None:
        while True:
            await asyncio.sleep(self.limits.reload_seconds)
            if not self.certificate.changed():
                continue
            try:
                self._context = self.certificate.context()
            except (OSError, ssl.SSLError) as exc:  # half-written: the next turn sees it whole
                log.warning("Webhook: new certificate %s not loaded (yet): %s", self.certificate.certfile, exc)
                continue
            log.info("Webhook: certificate %s reloaded; new connections use it", self.certificate.certfile)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        limits = self.limits
        if request.method != "POST":
            return _error(501, f"{request.method} is not served")
        if request.path != PATH:
            return _error(404, f"only {PATH} is served")
        if "Transfer-Encoding" in request.headers:
            return _error(411, "a Content-Length is required, not a Transfer-Encoding")
        length = request.content_length
        if length is None:
            return _error(411, "Content-Length must be one decimal number")
        if length > limits.max_body:
            return _error(413, f"body over {limits.max_body} bytes")
        try:
            async with asyncio.timeout(limits.body_seconds):
                body = await request.content.readexactly(length)
        except TimeoutError:
            return _error(408, f"body not received within {limits.body_seconds:g}s")
        except asyncio.IncompleteReadError:
            return _error(400, "body shorter than its Content-Length")
        except OSError:  # the caller is gone: nobody reads the answer
            return _error(400, "connection lost")
        assert self._decoding is not None
        try:
            async with asyncio.timeout(limits.body_seconds):
                await self._decoding.acquire()
        except TimeoutError:
            return _error(503, "busy")
        try:
            answer = await asyncio.get_running_loop().run_in_executor(self._pool, judge, body)
        except MalformedReview as exc:
            return _error(400, str(exc))
        finally:
            self._decoding.release()
        return web.json_response(answer)
