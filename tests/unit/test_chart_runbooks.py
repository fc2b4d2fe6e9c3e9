"""Every alert of the chart links a runbook that exists: its runbook_url is the values' base plus
the fragment of a heading in docs/runbooks.md (GitHub's anchors: lower case, spaces to dashes,
punctuation dropped), and the base is where that file is published."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.chart import rendered

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = ROOT / "docs" / "runbooks.md"
BASE = "https://github.com/kimik3-operator/kimik3-operator/blob/main/docs/runbooks.md"


def _anchors(markdown: str) -> set[str]:
    """The fragments GitHub gives the file's headings."""
    out = set()
    for line in markdown.splitlines():
        if m := re.match(r"#{1,6} (.+)", line):
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def _rules(*values: str) -> list[dict[str, object]]:
    (rule,) = [d for d in rendered("--set", "metrics.prometheusRule.enabled=true", *values)
               if d["kind"] == "PrometheusRule"]
    return [r for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r]


def test_every_alert_links_a_heading_of_the_runbooks() -> None:
    anchors = _anchors(RUNBOOKS.read_text())
    alerts = _rules()
    assert alerts
    for alert in alerts:
        url = alert["annotations"]["runbook_url"]  # type: ignore[index]
        base, _, fragment = url.partition("#")
        assert base == BASE, alert["alert"]
        assert fragment in anchors, f"{alert['alert']}: no heading #{fragment} in docs/runbooks.md"


def test_the_runbooks_base_is_a_value_and_the_anchor_rule_is_githubs() -> None:
    alerts = _rules("--set", "metrics.prometheusRule.runbookBaseUrl=https://wiki.example/k3")
    assert all(a["annotations"]["runbook_url"].startswith("https://wiki.example/k3#")  # type: ignore[index]
               for a in alerts)
    assert _anchors("## Which replica leads\n### KimiK3OperatorNoLeader (critical)\n") == {
        "which-replica-leads", "kimik3operatornoleader-critical"}


def test_monitoring_objects_take_the_labels_and_namespace_a_stock_prometheus_selects() -> None:
    """kube-prometheus-stack's Prometheus selects ServiceMonitors, PodMonitors and PrometheusRules by
    `release: <its release>`: without labels from the values nothing is collected."""
    kinds = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
    values = [arg for key in ("serviceMonitor", "podMonitor", "prometheusRule")
              for arg in ("--set", f"metrics.{key}.enabled=true", "--set", f"metrics.{key}.labels.release=kps",
                          "--set", f"metrics.{key}.namespace=monitoring")]
    docs = [d for d in rendered(*values) if d["kind"] in kinds]
    # the PodMonitors: the serving pods' and the routers'
    assert sorted(d["kind"] for d in docs) == sorted([*kinds, "PodMonitor"])
    for doc in docs:
        assert doc["metadata"]["labels"]["release"] == "kps", doc["kind"]
        assert doc["metadata"]["namespace"] == "monitoring", doc["kind"]
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["kimik3-system"]}  # where its Service is
