"""Least privilege, measured: the ClusterRole the chart installs grants exactly the (group,
resource, verb) triples the audit log shows the operator using while the e2e suite ran as the
chart's ServiceAccount, and so do the Role in the release namespace (the leader election
Lease) and the webhook certificate's Role and ClusterRole (its Secret, the caBundle). Runs after
every other e2e test (`after_suite`), before the uninstall."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from e2e.harness.kube import get_json

from .conftest import CHART_NAMESPACE, SERVICE_ACCOUNT

pytestmark = [pytest.mark.e2e, pytest.mark.after_suite(1)]

USER = f"system:serviceaccount:{CHART_NAMESPACE}:{SERVICE_ACCOUNT}"


def part(ref: dict[str, str]) -> str:
    """Which of the chart's roles grants a request on `ref`."""
    if ref.get("namespace") == CHART_NAMESPACE and ref["resource"] in ("leases", "secrets"):
        return "lease" if ref["resource"] == "leases" else "webhook-cert"
    return "webhook-cert" if ref["resource"] == "validatingwebhookconfigurations" else "cluster"


def audit_logs(cluster: dict[str, str]) -> list[Path]:
    """This cluster's audit log and those of the other e2e lanes' clusters (scripts/test.sh runs the
    suite's files in two lanes, each on a cluster of its own, then these tests on the first, with
    KIMIK3_E2E_MORE_AUDIT_LOGS naming the others): what the operator used is what it used anywhere
    in the suite."""
    more = [Path(p) for p in os.environ.get("KIMIK3_E2E_MORE_AUDIT_LOGS", "").split(os.pathsep) if p]
    return [Path(cluster["KUBECONFIG"]).parent / "audit.log", *more]


def used_triples(logs: list[Path], since: str, lease_role: bool = False,
                 webhook_cert: bool = False) -> set[tuple[str, str, str]]:
    """What the operator did on the Leases of the release namespace (the Role's part) when
    `lease_role`, on the webhook certificate's Secret and configuration when `webhook_cert`, else
    everything else (the ClusterRole's part)."""
    wanted = "lease" if lease_role else "webhook-cert" if webhook_cert else "cluster"
    used = set()
    for line in (line for log in logs for line in log.read_text().splitlines()):
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        if (event.get("user") or {}).get("username") != USER or not ref.get("resource"):
            continue
        if part(ref) != wanted:
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
    used = used_triples(audit_logs(cluster), os.environ["KIMIK3_E2E_STARTED"])
    granted = granted_triples("clusterrole", SERVICE_ACCOUNT)
    assert used - granted == set(), "the operator needed more than the chart grants"
    assert granted - used == set(), "the chart grants more than the operator used in the whole suite"


def test_leader_election_role_equals_what_the_operator_used(operator: Path, cluster: dict[str, str]) -> None:
    used = used_triples(audit_logs(cluster), os.environ["KIMIK3_E2E_STARTED"], lease_role=True)
    granted = granted_triples("role", SERVICE_ACCOUNT, "-n", CHART_NAMESPACE)
    assert used == granted == {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}
    # reads and renewals are limited to the one Lease (create cannot be: RBAC sees no name)
    role = get_json("role", SERVICE_ACCOUNT, "-n", CHART_NAMESPACE)
    assert [r.get("resourceNames") for r in role["rules"]] == [None, [SERVICE_ACCOUNT]]


def test_webhook_certificate_roles_equal_what_the_operator_used(operator: Path, cluster: dict[str, str]) -> None:
    used = used_triples(audit_logs(cluster), os.environ["KIMIK3_E2E_STARTED"], webhook_cert=True)
    name = f"{SERVICE_ACCOUNT}-webhook-cert"
    granted = granted_triples("role", name, "-n", CHART_NAMESPACE) | granted_triples("clusterrole", name)
    # create (the first round), get (every round), update (the renewal test_webhook.py provokes);
    # get and patch of the caBundle
    assert used == granted == {("", "secrets", "create"), ("", "secrets", "get"), ("", "secrets", "update"),
                               ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "get"),
                               ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "patch")}
    # reads and writes are limited to the one Secret and the one configuration (create cannot be)
    role = get_json("role", name, "-n", CHART_NAMESPACE)
    assert [r.get("resourceNames") for r in role["rules"]] == [None, [name]]
    assert [r["resourceNames"] for r in get_json("clusterrole", name)["rules"]] == [[SERVICE_ACCOUNT]]
