"""The chart's ClusterRole grants exactly what the child-kind registry implies, beside the
operator's few other permissions listed here: a kind added to the registry without its rule (or a
rule left behind for a kind that went) fails here, long before an e2e run shows a 403.

e2e/tests/test_zz_rbac.py measures the same ClusterRole against the audit log of a whole run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kimik3_operator.api import GROUP, PLURAL
from kimik3_operator.contract.kinds import CHILD_KINDS

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kimik3-operator"
CLUSTER_ROLE = CHART / "templates" / "clusterrole.yaml"

Triple = tuple[str, str, str]

NOT_CHILDREN: set[Triple] = {
    # kopf discovers and watches its resources
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    # the deployment itself: read, watched, kopf's progress annotations, status by server-side apply
    *((GROUP, PLURAL, verb) for verb in ("get", "list", "watch", "patch")),
    (GROUP, f"{PLURAL}/status", "patch"),
    # an event when a condition flips; node facts and the pods holding GPUs, for planning
    ("", "events", "create"),
    ("", "nodes", "list"),
    ("", "pods", "list"),
}
"""Everything the operator may do that is not about a child (the leader election Lease is in a
namespaced Role of its own)."""


def triples(rules: list[dict[str, Any]]) -> set[Triple]:
    return {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def template_rules(path: Path) -> list[dict[str, Any]]:
    """The rules of a role template, read as YAML: reliable while they hold no template action,
    which this checks (the metadata's actions are blanked out)."""
    text = path.read_text()
    head, sep, rules = text.partition("\nrules:\n")
    assert sep and "{{" not in rules, f"{path}: the rules are templated; read them from `helm template`"
    head = re.sub(r"\{\{.*?\}\}", "x", head)
    return yaml.safe_load(head + sep + rules)["rules"]  # type: ignore[no-any-return]


def helm_binary() -> str | None:
    cache = Path(os.environ.get("KIMIK3_CACHE", Path.home() / ".cache" / "kimik3-e2e")) / "bin"
    built = sorted(p for p in cache.glob("helm-v*/helm") if p.is_file())
    return shutil.which("helm") or (str(built[-1]) if built else None)


def test_cluster_role_grants_exactly_what_the_registry_needs() -> None:
    needed = {(kind.group, kind.plural, verb) for kind in CHILD_KINDS for verb in kind.verbs()}
    granted = triples(template_rules(CLUSTER_ROLE))
    assert not needed & NOT_CHILDREN
    assert granted - NOT_CHILDREN - needed == set(), "granted, but no child kind needs it"
    assert needed - granted == set(), "a child kind needs it, the chart does not grant it"
    assert NOT_CHILDREN - granted == set()


def test_helm_renders_the_rules_read_from_the_template() -> None:
    helm = helm_binary()
    if helm is None:
        pytest.skip("helm is not built (e2e/cluster/build.sh helm)")
    out = subprocess.run([helm, "template", "t", str(CHART), "-n", "kimik3-system", "--show-only",
                          "templates/clusterrole.yaml"], capture_output=True, text=True, check=True).stdout
    (role,) = [d for d in yaml.safe_load_all(out) if d]
    assert role["kind"] == "ClusterRole"
    assert triples(role["rules"]) == triples(template_rules(CLUSTER_ROLE))
