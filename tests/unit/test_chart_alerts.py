"""The chart's PrometheusRule, run by Prometheus's own rule tester (promtool test rules): the
NoLeader alert also fires when no replica is scraped at all, and Failed and WeightsFailed
deployments alert from the operator's per-deployment series."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import rendered


def _promtool() -> str | None:
    cache = Path(os.environ.get("KIMIK3_CACHE", Path.home() / ".cache" / "kimik3-e2e")) / "bin"
    built = sorted(p for p in cache.glob("prometheus-v*/promtool") if p.is_file())
    return str(built[-1]) if built else None


def _alert(name: str, at: str, labels: dict[str, str], severity: str) -> dict[str, object]:
    """An alert expected to fire; its annotations are filled in from the rule (`_with_annotations`)."""
    return {"eval_time": at, "alertname": name, "exp_alerts": [{"exp_labels": {**labels, "severity": severity}}]}


def _substituted(text: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)


def _with_annotations(tests: list[dict[str, Any]], rules: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """`tests` with each expected alert's annotations: its rule's, with the labels substituted."""
    for test in tests:
        for case in test["alert_rule_test"]:
            for alert in case["exp_alerts"]:
                alert["exp_annotations"] = {key: _substituted(text, alert["exp_labels"])
                                            for key, text in rules[case["alertname"]].get("annotations", {}).items()}
    return tests


TESTS: list[dict[str, Any]] = [
    {   # no replica scraped at all: absent() fires the alert
        "interval": "1m",
        "input_series": [{"series": 'up{job="other"}', "values": "1x20"}],
        "alert_rule_test": [_alert("KimiK3OperatorNoLeader", "10m", {}, "critical")],
    },
    {   # two replicas, both standing by
        "interval": "1m",
        "input_series": [{"series": 'kimik3_operator_leader{pod="a"}', "values": "0x20"},
                         {"series": 'kimik3_operator_leader{pod="b"}', "values": "0x20"}],
        "alert_rule_test": [_alert("KimiK3OperatorNoLeader", "10m", {}, "critical")],
    },
    {   # one leads: quiet
        "interval": "1m",
        "input_series": [{"series": 'kimik3_operator_leader{pod="a"}', "values": "1x20"},
                         {"series": 'kimik3_operator_leader{pod="b"}', "values": "0x20"}],
        "alert_rule_test": [{"eval_time": "10m", "alertname": "KimiK3OperatorNoLeader", "exp_alerts": []}],
    },
    {   # a deployment Failed because its weights failed; another one Ready
        "interval": "1m",
        "input_series": [
            {"series": 'kimik3_deployment_phase{namespace="ml",'
                       'kimik3_deployment="k3",phase="Failed"}', "values": "1x20"},
            {"series": 'kimik3_deployment_phase{namespace="ml",'
                       'kimik3_deployment="ok",phase="Failed"}', "values": "0x20"},
            {"series": 'kimik3_deployment_condition{namespace="ml",'
                       'kimik3_deployment="k3",type="Degraded",status="True",'
                       'reason="WeightsFailed"}', "values": "1x20"},
            {"series": 'kimik3_deployment_condition{namespace="ml",'
                       'kimik3_deployment="ok",type="Degraded",status="False",'
                       'reason="AsExpected"}', "values": "1x20"},
            {"series": 'kimik3_operator_leader{pod="a"}', "values": "1x20"},
        ],
        "alert_rule_test": [
            _alert("KimiK3DeploymentFailed", "10m", {"namespace": "ml", "kimik3_deployment": "k3"}, "critical"),
            _alert("KimiK3WeightsFailed", "10m", {"namespace": "ml", "kimik3_deployment": "k3"}, "warning"),
            {"eval_time": "10m", "alertname": "KimiK3OperatorNoLeader", "exp_alerts": []},
        ],
    },
    {   # a replica that served crash-loops: the alert within minutes, not ReplicasNotReady's 30
        "interval": "1m",
        "input_series": [
            {"series": 'kimik3_deployment_condition{namespace="ml",'
                       'kimik3_deployment="k3",type="Degraded",status="True",'
                       'reason="CrashLoopBackOff"}', "values": "0 0 1x20"},
            {"series": 'kimik3_deployment_condition{namespace="ml",kimik3_deployment="w",type="Degraded",'
                       'status="True",reason="WeightsFailed"}', "values": "1x20"},
            {"series": 'kimik3_operator_leader{pod="a"}', "values": "1x20"},
        ],
        "alert_rule_test": [
            {"eval_time": "3m", "alertname": "KimiK3ReplicaFailing", "exp_alerts": []},
            _alert("KimiK3ReplicaFailing", "5m",
                   {"namespace": "ml", "kimik3_deployment": "k3", "reason": "CrashLoopBackOff"}, "warning"),
        ],
    },
    {   # one deployment's decode recomputes its prompts, one is idle, one disaggregates
        "interval": "1m",
        "input_series": [
            {"series": 'kimik3_deployment_condition{namespace="ml",kimik3_deployment="bad",type="Disaggregating",'
                       'status="False",reason="DecodeRecomputesPrompts"}', "values": "1x20"},
            {"series": 'kimik3_deployment_condition{namespace="ml",kimik3_deployment="idle",type="Disaggregating",'
                       'status="False",reason="NoTraffic"}', "values": "1x20"},
            {"series": 'kimik3_deployment_condition{namespace="ml",kimik3_deployment="ok",type="Disaggregating",'
                       'status="True",reason="PromptsTransferred"}', "values": "1x20"},
            {"series": 'kimik3_operator_leader{pod="a"}', "values": "1x20"},
        ],
        "alert_rule_test": [
            _alert("KimiK3NotDisaggregating", "15m",
                   {"namespace": "ml", "kimik3_deployment": "bad", "reason": "DecodeRecomputesPrompts"}, "warning"),
            {"eval_time": "5m", "alertname": "KimiK3NotDisaggregating", "exp_alerts": []},  # not for 10m yet
        ],
    },
]


DASHBOARDS = Path(__file__).resolve().parents[2] / "charts" / "kimik3-operator" / "dashboards"


def test_alerts_fire_on_what_they_say(tmp_path: Path) -> None:
    promtool = _promtool()
    if promtool is None:
        pytest.skip("promtool is not built (e2e/cluster/build.sh)")
    (rule,) = [d for d in rendered("--set", "metrics.prometheusRule.enabled=true") if d["kind"] == "PrometheusRule"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    tests = _with_annotations(copy.deepcopy(TESTS), rules)
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "tests": tests}))
    check = subprocess.run([promtool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    result = subprocess.run([promtool, "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_failing_replica_alert_keys_on_every_failing_reason() -> None:
    from kimik3_operator.api.reasons import FAILING

    (rule,) = [r for d in rendered("--set", "metrics.prometheusRule.enabled=true") if d["kind"] == "PrometheusRule"
               for g in d["spec"]["groups"] for r in g["rules"] if r.get("alert") == "KimiK3ReplicaFailing"]
    listed = re.search(r'reason=~"([^"]+)"', rule["expr"])
    assert listed is not None and set(listed.group(1).split("|")) == FAILING


def test_every_dashboard_query_is_promql_prometheus_accepts(tmp_path: Path) -> None:
    """Each panel's query (the variables at their "all" value) as a recording rule under promtool's
    own parser: a typo in a panel shows here, not as an empty graph."""
    promtool = _promtool()
    if promtool is None:
        pytest.skip("promtool is not built (e2e/cluster/build.sh)")
    exprs = [expr for _, expr in dashboard_queries()]
    rules = [{"record": f"dashboard:panel{i}", "expr": e} for i, e in enumerate(exprs)]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    check = subprocess.run([promtool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert any("prompt_tokens_by_source" in e for e in exprs) and len(exprs) >= 40


def dashboard_queries() -> list[tuple[str, str]]:
    """(dashboard, query) of every panel, each variable at Grafana's "All" (allValue .*)."""
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        names = [v["name"] for v in board["templating"]["list"]]
        for panel in board["panels"]:
            for target in panel.get("targets") or []:
                expr = target["expr"]
                for name in names:
                    expr = expr.replace(f"${name}", ".*")
                out.append((path.name, expr))
    return out


