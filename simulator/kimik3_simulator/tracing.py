"""The engine's request span, made as vLLM 0.33.0 makes it: with `--otlp-traces-endpoint`, one
`llm_request` SERVER span per finished request, started at its arrival, a child of the trace
context the request's `traceparent` names (vllm/v1/engine/output_processor.py `do_tracing`), with
the OpenTelemetry SDK and OTLP exporter vLLM uses (vllm/tracing/otel.py, at the serving image's
pins), the exporter picked by OTEL_EXPORTER_OTLP_TRACES_PROTOCOL and the sampler and service name
read by the SDK from OTEL_TRACES_SAMPLER(_ARG) and OTEL_SERVICE_NAME, which the operator renders.

One difference, stated: the simulator carries only the OTLP/HTTP exporter (vLLM's gRPC one needs
grpcio); given `grpc` it says so once at start and exports nothing."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger("kimik3_simulator.tracing")

TRACE_HEADERS = ("traceparent", "tracestate")
"""vllm/tracing/utils.py TRACE_HEADERS: what the frontend keeps of a request's headers."""


class RequestTracer:
    def __init__(self, endpoint: str | None, exporter: SpanExporter | None = None) -> None:
        """`exporter`: where spans go instead of OTLP/HTTP to `endpoint` (a test's memory)."""
        self.provider: TracerProvider | None = None
        self.tracer: Tracer | None = None
        if not endpoint:
            return
        protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
        if protocol != "http/protobuf":
            log.warning("--otlp-traces-endpoint with protocol %s: the simulator exports OTLP/HTTP only; no spans",
                        protocol)
            return
        resource = Resource.create({"vllm.instrumenting_module_name": "vllm.llm_engine",
                                    "vllm.process_id": str(os.getpid())})
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=endpoint),
                                                            schedule_delay_millis=500))
        self.tracer = self.provider.get_tracer("vllm.llm_engine")

    def finished(self, headers: Mapping[str, str], arrival_wall: float, attributes: dict[str, Any]) -> None:
        """The span of a request that ended now and arrived at `arrival_wall` (time.time())."""
        if self.tracer is None:
            return
        carrier = {name: headers[name] for name in TRACE_HEADERS if name in headers}
        context = TraceContextTextMapPropagator().extract(carrier) if carrier else None
        span = self.tracer.start_span("llm_request", context=context, kind=SpanKind.SERVER,
                                      start_time=int(arrival_wall * 1e9), attributes=attributes)
        span.end(end_time=time.time_ns())

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()
