"""The simulator's llm_request span (kimik3_simulator/tracing.py), as vLLM 0.33.0 makes it: a SERVER
span started at the request's arrival, a child of the caller's traceparent, sampled by the
caller's flag under OTEL_TRACES_SAMPLER=parentbased_traceidratio."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from kimik3_simulator.tracing import RequestTracer


def test_the_request_span_joins_the_callers_trace_and_honours_its_sampled_flag(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "kimi-k3-decode")
    memory = InMemorySpanExporter()
    tracer = RequestTracer("http://127.0.0.1:9/v1/traces", exporter=memory)
    arrival = time.time() - 2.0
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    tracer.finished({"traceparent": f"00-{trace}-00f067aa0ba902b7-01"}, arrival, {"gen_ai.request.id": "leg-1"})
    tracer.finished({"traceparent": f"00-{trace}-00f067aa0ba902b7-00"}, arrival, {"gen_ai.request.id": "leg-2"})
    tracer.finished({}, arrival, {"gen_ai.request.id": "leg-3"})  # a root at ratio 0: not sampled
    tracer.shutdown()  # flushes the batch
    (span,) = memory.get_finished_spans()
    assert span.name == "llm_request" and span.kind == SpanKind.SERVER
    assert f"{span.context.trace_id:032x}" == trace and f"{span.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert span.attributes["gen_ai.request.id"] == "leg-1"
    assert abs(span.start_time / 1e9 - arrival) < 0.01 and span.end_time > span.start_time + 1.9e9
    assert span.resource.attributes["service.name"] == "kimi-k3-decode"


def test_grpc_is_said_once_and_exports_nothing(monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    tracer = RequestTracer("http://127.0.0.1:9")
    assert tracer.tracer is None and "OTLP/HTTP only" in caplog.text
    tracer.finished({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, time.time(), {})
