"""Prefill and decode Services move to a new revision together, and only once it can serve."""

from __future__ import annotations

import dataclasses
from typing import Any

from kimik3_operator.reconcile.pairing import serving_hash
from tests.unit.test_status import _plan  # a PD plan on GB300 decode + B200 prefill


def _leader(pool: str, role: str, compat: str, ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"labels": {"serving.kimik3.dev/pool": pool, "serving.kimik3.dev/role": role,
                                    "serving.kimik3.dev/compat-hash": compat,
                                    "leaderworkerset.sigs.k8s.io/worker-index": "0"}},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_services_keep_the_serving_revision_until_every_paired_role_has_a_ready_new_leader() -> None:
    plan = dataclasses.replace(_plan(), compat_hash="new")
    roles = [(p.name, r.role) for p, r in plan.role_plans()]
    old = [_leader(p, r, "old") for p, r in roles]
    one_new = [_leader(*roles[0], "new")]
    assert serving_hash(plan, old + one_new, {"old"}) == "old"  # the other role has no new leader yet
    unready = [_leader(*roles[1], "new", ready=False)]
    assert serving_hash(plan, old + one_new + unready, {"old"}) == "old"
    both_new = one_new + [_leader(*roles[1], "new")]
    assert serving_hash(plan, old + both_new, {"old"}) == "new"  # both at once


def test_nothing_to_protect_means_the_new_revision() -> None:
    plan = dataclasses.replace(_plan(), compat_hash="new")
    assert serving_hash(plan, [], set()) == "new"
    assert serving_hash(plan, [], {"old"}) == "new"  # the old revision no longer serves anyway
