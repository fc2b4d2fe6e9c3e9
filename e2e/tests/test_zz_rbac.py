"""Least privilege, measured: the ClusterRole the chart installs grants exactly the (group,
resource, verb) triples the audit log shows the operator using while the e2e suite ran as the
chart's ServiceAccount. Runs after the other e2e tests (file order), before the uninstall."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import CHART_NAMESPACE, SERVICE_ACCOUNT
from .kube import get_json

pytestmark = pytest.mark.e2e

USER = f"system:serviceaccount:{CHART_NAMESPACE}:{SERVICE_ACCOUNT}"


def used_triples(audit_log: Path, since: str) -> set[tuple[str, str, str]]:
    used = set()
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        if (event.get("user") or {}).get("username") != USER or not ref.get("resource"):
            continue
        if event["requestReceivedTimestamp"][:19] < since:
            continue
        if event.get("responseStatus", {}).get("code") == 403:
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        used.add((ref.get("apiGroup", ""), resource, event["verb"]))
        if event["verb"] == "patch" and event.get("responseStatus", {}).get("code") == 201:
            # server-side apply of a new object is audited as patch but authorized as create
            used.add((ref.get("apiGroup", ""), resource, "create"))
    return used


def granted_triples() -> set[tuple[str, str, str]]:
    role = get_json("clusterrole", SERVICE_ACCOUNT)
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def test_rbac_equals_what_the_operator_used(operator: Path, cluster: dict[str, str]) -> None:
    audit_log = Path(cluster["KUBECONFIG"]).parent / "audit.log"
    used = used_triples(audit_log, os.environ["KIMIK3_E2E_STARTED"])
    granted = granted_triples()
    assert used - granted == set(), "the operator needed more than the chart grants"
    assert granted - used == set(), "the chart grants more than the operator used in the whole suite"
