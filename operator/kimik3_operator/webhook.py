"""The validating admission webhook: HTTPS on its own thread, in every operator replica.

It answers from the pure planner alone (planner/admission.py), reads nothing from the cluster and
writes nothing, so the standby replica serves it as well as the active one and a webhook call
never waits on leader election. The API server sends AdmissionReview v1; we answer allowed, or
refused with the planner's reason as the message `kubectl apply` prints.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .planner.admission import admission_verdict

log = logging.getLogger(__name__)
PATH = "/validate"
MAX_BODY = 3 * 1024 * 1024  # the API server's own request limit for an object is ~3 MiB


def review_response(review: dict[str, Any]) -> dict[str, Any]:
    request = review.get("request") or {}
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    obj = request.get("object")
    if request.get("operation") in ("CREATE", "UPDATE") and isinstance(obj, dict):
        verdict = admission_verdict(obj)
        if verdict is not None:
            response.update(allowed=False, status={"code": 422, "reason": "Invalid", "message": verdict})
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the API server calls often: keep quiet
        log.debug(format, *args)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if self.path.split("?")[0] != PATH or not 0 < length <= MAX_BODY:
            self.send_error(404 if self.path.split("?")[0] != PATH else 413)
            return
        try:
            answer = review_response(json.loads(self.rfile.read(length)))
        except ValueError:
            self.send_error(400, "not an AdmissionReview")
            return
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def serve_webhook(host: str, port: int, certfile: str, keyfile: str) -> ThreadingHTTPServer:
    """Start serving on (host, port) with the given certificate; returns the running server."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    server = ThreadingHTTPServer((host, port), _Handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="kimik3-webhook", daemon=True).start()
    log.info("Validating webhook on https://%s:%s%s", host, server.server_address[1], PATH)
    return server
