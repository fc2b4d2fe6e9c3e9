"""A P/D rollout holds the old groups of each paired role (LeaderWorkerSet partition) so that the old
revision serves whole until the new one has a pair, then keeps one old pair while another role still
fills, and lets go once every role has its replicas Ready on the new revision."""

from __future__ import annotations

import dataclasses
from typing import Any

from kimik3_operator.reconcile.rollout import partitions, router_weights
from tests.unit.test_pairing import _leader
from tests.unit.test_status import _plan  # a PD plan on GB300 decode + B200 prefill


def _keys() -> tuple[tuple[str, str], tuple[str, str]]:
    plan = _plan()
    (prefill,) = [(p.name, r.role) for p, r in plan.role_plans() if r.role == "prefill"]
    (decode,) = [(p.name, r.role) for p, r in plan.role_plans() if r.role == "decode"]
    return prefill, decode


def test_the_whole_old_revision_is_held_until_the_new_one_has_a_pair() -> None:
    plan = dataclasses.replace(_plan(), compat_hash="new")
    prefill, decode = _keys()
    replicas = {prefill: 1, decode: 2}
    old = [_leader(*prefill, "old"), _leader(*decode, "old"), _leader(*decode, "old")]
    assert partitions(plan, old, replicas) == {prefill: 1, decode: 2}  # only surge groups start
    surge_prefill = [_leader(*prefill, "new")]
    assert partitions(plan, old + surge_prefill, replicas) == {prefill: 1, decode: 2}
    unready = [_leader(*decode, "new", ready=False)]
    assert partitions(plan, old + surge_prefill + unready, replicas) == {prefill: 1, decode: 2}


def test_once_paired_every_role_keeps_its_old_group_0_so_the_old_router_keeps_a_whole_pair() -> None:
    """Released one role at a time, the old router would lose its last decode while it still had a
    prefill (503 "No available workers: 2 prefill, 0 decode", CI of ab6ab71): LeaderWorkerSet
    replaces group 0 the moment group 1 is Ready, before any pass could hold it back."""
    plan = dataclasses.replace(_plan(), compat_hash="new")
    prefill, decode = _keys()
    replicas = {prefill: 1, decode: 2}
    old = [_leader(*prefill, "old"), _leader(*decode, "old"), _leader(*decode, "old")]
    pair = [_leader(*prefill, "new"), _leader(*decode, "new")]
    assert partitions(plan, old + pair, replicas) == {prefill: 1, decode: 1}
    full = [*pair, _leader(*decode, "new")]
    assert partitions(plan, old[:2] + full, replicas) == {}  # every role is full, no old router: the last old groups go
    assert partitions(plan, full, replicas) == {}  # nothing old: nothing held


def test_a_role_without_old_groups_is_never_held_and_no_surge_holds_nothing() -> None:
    plan = dataclasses.replace(_plan(), compat_hash="new")
    prefill, decode = _keys()
    replicas = {prefill: 1, decode: 2}
    mixed = [_leader(*prefill, "new"), _leader(*decode, "old"), _leader(*decode, "old")]
    assert partitions(plan, mixed, replicas) == {decode: 2}  # new decode not ready yet
    # maxSurge 0: a held role could never start a new group
    assert partitions(dataclasses.replace(plan, max_surge=0, max_unavailable=1), mixed, replicas) == {}
    # maxUnavailable 1: LeaderWorkerSet reclaims the surge group while group 0 is held (the new
    # revision could never fill); the user allowed the dip
    assert partitions(dataclasses.replace(plan, max_surge=1, max_unavailable=1), mixed, replicas) == {}


def _router(revision: str, ready: bool = True, *, terminating: bool = False) -> dict[str, Any]:
    return {"metadata": {"labels": {"app.kubernetes.io/component": "router",
                                    "serving.kimik3.dev/router-revision": revision},
                         **({"deletionTimestamp": "2026-12-02T00:00:00Z"} if terminating else {})},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_the_old_routers_go_before_the_last_old_pair_and_the_pair_waits_for_them() -> None:
    """A router whose last pair went answers 503 until its Service drops it: so once the new
    revision is full, the old revision's router is retired first (its Deployment is left out of
    the weights), and the old groups 0 stay until its pods are gone, draining ones included."""
    plan = dataclasses.replace(_plan(), compat_hash="new")
    prefill, decode = _keys()
    replicas = {prefill: 1, decode: 2}
    old = [_leader(*prefill, "old"), _leader(*decode, "old")]
    full = [_leader(*prefill, "new"), _leader(*decode, "new"), _leader(*decode, "new")]
    pairs = {"old": 1, "new": 2}
    # the new revision is full but its router is not Ready yet: the old router stays, so do its pairs
    pods = old + full + [_router("old"), _router("new", ready=False)]
    assert router_weights(plan, pods, replicas, pairs) == pairs
    assert partitions(plan, pods, replicas) == {prefill: 1, decode: 1}
    # its router is Ready: the old router goes; the old pairs stay while its pods drain
    pods = old + full + [_router("old"), _router("new")]
    assert router_weights(plan, pods, replicas, pairs) == {"new": 2}
    assert partitions(plan, pods, replicas) == {prefill: 1, decode: 1}
    draining = old + full + [_router("old", terminating=True), _router("new")]
    assert partitions(plan, draining, replicas) == {prefill: 1, decode: 1}
    # no pod of the old router left: the last old groups go
    assert partitions(plan, old + full + [_router("new")], replicas) == {}


def test_the_old_routers_stay_while_the_new_revision_still_fills() -> None:
    plan = dataclasses.replace(_plan(), compat_hash="new")
    prefill, decode = _keys()
    replicas = {prefill: 1, decode: 2}
    old = [_leader(*prefill, "old"), _leader(*decode, "old"), _leader(*decode, "old")]
    one_pair = [_leader(*prefill, "new"), _leader(*decode, "new")]
    routers = [_router("old"), _router("new")]
    assert router_weights(plan, old + one_pair + routers, replicas, {"old": 1, "new": 1}) == {"old": 1, "new": 1}
    # steady state and a router of the plan's revision only: nothing to retire, nothing held
    full = [*one_pair, _leader(*decode, "new")]
    assert router_weights(plan, full + [_router("new")], replicas, {"new": 2}) == {"new": 2}
    assert partitions(plan, full + [_router("new")], replicas) == {}
