"""A fake API server on 127.0.0.1: just enough discovery for the dynamic client to find Services,
Events and KimiK3Deployments, and a record of every other request it receives (each answered with
the body it carried), so a test can tell which writes reached the server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kimik3_operator.api import GROUP, KIND, PLURAL, VERSION


def _resource(name: str, kind: str, verbs: list[str], namespaced: bool = True) -> dict[str, Any]:
    return {"name": name, "singularName": "", "namespaced": namespaced, "kind": kind, "verbs": verbs}


VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
DISCOVERY: dict[str, dict[str, Any]] = {
    "/version": {"major": "1", "minor": "36", "gitVersion": "v1.36.0"},
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": GROUP, "versions": [{"groupVersion": f"{GROUP}/{VERSION}", "version": VERSION}],
         "preferredVersion": {"groupVersion": f"{GROUP}/{VERSION}", "version": VERSION}}]},
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        _resource("services", "Service", VERBS), _resource("events", "Event", VERBS),
        _resource("nodes", "Node", VERBS, namespaced=False)]},
    f"/apis/{GROUP}/{VERSION}": {"kind": "APIResourceList", "groupVersion": f"{GROUP}/{VERSION}", "resources": [
        _resource(PLURAL, KIND, VERBS), _resource(f"{PLURAL}/status", KIND, ["get", "patch", "update"])]},
}
LISTS: dict[str, dict[str, Any]] = {
    "/api/v1/nodes": {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": []},
}
"""What a read finds (nothing), to show reads still go through once writes may not."""


class FakeApiServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.writes: list[tuple[str, str]] = []
        """(method, path) of every request that is not a GET, in order."""


class _Handler(BaseHTTPRequestHandler):
    server: FakeApiServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        found = {**DISCOVERY, **LISTS}.get(self.path.split("?")[0])
        self._answer(200 if found else 404, found or {"kind": "Status", "code": 404})

    def _write(self) -> None:
        self.server.writes.append((self.command, self.path.split("?")[0]))
        length = int(self.headers.get("Content-Length") or 0)
        sent = json.loads(self.rfile.read(length)) if length else None
        if isinstance(sent, dict) and "kind" in sent:  # an object written: as stored
            self._answer(200, {**sent, "metadata": {"uid": "uid-1", **sent.get("metadata", {})}})
        else:  # a delete, or a JSON patch
            self._answer(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

    do_POST = do_PATCH = do_PUT = do_DELETE = _write


@contextmanager
def fake_api_server() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
