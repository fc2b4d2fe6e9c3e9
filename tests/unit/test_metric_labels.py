"""One spelling of a deployment across every series (issue 41): `namespace` + `kimik3_deployment`
(+ `kimik3_pool`, `kimik3_role`) on the operator's own series, on what the chart's PodMonitors scrape
and in every alert and dashboard query, so one query joins them as they are."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import REGISTRY

import kimik3_operator.metrics  # noqa: F401 - registers the operator's families
from tests.support.chart import rendered

CHART = Path(__file__).resolve().parents[2] / "charts" / "kimik3-operator"
OTHER_SPELLINGS = {"name", "deployment", "pool", "kimik3_name", "deployment_name"}
"""Labels that named a deployment or a pool before (the operator's `name`, the scaler's `deployment`)."""


def test_the_operator_names_a_deployment_pool_and_role_one_way() -> None:
    families = [c for c in REGISTRY._collector_to_names if hasattr(c, "_labelnames")]
    named = {c._name: c._labelnames for c in families if c._name.startswith("kimik3_")}
    assert named, "no kimik3_ family registered"
    for family, labels in named.items():
        assert not OTHER_SPELLINGS & set(labels), (family, labels)
        if "kimik3_deployment" in labels:
            assert "namespace" in labels, family
        if "role" in labels or "kimik3_role" in labels:
            assert "kimik3_role" in labels and "kimik3_deployment" in labels, (family, labels)


def _grouped_and_matched_labels(expr: str) -> set[str]:
    grouped = {label.strip() for group in re.findall(r"\b(?:by|on|ignoring)\s*\(([^)]*)\)", expr)
               for label in group.split(",") if label.strip()}
    matched = {m for selector in re.findall(r"\{([^}]*)\}", expr)
               for m in re.findall(r"(\w+)\s*[!=]~?", selector)}
    return grouped | matched


def test_alerts_and_dashboards_use_that_spelling() -> None:
    (rule,) = [d for d in rendered("--set", "metrics.prometheusRule.enabled=true") if d["kind"] == "PrometheusRule"]
    rules = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    exprs = [r["expr"] for r in rules]
    exprs += [t["expr"] for path in sorted((CHART / "dashboards").glob("*.json"))
              for p in json.loads(path.read_text())["panels"] for t in p.get("targets") or []]
    assert len(exprs) > 40
    for expr in exprs:
        assert not OTHER_SPELLINGS & _grouped_and_matched_labels(expr), expr
    annotations = " ".join(str(v) for r in rules for v in (r.get("annotations") or {}).values())
    used = set(re.findall(r"\$labels\.(\w+)", annotations))
    assert "kimik3_deployment" in used and not OTHER_SPELLINGS & used, used


def test_the_pod_monitors_relabel_pods_to_that_spelling() -> None:
    monitors = [d for d in rendered("--set", "metrics.podMonitor.enabled=true") if d["kind"] == "PodMonitor"]
    assert len(monitors) == 2
    for monitor in monitors:
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            targets = {r["targetLabel"] for r in endpoint["relabelings"]}
            assert "kimik3_deployment" in targets and not OTHER_SPELLINGS & targets, (monitor["metadata"]["name"],
                                                                                      targets)
