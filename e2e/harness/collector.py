"""An OTLP/HTTP traces receiver on loopback, standing in for the OpenTelemetry Collector: it takes
what the engines post (protobuf, vLLM's OTLP/HTTP exporter) and what kimik3-router posts (OTLP's
JSON encoding) on one path, as the Collector's otlp receiver does, and decodes both into
opentelemetry-proto's own ExportTraceServiceRequest: a body that does not parse as that message
(an unknown field, a wrong type, an id of the wrong length) is answered 400 and counted, never
kept, so what the tests read is what a real receiver would have accepted."""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

PATH = "/v1/traces"


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    service: str
    attributes: dict[str, Any]
    error: bool


def _hex_ids_to_base64(obj: Any) -> Any:
    """OTLP/JSON spells trace and span ids as hex (the OTLP specification's exception to protobuf's
    JSON mapping, which reads bytes as base64): turned into what json_format parses."""
    if isinstance(obj, dict):
        return {k: (base64.b64encode(bytes.fromhex(v)).decode() if k in ("traceId", "spanId", "parentSpanId")
                    and isinstance(v, str) else _hex_ids_to_base64(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_hex_ids_to_base64(v) for v in obj]
    return obj


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def decode(body: bytes, content_type: str) -> list[Span]:
    request = ExportTraceServiceRequest()
    if content_type.startswith("application/json"):
        json_format.Parse(json.dumps(_hex_ids_to_base64(json.loads(body))), request)
    elif content_type.startswith("application/x-protobuf"):
        request.ParseFromString(body)
    else:
        raise ValueError(f"content type {content_type!r}")
    out = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope in resource_spans.scope_spans:
            for s in scope.spans:
                if len(s.trace_id) != 16 or len(s.span_id) != 8 or len(s.parent_span_id) not in (0, 8):
                    raise ValueError(f"span {s.name!r} has ids of the wrong length")
                out.append(Span(s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name, s.kind,
                                str(resource.get("service.name", "")),
                                {a.key: _value(a.value) for a in s.attributes}, s.status.code == 2))
    return out


@dataclass
class Collector:
    spans: list[Span] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def start(self) -> Collector:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    if self.path != PATH:
                        raise ValueError(f"path {self.path}")
                    got = decode(body, self.headers.get("Content-Type", ""))
                except Exception as exc:  # noqa: BLE001 - any refusal is counted, with its reason
                    collector.refused.append(f"{self.headers.get('Content-Type')}: {exc}")
                    self.send_response(400)
                    self.end_headers()
                    return
                collector.spans.extend(got)
                # An empty ExportTraceServiceResponse: full success (both exporters read the status).
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}{PATH}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()

