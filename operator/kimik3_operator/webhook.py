"""The validating admission webhook: HTTPS on its own thread, in every operator replica.

It answers from the pure planner alone (planner/admission.py), reads nothing from the cluster and
writes nothing, so the standby replica serves it as well as the active one and a webhook call
never waits on leader election. The API server sends AdmissionReview v1; we answer allowed, or
refused with the planner's reason as the message `kubectl apply` prints.

The port is reachable from wherever the API server's traffic comes from, which is often anywhere
(see the chart's NetworkPolicy), and this process is also the operator's leader, so no caller may
cost more than `Limits` allows: the accept loop only accepts (the TLS handshake and every read
happen on the connection's own thread, each under a deadline), connections beyond a cap are
closed at once, a body is read only when its declared length is within bounds, one body at a time
is decoded (a parsed JSON document can be twenty times its text), and whatever is not an
AdmissionReview gets a 400 with a JSON error.
"""

from __future__ import annotations

import io
import json
import logging
import re
import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from .planner.admission import admission_verdict

log = logging.getLogger(__name__)
PATH = "/validate"
API_VERSION = "admission.k8s.io/v1"


@dataclass(frozen=True)
class Limits:
    """What one caller may cost. The API server opens a connection per review (we answer
    HTTP/1.0), sends a few hundred bytes of headers and a body well under `max_body`, and gives up
    after the webhook's timeoutSeconds (5 s in the chart): a caller slower than that is not it."""

    max_body: int = 3 * 1024 * 1024
    """The API server's own limit on a request body; larger is refused (413) unread."""
    max_header_bytes: int = 16 * 1024
    connections: int = 16
    """Connections served at once; more are closed as soon as they are accepted."""
    decoding: int = 1
    """Bodies decoded and judged at once: the memory of parsed JSON, and CPU-bound anyway."""
    handshake_seconds: float = 5.0
    header_seconds: float = 5.0
    body_seconds: float = 10.0
    """Also how long a body waits for its turn to be decoded, and how long the answer may take
    to send."""


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


class _DeadlineReader(io.RawIOBase):
    """The socket as a stream whose reads share one deadline, however slowly the bytes trickle in
    (each recv waits only for the time left; a socket timeout alone restarts with every byte),
    and that ends after `limit` bytes (`overrun` then says a read wanted more)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._deadline = 0.0
        self._left: int | None = None
        self.overrun = False

    def readable(self) -> bool:
        return True

    def allow(self, seconds: float, limit: int | None = None) -> None:
        self._deadline, self._left = time.monotonic() + seconds, limit

    def readinto(self, buffer: Any) -> int:
        if self._left is not None and self._left <= 0:
            self.overrun = True
            return 0
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("read deadline passed")
        self._sock.settimeout(remaining)
        view = memoryview(buffer)
        read = self._sock.recv_into(view if self._left is None else view[:self._left])
        if self._left is not None:
            self._left -= read
        return read


_LENGTH = re.compile(r"[0-9]{1,12}")


class _Handler(BaseHTTPRequestHandler):
    server: WebhookServer
    default_request_version = "HTTP/1.0"  # so even an answer to a garbled request line has a status

    def log_message(self, format: str, *args: Any) -> None:  # the API server calls often: keep quiet
        log.debug(format, *args)

    def setup(self) -> None:
        super().setup()
        limits = self.server.limits
        self.rfile.close()  # the plain one: reads go through the deadline instead
        self._reader = _DeadlineReader(self.connection)
        self._reader.allow(limits.header_seconds, limits.max_header_bytes)
        self.rfile = io.BufferedReader(self._reader)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Every refusal, ours and http.server's (bad request line, unsupported method), as JSON."""
        self.close_connection = True
        self._reply(code, {"code": code, "error": message or HTTPStatus(code).phrase})

    def _reply(self, code: int, answer: dict[str, Any]) -> None:
        data = json.dumps(answer).encode()
        self.connection.settimeout(self.server.limits.body_seconds)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _content_length(self) -> int | None:
        values = set(self.headers.get_all("Content-Length") or ())
        if len(values) != 1 or not _LENGTH.fullmatch(value := values.pop()):
            return None
        return int(value)

    def do_POST(self) -> None:
        limits = self.server.limits
        if self._reader.overrun:
            return self.send_error(431, f"request headers over {limits.max_header_bytes} bytes")
        if urlsplit(self.path).path != PATH:
            return self.send_error(404, f"only {PATH} is served")
        if self.headers.get("Transfer-Encoding"):
            return self.send_error(411, "a Content-Length is required, not a Transfer-Encoding")
        length = self._content_length()
        if length is None:
            return self.send_error(400 if "Content-Length" in self.headers else 411,
                                   "Content-Length must be one decimal number")
        if length > limits.max_body:
            return self.send_error(413, f"body over {limits.max_body} bytes")
        self._reader.allow(limits.body_seconds)
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            return self.send_error(408, f"body not received within {limits.body_seconds:g}s")
        if len(body) < length:
            return self.send_error(400, "body shorter than its Content-Length")
        if not self.server.decoding.acquire(timeout=limits.body_seconds):
            return self.send_error(503, "busy")
        try:
            answer = review_response(parse_review(body))
        except MalformedReview as exc:
            return self.send_error(400, str(exc))
        finally:
            self.server.decoding.release()
        self._reply(200, answer)


class WebhookServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with TLS per connection, on the connection's thread, and `Limits`."""

    daemon_threads = True
    block_on_close = False  # keep no list of threads, and never wait for them on close

    def __init__(self, address: tuple[str, int], context: ssl.SSLContext, limits: Limits) -> None:
        self.request_queue_size = limits.connections  # the listen backlog
        super().__init__(address, _Handler)
        self.context, self.limits = context, limits
        self._slots = threading.BoundedSemaphore(limits.connections)
        self.decoding = threading.BoundedSemaphore(limits.decoding)
        self.heartbeat = time.monotonic()
        self._warned = float("-inf")

    def service_actions(self) -> None:
        """Called by serve_forever on every turn of its loop (at least every poll interval)."""
        self.heartbeat = time.monotonic()

    def alive(self, stale_seconds: float = 10.0) -> bool:
        """The accept loop turned recently: what the liveness probe reports."""
        return time.monotonic() - self.heartbeat < stale_seconds

    def verify_request(self, request: Any, client_address: Any) -> bool:
        if self._slots.acquire(blocking=False):
            return True
        if (now := time.monotonic()) - self._warned > 10:
            self._warned = now
            log.warning("Webhook: %d connections open, closing new ones (from %s)",
                        self.limits.connections, client_address[0])
        return False

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()  # no thread started: nothing else releases the slot
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(self.limits.handshake_seconds)
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except OSError as exc:  # ssl.SSLError, a timeout, a reset: the caller is gone
            log.debug("Webhook: TLS handshake with %s failed: %s", client_address[0], exc)
            return
        try:
            _Handler(tls, client_address, self)
        finally:
            self.shutdown_request(tls)  # `request` is detached now: close the TLS socket

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A caller that went away mid-answer is not worth a traceback; anything else is a bug."""
        if isinstance(exc := sys.exception(), OSError):
            log.debug("Webhook: connection from %s: %s", client_address[0], exc)
        else:
            log.exception("Webhook: answering %s failed", client_address[0])


def serve_webhook(host: str, port: int, certfile: str, keyfile: str, limits: Limits | None = None) -> WebhookServer:
    """Start serving on (host, port) with the given certificate; returns the running server."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    server = WebhookServer((host, port), context, limits or Limits())
    threading.Thread(target=server.serve_forever, name="kimik3-webhook", daemon=True).start()
    log.info("Validating webhook on https://%s:%s%s", host, server.server_address[1], PATH)
    return server
