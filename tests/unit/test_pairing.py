"""Prefill and decode Services move to a new revision together, and only once it can serve; which
leaders a router finds (Running, Ready, not terminating), and how many pairs each revision has."""

from __future__ import annotations

import dataclasses
from typing import Any

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.planner import plan_deployment, pool_facts
from kimik3_operator.reconcile.pairing import leader_endpoints, revision_pairs, serving_hash
from tests.support.cases import load_examples
from tests.support.nodes import all_pools
from tests.unit.test_status import _plan  # a PD plan on GB300 decode + B200 prefill


def _leader(pool: str, role: str, compat: str, ready: bool = True, *, terminating: bool = False,
            worker: str = "0") -> dict[str, Any]:
    return {"metadata": {"labels": {"serving.kimik3.dev/pool": pool, "serving.kimik3.dev/role": role,
                                    "serving.kimik3.dev/compat-hash": compat,
                                    "leaderworkerset.sigs.k8s.io/worker-index": worker},
                         **({"deletionTimestamp": "2026-12-02T00:00:00Z"} if terminating else {})},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_services_keep_the_serving_revision_until_every_paired_role_has_a_ready_new_leader() -> None:
    plan = dataclasses.replace(_plan(), compat_hash="new")
    roles = [(p.name, r.role) for p, r in plan.role_plans()]
    old = [_leader(p, r, "old") for p, r in roles]
    one_new = [_leader(*roles[0], "new")]
    assert serving_hash(plan, old + one_new, {"old"}) == "old"  # the other role has no new leader yet
    unready = [_leader(*roles[1], "new", ready=False)]
    assert serving_hash(plan, old + one_new + unready, {"old"}) == "old"
    terminating = [_leader(*roles[1], "new", terminating=True)]
    assert serving_hash(plan, old + one_new + terminating, {"old"}) == "old"  # a leaving pod is no pair
    both_new = one_new + [_leader(*roles[1], "new")]
    assert serving_hash(plan, old + both_new, {"old"}) == "new"  # both at once


def test_nothing_to_protect_means_the_new_revision() -> None:
    plan = dataclasses.replace(_plan(), compat_hash="new")
    assert serving_hash(plan, [], set()) == "new"
    assert serving_hash(plan, [], {"old"}) == "new"  # the old revision no longer serves anyway


def _with_ip(pod: dict[str, Any], ip: str | None) -> dict[str, Any]:
    return {**pod, "status": {**pod["status"], **({"podIP": ip} if ip else {})}}


def test_the_router_lists_ready_leaders_of_the_paired_revision_only() -> None:
    plan = dataclasses.replace(_plan(), compat_hash="new")
    (prefill, _), (decode, _) = roles = [(p.name, r.role) for p, r in plan.role_plans()]
    pods = [_with_ip(_leader(prefill, "prefill", "old"), "10.0.0.1"),
            _with_ip(_leader(prefill, "prefill", "new"), "10.0.0.2"),
            _with_ip(_leader(decode, "decode", "old"), "10.0.1.1"),
            _with_ip(_leader(decode, "decode", "old", ready=False), "10.0.1.2"),
            _with_ip(_leader(decode, "decode", "old"), None),  # no IP yet
            _with_ip(_leader(decode, "decode", "old"), "not-an-ip")]
    by_role = {(e.pool, e.role): e for e in leader_endpoints(plan, pods, "old")}
    assert sorted(by_role) == sorted(roles)
    assert by_role[(prefill, "prefill")].addresses == ("10.0.0.1",)
    assert by_role[(decode, "decode")].addresses == ("10.0.1.1",)
    assert {e.compat_hash for e in by_role.values()} == {"old"}


def test_aggregated_engines_of_any_revision_are_listed() -> None:
    body = dict(load_examples())["gb300-aggregated-tp8.yaml"]
    spec = KimiK3Deployment.model_validate(body).spec
    plan = plan_deployment(spec, {p.name: pool_facts(p.node_selector, all_pools()) for p in spec.pools})
    pool = plan.pools[0].name
    pods = [_with_ip(_leader(pool, "aggregated", "old"), "10.0.0.1"),
            _with_ip(_leader(pool, "aggregated", plan.compat_hash), "10.0.0.2")]
    (endpoints,) = leader_endpoints(plan, pods, plan.compat_hash)
    assert endpoints.addresses == ("10.0.0.1", "10.0.0.2") and endpoints.compat_hash is None


def test_pairs_per_revision_are_the_fewest_routable_leaders_over_the_paired_roles() -> None:
    plan = dataclasses.replace(_plan(), compat_hash="new")
    (prefill, _), (decode, _) = [(p.name, r.role) for p, r in plan.role_plans()]
    pods = [_leader(prefill, "prefill", "old"), _leader(decode, "decode", "old"), _leader(decode, "decode", "old"),
            _leader(decode, "decode", "old", terminating=True), _leader(decode, "decode", "old", worker="1"),
            _leader(prefill, "prefill", "new"), _leader(prefill, "prefill", "new", ready=False),
            _leader(decode, "decode", "mid")]  # a revision with a decode only has no pair
    assert revision_pairs(plan, pods) == {"old": 1}
    pods.append(_leader(decode, "decode", "new"))
    assert revision_pairs(plan, pods) == {"new": 1, "old": 1}
    assert revision_pairs(plan, []) == {}


def test_every_revisions_leaders_are_found_when_no_revision_is_named() -> None:
    plan = dataclasses.replace(_plan(), compat_hash="new")
    (prefill, _), _ = [(p.name, r.role) for p, r in plan.role_plans()]
    pods = [_with_ip(_leader(prefill, "prefill", "old"), "10.0.0.1"),
            _with_ip(_leader(prefill, "prefill", "new"), "10.0.0.2"),
            _with_ip(_leader(prefill, "prefill", "new", terminating=True), "10.0.0.3")]
    found = {e.compat_hash: e.addresses for e in leader_endpoints(plan, pods) if e.role == "prefill"}
    assert found == {"old": ("10.0.0.1",), "new": ("10.0.0.2",)}
