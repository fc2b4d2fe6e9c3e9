"""Every router policy is one row (api/router_policies.py): each renders for both kinds of router,
its `tokenizes` column alone decides whether the engines serve token ids, and its `kv_events`
column whether they publish KV events (`--kv-events-config`). The router's own
parser reads each row's spelling in tests/contract/test_router_contract.py."""

from __future__ import annotations

import dataclasses
from typing import Any, get_args

import pytest

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.api.router_policies import BY_NAME, ROUTER_POLICIES, RouterPolicyRow
from kimik3_operator.api.spec import RouterPolicy
from kimik3_operator.planner import plan_deployment, pool_facts
from kimik3_operator.render import Owner
from kimik3_operator.render.router import router_args, router_targets
from tests.support.cases import base_deployment, load_examples
from tests.support.nodes import b200_nodes, gb300_rack


def _plan(body: dict[str, Any]):
    spec = KimiK3Deployment.model_validate(body).spec
    nodes = [*gb300_rack(), *b200_nodes()]
    return plan_deployment(spec, {p.name: pool_facts(p.node_selector, nodes) for p in spec.pools})


def _bodies(row: RouterPolicyRow) -> list[dict[str, Any]]:
    examples = dict(load_examples())
    pd = examples["pd-gb300-decode-b200-prefill.yaml"]
    # A policy that may not pick decodes leaves them to one that neither tokenizes nor follows events.
    pd["spec"]["router"] = {"prefillPolicy": row.name, "decodePolicy": row.name if row.decode else "RoundRobin"}
    policy = row.name
    aggregated = base_deployment()
    aggregated["spec"]["router"] = {"policy": policy}
    return [pd, aggregated]


def problems(row: RouterPolicyRow) -> list[str]:
    out = []
    if row.name not in get_args(RouterPolicy):
        return [f"the API does not offer {row.name}"]
    for body in _bodies(row):
        plan = _plan(body)
        owner = Owner(name=body["metadata"]["name"], namespace="default", uid="u")
        for targets in router_targets(owner, plan):
            args = router_args(owner, targets)
            for kind, _ in targets.plan.policies:
                flag = {"prefill": "--prefill-policy", "decode": "--decode-policy"}.get(kind, "--policy")
                if (kind != "decode" or row.decode) and args[args.index(flag) + 1] != row.flag:
                    out.append(f"{flag} renders {args[args.index(flag) + 1]}, not {row.flag}")
        roles = {(pool.name, role.role): role.role for pool in plan.pools for role in pool.roles}
        tokenized = {key for key in roles if plan.router_tokenizes(*key)}
        chosen = {key for key, role in roles.items() if role != "decode" or row.decode}
        if tokenized != (chosen if row.tokenizes else set()):
            out.append(f"the engines serving token ids are {sorted(tokenized)}, tokenizes says {row.tokenizes}")
        publishing = {key for key in roles if plan.publishes_kv_events(*key)}
        if publishing != (chosen if row.kv_events else set()):
            out.append(f"the engines publishing KV events are {sorted(publishing)}, kv_events says {row.kv_events}")
    return out


@pytest.mark.parametrize("row", ROUTER_POLICIES, ids=lambda r: r.name)
def test_each_policy_renders_and_decides_the_token_route(row: RouterPolicyRow) -> None:
    assert problems(row) == []


def test_the_api_offers_exactly_the_rows() -> None:
    assert get_args(RouterPolicy) == tuple(BY_NAME)


def test_a_half_added_policy_is_caught() -> None:
    assert problems(RouterPolicyRow("LeastLatency", "least_latency", False, "")) == [
        "the API does not offer LeastLatency"]
    lying = dataclasses.replace(BY_NAME["RoundRobin"], tokenizes=True)
    assert any("tokenizes says True" in p for p in problems(lying))
    silent = dataclasses.replace(BY_NAME["RoundRobin"], kv_events=True)
    assert any("kv_events says True" in p for p in problems(silent))
