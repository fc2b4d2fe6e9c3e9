"""The chart grants exactly what the child-kind registry implies, beside the operator's few other
permissions listed here: a kind added to the registry without its rule (or a rule left behind for a
kind that went) fails here, long before an e2e run shows a 403. The child rules
(files/child-rules.yaml) are part of the ClusterRole when every namespace is watched, and a Role
in each namespace of `watchNamespaces` otherwise: never cluster-wide then.

e2e/tests/test_rbac.py measures the same ClusterRole against the audit log of a whole run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from kimik3_operator.api import GROUP, PLURAL
from kimik3_operator.contract.kinds import CHILD_KINDS
from tests.support.chart import CHART, Triple, rendered, triples

CLUSTER_ROLE = CHART / "templates" / "clusterrole.yaml"
CHILD_RULES = CHART / "files" / "child-rules.yaml"


NOT_CHILDREN: set[Triple] = {
    # kopf discovers and watches its resources
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    # the deployment itself: listed and watched (kopf, the informers), kopf's progress annotations,
    # status by server-side apply
    *((GROUP, PLURAL, verb) for verb in ("list", "watch", "patch")),
    (GROUP, f"{PLURAL}/status", "patch"),
    # an event when a condition flips; node facts and the pods holding GPUs, for planning
    ("", "events", "create"),
    ("", "nodes", "list"),
    ("", "pods", "list"),
    ("", "nodes", "watch"),
    ("", "pods", "watch"),
}
"""Everything the operator may do that is not about a child (the leader election Lease is in a
namespaced Role of its own)."""

NAMESPACED_READS: set[Triple] = {
    # Kueue's Workloads of a queued role's groups (the Admitted condition: reconcile/queueing.py)
    ("kueue.x-k8s.io", "workloads", "list"),
    # a failing group a scale-in keeps is restarted: its leader pod deleted (reconcile/scale_in.py)
    ("", "pods", "delete"),
}
"""What the operator reads or does in a deployment's namespace beside its children: with the child
rules, so a Role per watched namespace grants it too (never cluster-wide then)."""




INCLUDE_CHILD_RULES = ('{{- if not .Values.watchNamespaces }}\n{{ .Files.Get "files/child-rules.yaml" | trim }}\n'
                       '{{- end }}\n')


def template_rules(path: Path) -> list[dict[str, Any]]:
    """The rules of the ClusterRole template, read as YAML: reliable while they hold no template
    action but the child rules' include, which this checks (the metadata's actions are blanked out)."""
    text = path.read_text()
    head, sep, rules = text.partition("\nrules:\n")
    assert sep and rules.endswith(INCLUDE_CHILD_RULES), f"{path}: the child rules are included at the end"
    rules = rules.removesuffix(INCLUDE_CHILD_RULES)
    assert "{{" not in rules, f"{path}: the rules are templated; read them from `helm template`"
    head = re.sub(r"\{\{.*?\}\}", "x", head)
    return yaml.safe_load(head + sep + rules)["rules"]  # type: ignore[no-any-return]


def child_rules() -> list[dict[str, Any]]:
    return yaml.safe_load(CHILD_RULES.read_text())  # type: ignore[no-any-return]


def test_the_chart_grants_exactly_what_the_registry_needs() -> None:
    needed = {(kind.group, kind.plural, verb) for kind in CHILD_KINDS for verb in kind.verbs()}
    assert not needed & NOT_CHILDREN
    assert not needed & NAMESPACED_READS
    assert triples(child_rules()) == needed | NAMESPACED_READS, "the child rules are not what the child kinds need"
    assert triples(template_rules(CLUSTER_ROLE)) == NOT_CHILDREN, "the ClusterRole's own rules"


def _operators(doc: dict[str, Any]) -> bool:
    """The operator's own grants: not the `helm test` pod's, not the roles aggregated into view/edit."""
    meta = doc["metadata"]
    return ("helm.sh/hook" not in (meta.get("annotations") or {})
            and not any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in meta.get("labels") or {}))


def _rbac(docs: list[dict[str, Any]]) -> dict[tuple[str, str | None], dict[str, Any]]:
    """The operator's RBAC objects but the webhook certificate's (tests/unit/test_chart_webhook.py)."""
    rbac = [d for d in docs
            if d["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding") and _operators(d)
            and not d["metadata"]["name"].endswith("-webhook-cert")]
    keyed = {(d["kind"], d["metadata"].get("namespace")): d for d in rbac}
    assert len(keyed) == len(rbac), "one operator grant of each kind per namespace"
    return keyed


def test_helm_renders_the_child_rules_into_the_cluster_role_when_every_namespace_is_watched() -> None:
    rbac = _rbac(rendered())
    assert set(rbac) == {("ClusterRole", None), ("ClusterRoleBinding", None), ("Role", "kimik3-system"),
                         ("RoleBinding", "kimik3-system")}  # the Role: the leader election Lease
    assert triples(rbac["ClusterRole", None]["rules"]) == NOT_CHILDREN | triples(child_rules())


def test_with_watch_namespaces_the_child_rules_are_a_role_in_each_and_not_cluster_wide() -> None:
    rbac = _rbac(rendered("--set", "watchNamespaces={team-a,team-b}"))
    assert triples(rbac["ClusterRole", None]["rules"]) == NOT_CHILDREN
    for namespace in ("team-a", "team-b"):
        role, binding = rbac["Role", namespace], rbac["RoleBinding", namespace]
        assert triples(role["rules"]) == triples(child_rules())
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": role["metadata"]["name"]}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "t-kimik3-operator",
                                        "namespace": "kimik3-system"}]
