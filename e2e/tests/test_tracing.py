"""A trace end to end (docs/tracing.md): spec.engine.tracing on a P/D deployment makes kimik3-router
export a server span per request and a client span per leg, and each engine (the simulator, with
vLLM's own OpenTelemetry SDK and OTLP/HTTP exporter) an llm_request span under the leg that sent
it; all of them in the caller's trace, received by a collector stand-in on loopback that parses
each body as opentelemetry-proto's ExportTraceServiceRequest (e2e/harness/collector.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness.collector import Collector, Span
from e2e.harness.kube import ROOT, apply, delete_deployments, get_json, is_ready, kubectl, wait_for
from e2e.harness.pod_runner import PodRunner
from e2e.harness.traffic import post, prompt, ready_router

from .conftest import REPORT

pytestmark = pytest.mark.e2e

PD_EXAMPLE = ROOT / "manifests" / "examples" / "pd-gb300-decode-b200-prefill.yaml"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def collector() -> Iterator[Collector]:
    running = Collector().start()
    yield running
    running.stop()


def test_one_trace_runs_from_the_client_through_the_router_legs_to_each_engine(
        operator: Path, stager: Any, pod_runner: PodRunner, namespace: str, collector: Collector) -> None:
    pod_runner.play(namespace)
    kubectl("-n", namespace, "create", "secret", "generic", "hf-token", "--from-literal=token=hf_e2e")
    body = yaml.safe_load(PD_EXAMPLE.read_text())
    body["metadata"] = {"name": "k3-traced", "namespace": namespace}
    body["spec"].setdefault("engine", {}).update(
        rustFrontend=False,  # vLLM's Rust frontend exits on --otlp-traces-endpoint (admission says so)
        tracing={"endpoint": collector.url, "protocol": "http/protobuf", "samplingRatio": 0.0})
    apply(body)
    try:
        wait_for("k3-traced Ready", lambda: is_ready(get_json("k3", "k3-traced", "-n", namespace)), timeout=240)
        router = ready_router(pod_runner, namespace, "k3-traced-router")
        traces = [f"{i:02x}" + "4bf92f3577b34da6a3ce929d0e0e47" for i in range(1, 4)]
        for i, trace in enumerate(traces):
            request: dict[str, Any] = {"model": "kimi-k3", "max_tokens": 16, "stream": i == 1}
            if i == 2:
                request["messages"] = [{"role": "user", "content": prompt(64, f"t{i}-")}]
            else:
                request["prompt"] = prompt(64, f"t{i}-")
            answer = post(router.url, "/v1/chat/completions" if i == 2 else "/v1/completions", request,
                          headers={"traceparent": f"00-{trace}-{CLIENT_SPAN}-01"})
            assert answer.status == 200 and not answer.error, answer
        # Not sampled by the caller, and samplingRatio 0: nothing of it may be exported by anyone.
        quiet = post(router.url, "/v1/completions", {"model": "kimi-k3", "max_tokens": 8, "prompt": "quiet"},
                     headers={"traceparent": f"00-{'ab' * 16}-{CLIENT_SPAN}-00"})
        assert quiet.status == 200

        def complete() -> list[Span] | None:
            by_trace = [[s for s in collector.spans if s.trace_id == t] for t in traces]
            return collector.spans if all(len(spans) >= 5 for spans in by_trace) else None
        wait_for("router and engine spans of the three traces", complete, timeout=60)
        assert not collector.refused, collector.refused
        for trace in traces:
            spans = [s for s in collector.spans if s.trace_id == trace]
            (server,) = [s for s in spans if s.service == "kimi-k3-router" and s.kind == 2]
            assert server.parent_id == CLIENT_SPAN and not server.error
            legs = {s.attributes["kimik3.role"]: s for s in spans if s.service == "kimi-k3-router" and s.kind == 3}
            assert set(legs) == {"prefill", "decode"} and all(leg.parent_id == server.span_id for leg in legs.values())
            engine = {s.service: s for s in spans if s.name == "llm_request"}
            assert set(engine) == {"kimi-k3-prefill", "kimi-k3-decode"}, spans
            for role, leg in legs.items():
                span = engine[f"kimi-k3-{role}"]
                assert span.parent_id == leg.span_id and span.kind == 2, (role, span, leg)
                # The request id vLLM traces is the leg's own (kimik3-router's x-request-id).
                assert span.attributes["gen_ai.request.id"] == leg.attributes["kimik3.leg_id"]
            assert engine["kimi-k3-decode"].attributes["gen_ai.usage.completion_tokens"] > 0
        assert not [s for s in collector.spans if s.trace_id == "ab" * 16], "an unsampled request was exported"
        REPORT.append(f"tracing: {len(collector.spans)} spans in {len(traces)} traces (router server + 2 legs, "
                      "prefill and decode llm_request), none refused by the OTLP parser, none of the unsampled one")
    finally:
        delete_deployments(namespace, "k3-traced")
