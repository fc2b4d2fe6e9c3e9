"""The child-kind registry says what the renderer does: every object rendered is of a registered
kind with its apiVersion, each stage renders only its own kinds, and what is never pruned is what
every plan renders under the same name."""

from __future__ import annotations

from typing import Any

import pytest

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.contract.kinds import BY_KIND, CHILD_KINDS, SERVING, WEIGHTS
from kimik3_operator.planner import Plan, plan_deployment, pool_facts, with_staged
from kimik3_operator.render import Owner, render_serving, render_weights
from tests.support.cases import load_examples
from tests.support.nodes import all_pools

OWNER = Owner(name="k3", namespace="inference", uid="0000-1111")
NODES = all_pools()


def _plan(body: dict[str, Any]) -> Plan:
    spec = KimiK3Deployment.model_validate(body).spec
    plan = plan_deployment(spec, {p.name: pool_facts(p.node_selector, NODES) for p in spec.pools})
    return with_staged(plan, {s.name: "5eed" * 10 for s in plan.weights.sources})


PLANS = {name: _plan(body) for name, body in load_examples()}


def test_registry_names_each_kind_once() -> None:
    assert len(BY_KIND) == len(CHILD_KINDS)
    assert len({(k.group, k.plural) for k in CHILD_KINDS}) == len(CHILD_KINDS)


@pytest.mark.parametrize("name", sorted(PLANS))
def test_each_stage_renders_registered_kinds_of_its_own_in_apply_order(name: str) -> None:
    for stage, children in ((WEIGHTS, render_weights(OWNER, PLANS[name])),
                            (SERVING, render_serving(OWNER, PLANS[name]))):
        kinds = [BY_KIND[o["kind"]] for o in children]
        assert [(o["apiVersion"], k.stage) for o, k in zip(children, kinds, strict=True)] == [
            (k.api_version, stage) for k in kinds]
        assert kinds == sorted(kinds, key=CHILD_KINDS.index)


def test_what_is_never_pruned_every_plan_renders_under_the_same_name() -> None:
    def kept(plan: Plan) -> set[tuple[str, str]]:
        return {(o["kind"], o["metadata"]["name"]) for o in render_weights(OWNER, plan) + render_serving(OWNER, plan)
                if not BY_KIND[o["kind"]].pruned}

    first, *others = [kept(plan) for plan in PLANS.values()]
    assert {kind for kind, _ in first} == {k.kind for k in CHILD_KINDS if not k.pruned}
    assert all(other == first for other in others)
