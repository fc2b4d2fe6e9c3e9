"""The SLO scaler's trend query, run by Prometheus's own rule tester (promtool) on known series: the
slope of a ramp over the last range and the range before it, and a step in the load, whose slope
shows in one range only (planner/slo_scaler.py takes the smaller)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from kimik3_operator.render.names import Owner
from kimik3_operator.render.promql import selector, trend_query
from tests.unit.test_chart_alerts import _promtool

WINDOW = 60
SPAN = 300


def _series(name: str, matchers: str) -> str:
    labels = dict(pair.split("=", 1) for pair in matchers.split(","))
    return name + "{" + ",".join(f"{k}={v}" for k, v in labels.items()) + "}"


def test_prometheus_measures_a_ramp_in_both_ranges_and_a_step_in_one(tmp_path: Path) -> None:
    promtool = _promtool()
    if promtool is None:
        pytest.skip("promtool is not built (e2e/cluster/build.sh)")
    ramp = selector(Owner(name="k3", namespace="ml", uid=""), "gb300", "decode")
    step = selector(Owner(name="k3", namespace="ml", uid=""), "gb300", "prefill")
    test = {"interval": "15s", "input_series": [
        # A ramp of one request in flight per second (15 per 15 s sample); nothing waiting.
        {"series": _series("vllm:num_requests_running", ramp), "values": "0+15x120"},
        {"series": _series("vllm:num_requests_waiting", ramp), "values": "0x120"},
        # 10 in flight, then 20 from the 60th sample (15 min) on.
        {"series": _series("vllm:num_requests_running", step), "values": "10x59 20x60"},
        {"series": _series("vllm:num_requests_waiting", step), "values": "0x120"},
    ], "promql_expr_test": [
        {"expr": trend_query("RequestsInFlight", ramp, WINDOW, SPAN), "eval_time": "20m",
         "exp_samples": [{"labels": "{}", "value": 1}]},
        {"expr": trend_query("RequestsInFlight", ramp, WINDOW, SPAN, earlier=True), "eval_time": "20m",
         "exp_samples": [{"labels": "{}", "value": 1}]},
        # Three minutes after the step: the last range climbs, the one before is flat.
        {"expr": f"{trend_query('RequestsInFlight', step, WINDOW, SPAN, earlier=True)} == bool 0",
         "eval_time": "18m", "exp_samples": [{"labels": "{}", "value": 1}]},
        {"expr": f"{trend_query('RequestsInFlight', step, WINDOW, SPAN)} > bool 0.01", "eval_time": "18m",
         "exp_samples": [{"labels": "{}", "value": 1}]},
    ]}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": [], "tests": [test]}))
    result = subprocess.run([promtool, "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
