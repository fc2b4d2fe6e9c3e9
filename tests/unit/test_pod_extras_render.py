"""spec.pods: every pod template of every child (the engines' leaders and workers, the routers, the
staging Jobs) carries the labels, annotations and pull secrets it asks for, under the operator's own
labels; the child-kind registry names every pod template there is; reserved keys are refused."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.contract.kinds import BY_KIND
from kimik3_operator.contract.names import reserved_pod_key
from kimik3_operator.planner import plan_deployment, pool_facts
from kimik3_operator.render import Owner, render_children
from tests.support.cases import load_examples
from tests.support.nodes import all_pools

OWNER = Owner(name="k3", namespace="inference", uid="u")
EXAMPLES = dict(load_examples())
PODS = {"labels": {"team": "ml", "cost-center": "4711"},
        "annotations": {"sidecar.istio.io/inject": "false", "example.com/owner": "ml-platform"},
        "imagePullSecrets": [{"name": "registry-a"}, {"name": "registry-b"}]}


def _children(example: str, pods: dict[str, Any] | None) -> list[dict[str, Any]]:
    body = copy.deepcopy(EXAMPLES[example])
    if pods is not None:
        body["spec"]["pods"] = pods
    spec = KimiK3Deployment.model_validate(body).spec
    plan = plan_deployment(spec, {p.name: pool_facts(p.node_selector, all_pools()) for p in spec.pools})
    return render_children(OWNER, plan, routers={plan.compat_hash: 1})


def _pod_templates(obj: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every dict that is a pod template (a `spec` with `containers`), wherever it is."""
    if isinstance(obj, dict):
        if isinstance(obj.get("spec"), dict) and "containers" in obj["spec"]:
            yield path, obj
        for key, value in obj.items():
            yield from _pod_templates(value, (*path, key))


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_every_pod_template_carries_spec_pods_under_the_operators_labels(example: str) -> None:
    plain = _children(example, None)
    dressed = _children(example, PODS)
    assert [c["metadata"]["name"] for c in plain] == [c["metadata"]["name"] for c in dressed]
    seen = 0
    for before, child in zip(plain, dressed, strict=True):
        found = dict(_pod_templates(child))
        # the registry names every pod template a child has: a new kind with pods is one row there
        assert set(found) <= set(BY_KIND[child["kind"]].pod_templates), (child["kind"], set(found))
        olds = dict(_pod_templates(before))
        for path, template in found.items():
            seen += 1
            labels, old = template["metadata"]["labels"], olds[path]["metadata"]["labels"]
            assert labels == {**PODS["labels"], **old}, (child["kind"], path)
            assert template["metadata"]["annotations"] == {**PODS["annotations"],
                                                            **(olds[path]["metadata"].get("annotations") or {})}
            assert template["spec"]["imagePullSecrets"] == [{"name": "registry-a"}, {"name": "registry-b"}]
            # nothing else of the template moved
            rest = copy.deepcopy(template)
            rest["metadata"] = olds[path]["metadata"]
            del rest["spec"]["imagePullSecrets"]
            assert rest == olds[path]
    assert seen >= 3  # at least an engine, a router and a staging Job


def test_the_operators_pod_labels_are_all_reserved() -> None:
    """A label the renderer puts on a pod is one spec.pods may not set (else the user's would be
    overwritten in silence, or move a pod out of a selector)."""
    for child in _children("pd-gb300-decode-b200-prefill.yaml", None):
        for _, template in _pod_templates(child):
            assert all(reserved_pod_key(k) for k in template["metadata"]["labels"]), template["metadata"]["labels"]


@pytest.mark.parametrize(("field", "key"), [("labels", "app.kubernetes.io/managed-by"),
                                            ("labels", "serving.kimik3.dev/role"),
                                            ("annotations", "leaderworkerset.sigs.k8s.io/size"),
                                            ("labels", "kueue.x-k8s.io/queue-name")])
def test_a_reserved_key_is_refused_naming_it(field: str, key: str) -> None:
    body = copy.deepcopy(EXAMPLES["pd-gb300-decode-b200-prefill.yaml"])
    body["spec"]["pods"] = {field: {"team": "ml", key: "x"}}
    with pytest.raises(ValidationError, match=f"pods.{field} sets an? [a-z]+ the operator.*: {key}"):
        KimiK3Deployment.model_validate(body)
