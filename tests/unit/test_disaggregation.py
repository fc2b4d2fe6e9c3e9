"""The Disaggregating condition: the verdict from a decode role's prompt tokens by source, the probe
that measures at its own pace, the condition and its events in a reconcile pass (in-memory
cluster), and the query itself run by Prometheus's own rule tester (promtool) on known series."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kimik3_operator.api import reasons
from kimik3_operator.planner.disaggregation import MIN_TRANSFERRED_SHARE, PromptSources, Verdict, judge, judge_pool
from kimik3_operator.prometheus import PrometheusError
from kimik3_operator.reconcile.disaggregation import CHECK_SECONDS, WINDOW_SECONDS, DisaggregationProbe
from kimik3_operator.reconcile.reconciler import Pass, reconcile
from kimik3_operator.render.names import Owner
from kimik3_operator.render.promql import prompt_tokens_query, selector
from tests.support.cases import base_deployment
from tests.support.clocks import Clock, FakePrometheus
from tests.support.memory_cluster import NODES, MemoryCluster, pd_body, staged
from tests.unit.test_chart_alerts import _promtool

URL = "http://prometheus:9090"
LOCAL, EXTERNAL = 'source="local_compute"', 'source="external_kv_transfer"'


@pytest.mark.parametrize(("local", "external", "status", "reason", "said"), [
    (30.0, 970.0, "True", reasons.PROMPTS_TRANSFERRED, "97% of the prompt tokens"),
    (600.0, 400.0, "False", reasons.DECODE_RECOMPUTES_PROMPTS, "only 40% of the prompt tokens"),
    (1000.0, 0.0, "False", reasons.NO_KV_TRANSFERS, "prefilled every prompt themselves"),
    (0.0, 0.0, "False", reasons.NO_TRAFFIC, "no prompt reached its decode engines"),
    (None, None, "Unknown", reasons.NO_METRICS, "no vllm:prompt_tokens_by_source series"),
    (None, 500.0, "True", reasons.PROMPTS_TRANSFERRED, "100% of the prompt tokens"),  # nothing computed: no series yet
])
def test_a_pools_verdict_follows_where_its_prompt_tokens_came_from(
        local: float | None, external: float | None, status: str, reason: str, said: str) -> None:
    verdict = judge_pool("gb300", PromptSources(local, external), 120)
    assert (verdict.status, verdict.reason) == (status, reason)
    assert verdict.message.startswith("pool gb300: ") and said in verdict.message


def test_the_threshold_sits_between_a_recomputing_and_a_transferring_decode() -> None:
    at = 1000 * MIN_TRANSFERRED_SHARE
    assert judge_pool("p", PromptSources(1000 - at, at), 60).status == "True"
    assert judge_pool("p", PromptSources(1000 - at + 1, at - 1), 60).reason == reasons.DECODE_RECOMPUTES_PROMPTS


def test_the_deployment_takes_the_most_telling_pools_verdict_and_every_pools_message() -> None:
    ok = Verdict("True", reasons.PROMPTS_TRANSFERRED, "pool a: fine")
    idle = Verdict("False", reasons.NO_TRAFFIC, "pool b: idle")
    bad = Verdict("False", reasons.NO_KV_TRANSFERS, "pool c: bad")
    unknown = Verdict("Unknown", reasons.NO_METRICS, "pool d: ?")
    assert judge({"b": idle, "a": ok}) == Verdict("True", reasons.PROMPTS_TRANSFERRED, "pool a: fine; pool b: idle")
    assert judge({"a": ok, "d": unknown}).status == "Unknown"
    assert judge({"a": ok, "c": bad, "d": unknown}).reason == reasons.NO_KV_TRANSFERS
    assert judge({"b": idle}).reason == reasons.NO_TRAFFIC


def _probe(prometheus: FakePrometheus, clock: Clock, url: str | None = URL) -> DisaggregationProbe:
    probe = DisaggregationProbe(url, clock=clock)
    if url:
        probe._clients[url] = prometheus  # type: ignore[assignment]
    return probe


def _disaggregating(cluster: MemoryCluster) -> dict[str, Any] | None:
    return next((c for c in cluster.deployment["status"]["conditions"] if c["type"] == "Disaggregating"), None)


def test_a_serving_pd_deployment_shows_the_verdict_and_an_event_when_it_turns() -> None:
    clock, prometheus = Clock(), FakePrometheus()
    probe = _probe(prometheus, clock)
    cluster = staged(MemoryCluster(pd_body(), NODES))
    prometheus.values = {LOCAL: 20.0, EXTERNAL: 980.0}
    reconcile(Pass(cluster, "ns", "k3", probe=probe))
    condition = _disaggregating(cluster)
    assert condition is not None and (condition["status"], condition["reason"]) == ("True", "PromptsTransferred")
    assert "pool gb300: 98% of the prompt tokens" in condition["message"]
    assert "event Normal PromptsTransferred" in cluster.writes
    asked = len(prometheus.queries)
    assert asked == 2 and all(f"[{WINDOW_SECONDS}s]" in q and 'kimik3_role="decode"' in q for q in prometheus.queries)

    # Within the check interval nothing is asked and, nothing else having changed, nothing written.
    cluster.writes.clear()
    prometheus.values = {LOCAL: 900.0, EXTERNAL: 100.0}
    clock.now += CHECK_SECONDS - 1
    reconcile(Pass(cluster, "ns", "k3", probe=probe))
    assert len(prometheus.queries) == asked and cluster.writes == []

    clock.now += 1
    reconcile(Pass(cluster, "ns", "k3", probe=probe))
    condition = _disaggregating(cluster)
    assert condition is not None and (condition["status"], condition["reason"]) == ("False", "DecodeRecomputesPrompts")
    assert "only 10% of the prompt tokens" in condition["message"]
    assert cluster.writes == ["status", "event Warning DecodeRecomputesPrompts"]

    # The same verdict measured again: no write.
    cluster.writes.clear()
    clock.now += CHECK_SECONDS
    reconcile(Pass(cluster, "ns", "k3", probe=probe))
    assert len(prometheus.queries) == asked + 4 and cluster.writes == []


def test_an_aggregated_deployment_has_no_condition_and_asks_nothing() -> None:
    clock, prometheus = Clock(), FakePrometheus()
    body = base_deployment(name="k3", namespace="ns")
    body["spec"]["pools"][0]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-GB300"}
    cluster = staged(MemoryCluster(body, NODES))
    reconcile(Pass(cluster, "ns", "k3", probe=_probe(prometheus, clock)))
    assert _disaggregating(cluster) is None and prometheus.queries == []


def test_nothing_to_ask_or_no_answer_is_unknown_not_a_verdict() -> None:
    clock = Clock()
    cluster = staged(MemoryCluster(pd_body(), NODES))
    reconcile(Pass(cluster, "ns", "k3", probe=_probe(FakePrometheus(), clock, url=None)))
    condition = _disaggregating(cluster)
    assert condition is not None and (condition["status"], condition["reason"]) == ("Unknown", "NoMetrics")
    assert "--prometheus-url" in condition["message"]

    class Down(FakePrometheus):
        def scalar(self, query: str) -> float | None:
            raise PrometheusError(f"Prometheus at {URL} unreachable: ConnectionError")

    clock.now += CHECK_SECONDS
    reconcile(Pass(cluster, "ns", "k3", probe=_probe(Down(), clock)))
    condition = _disaggregating(cluster)
    assert condition is not None and (condition["status"], condition["reason"]) == ("Unknown", "MetricsUnavailable")


def test_the_condition_goes_when_the_deployment_stops_disaggregating() -> None:
    clock, prometheus = Clock(), FakePrometheus()
    probe = _probe(prometheus, clock)
    cluster = staged(MemoryCluster(pd_body(), NODES))
    reconcile(Pass(cluster, "ns", "k3", probe=probe))
    assert _disaggregating(cluster) is not None
    aggregated = base_deployment(name="k3", namespace="ns")
    aggregated["spec"]["pools"][0]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-GB300"}
    cluster.deployment = {**aggregated, "status": cluster.deployment["status"]}
    cluster.deployment["metadata"].update(uid="uid-1", generation=2)
    reconcile(Pass(cluster, "ns", "k3", probe=probe))
    cluster.finish_staging()
    reconcile(Pass(cluster, "ns", "k3", probe=probe))
    assert _disaggregating(cluster) is None


def test_prometheus_computes_the_window_as_the_probe_reads_it(tmp_path: Path) -> None:
    """The query on two decode engines and a prefill engine, scraped every 15 s: the decode role's
    tokens by source over the window, the prefill's and another deployment's left out."""
    promtool = _promtool()
    if promtool is None:
        pytest.skip("promtool is not built (e2e/cluster/build.sh)")
    owner = Owner(name="k3", namespace="ml", uid="")
    decode = selector(owner, "gb300", "decode")
    labels = {**dict(pair.split("=", 1) for pair in decode.split(","))}

    def series(source: str, role: str = "decode", pod: str = "d0", deployment: str | None = None) -> str:
        values = {**labels, "kimik3_role": f'"{role}"', "pod": f'"{pod}"', "source": f'"{source}"'}
        if deployment:
            values["kimik3_deployment"] = f'"{deployment}"'
        return "vllm:prompt_tokens_by_source_total{" + ",".join(f"{k}={v}" for k, v in values.items()) + "}"

    window = 120
    test = {"interval": "15s", "input_series": [
        # 10 local tokens and 490 external per 15 s on each decode engine
        {"series": series("local_compute", pod="d0"), "values": "0+10x40"},
        {"series": series("external_kv_transfer", pod="d0"), "values": "0+490x40"},
        {"series": series("local_compute", pod="d1"), "values": "0+10x40"},
        {"series": series("external_kv_transfer", pod="d1"), "values": "0+490x40"},
        {"series": series("local_compute", role="prefill", pod="p0"), "values": "0+5000x40"},
        {"series": series("local_compute", pod="x0", deployment="other"), "values": "0+7000x40"},
    ], "promql_expr_test": [
        # 2 engines x 8 intervals of 15 s in 120 s
        {"expr": prompt_tokens_query("local_compute", decode, window), "eval_time": "5m", "exp_samples": [
            {"labels": "{}", "value": 2 * 8 * 10}]},
        {"expr": prompt_tokens_query("external_kv_transfer", decode, window), "eval_time": "5m", "exp_samples": [
            {"labels": "{}", "value": 2 * 8 * 490}]},
    ]}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": [], "tests": [test]}))
    result = subprocess.run([promtool, "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