def test_the_serving_dashboard_reads_every_issue_41_signal_and_pads_nothing() -> None:
    """What a serving dashboard must show (issue 41 item 3), each from a series something exports;
    no query hides a missing series behind `or vector(0)`; every serving query follows the
    namespace and deployment variables."""
    board = json.loads((DASHBOARDS / "serving.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets") or []]
    for needed in ("vllm:generation_tokens_total", "haproxy_frontend_http_responses_total",
                   "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                   "vllm:request_queue_time_seconds", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total",
                   "vllm:spec_decode_num_accepted_tokens_per_pos_total", "vllm:nixl_xfer_time_seconds",
                   "vllm:nixl_num_kv_expired_reqs_total", "vllm:nixl_num_notifications_after_expiry_total",
                   "kimik3_router_retries_total", "kimik3_router_engine_ejections_total",
                   "kimik3_deployment_weights_staged_ratio", "kimik3_deployment_cold_start_predicted_seconds"):
        assert any(needed in e for e in exprs), needed
    assert not [e for _, e in dashboard_queries() if "vector(" in e]
    for expr in exprs:
        for selector in re.findall(r"\{([^}]*)\}", expr):
            assert 'namespace=~"$namespace"' in selector and 'kimik3_deployment=~"$deployment"' in selector, expr
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "namespace", "deployment"}
