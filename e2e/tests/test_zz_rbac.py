"""Least privilege, measured: the ClusterRole the chart installs grants exactly the (group,
resource, verb) triples the audit log shows the operator using while the e2e suite ran as the
chart's ServiceAccount, and so does the Role in the release namespace (the leader election
Lease). Runs after the other e2e tests (file order), before the uninstall."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import CHART_NAMESPACE, SERVICE_ACCOUNT
from .kube import get_json

pytestmark = pytest.mark.e2e

USER = f"system:serviceaccount:{CHART_NAMESPACE}:{SERVICE_ACCOUNT}"


def used_triples(audit_log: Path, since: str, lease_role: bool = False) -> set[tuple[str, str, str]]:
    """What the operator did on the Leases of the release namespace (the Role's part) when
    `lease_role`, else everything else (the ClusterRole's part)."""
    used = set()
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        if (event.get("user") or {}).get("username") != USER or not ref.get("resource"):
            continue
        if (ref["resource"] == "leases" and ref.get("namespace") == CHART_NAMESPACE) != lease_role:
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


def granted_triples(*role: str) -> set[tuple[str, str, str]]:
    rules = get_json(*role)["rules"]
    return {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def test_rbac_equals_what_the_operator_used(operator: Path, cluster: dict[str, str]) -> None:
    audit_log = Path(cluster["KUBECONFIG"]).parent / "audit.log"
    used = used_triples(audit_log, os.environ["KIMIK3_E2E_STARTED"])
    granted = granted_triples("clusterrole", SERVICE_ACCOUNT)
    assert used - granted == set(), "the operator needed more than the chart grants"
    assert granted - used == set(), "the chart grants more than the operator used in the whole suite"


def test_leader_election_role_equals_what_the_operator_used(operator: Path, cluster: dict[str, str]) -> None:
    audit_log = Path(cluster["KUBECONFIG"]).parent / "audit.log"
    used = used_triples(audit_log, os.environ["KIMIK3_E2E_STARTED"], lease_role=True)
    granted = granted_triples("role", SERVICE_ACCOUNT, "-n", CHART_NAMESPACE)
    assert used == granted == {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}
    # reads and renewals are limited to the one Lease (create cannot be: RBAC sees no name)
    role = get_json("role", SERVICE_ACCOUNT, "-n", CHART_NAMESPACE)
    assert [r.get("resourceNames") for r in role["rules"]] == [None, [SERVICE_ACCOUNT]]
