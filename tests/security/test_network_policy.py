"""The chart's NetworkPolicy: ingress to the operator pods on the webhook port (from anywhere by
default: the API server's address is no pod's) and the metrics port only, restrictable by
values; nothing for the webhook when the operator does not serve it."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from tests.support.chart import CHART, helm_binary


def network_policy(*values: str) -> dict[str, Any] | None:
    helm = helm_binary()
    if helm is None:
        pytest.skip("helm is not built (e2e/cluster/build.sh helm)")
    args = [a for v in values for a in ("--set", v)]
    out = subprocess.run([helm, "template", "t", str(CHART), "-n", "ns", *args], capture_output=True, text=True,
                         check=True).stdout
    found = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "NetworkPolicy"]
    assert len(found) <= 1
    return found[0] if found else None


def ports(policy: dict[str, Any]) -> list[str]:
    return [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]


def test_by_default_the_webhook_and_metrics_ports_are_open_and_nothing_else() -> None:
    policy = network_policy()
    assert policy is not None and policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "t"
    assert ports(policy) == ["webhook", "metrics"]
    assert all("from" not in rule for rule in policy["spec"]["ingress"]), "from anywhere by default"


def test_the_sources_can_be_narrowed() -> None:
    policy = network_policy("networkPolicy.webhookFrom[0].ipBlock.cidr=10.0.0.0/24",
                            "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring")
    assert policy is not None
    webhook, metrics = policy["spec"]["ingress"]
    assert webhook["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}]


def test_no_webhook_rule_when_the_pods_serve_no_webhook() -> None:
    for values in (("webhook.enabled=false",), ("webhook.url=https://example.test/validate",)):
        policy = network_policy(*values)
        assert policy is not None and ports(policy) == ["metrics"]


def test_it_can_be_left_out() -> None:
    assert network_policy("networkPolicy.enabled=false") is None
