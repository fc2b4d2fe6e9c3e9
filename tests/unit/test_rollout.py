"""A P/D rollout holds the old groups of each paired role (LeaderWorkerSet partition) so that the old
revision serves whole until the new one has a pair, then keeps one old pair while another role still
fills, and lets go once every role has its replicas Ready on the new revision."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from kimik3_operator.api.reasons import CRASH_LOOP
from kimik3_operator.reconcile.failing import Failure
from kimik3_operator.reconcile.pairing import revision_pairs
from kimik3_operator.reconcile.rollout import OldGroups, old_groups, partitions, router_weights
from kimik3_operator.render import render_serving
from kimik3_operator.render.names import Owner
from tests.unit.test_pairing import _leader
from tests.unit.test_status import _plan, load_examples  # _plan: a PD plan on GB300 decode + B200 prefill

OWNER = Owner(name="k3", namespace="ns", uid="u")


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
    router = [_router("old")]
    assert partitions(plan, old + pair + router, replicas) == {prefill: 1, decode: 1}
    full = [*pair, _leader(*decode, "new")]
    assert partitions(plan, old[:2] + full + router, replicas) == {prefill: 1, decode: 1}  # until the old router goes
    assert partitions(plan, old[:2] + full, replicas) == {}  # every role is full, no old router: the last old groups go
    # a released group on its way out holds nothing back, even while a new pod turns unready
    going = [_leader(*prefill, "old", terminating=True), _leader(*decode, "old", terminating=True)]
    assert partitions(plan, going + pair, replicas) == {}
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
                         **({"deletionTimestamp": "2999-01-01T00:00:00Z"} if terminating else {})},
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


def _body_with_extra_decode_pool(replicas: int) -> dict[str, Any]:
    body = copy.deepcopy(dict(load_examples())["pd-gb300-decode-b200-prefill.yaml"])
    body["spec"]["pools"].append({"name": "gb300-spare", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB300"},
                                  "decode": {"replicas": replicas, "parallelism": {"tensor": 8}}})
    return body


SPARE = ("gb300-spare", "decode")


def test_a_paired_role_at_zero_replicas_does_not_freeze_the_rollout_in_step_1() -> None:
    """A paired role with `replicas: 0` (allowed: Role.replicas ge=0) never has a Ready leader of any
    revision, so `all(_new_ready(...).values())` is never true: every other role stays held at
    partition = replicas forever and the new revision never grows past its surge groups."""
    plan = dataclasses.replace(_plan(_body_with_extra_decode_pool(0)), compat_hash="new")
    prefill, decode = _keys()
    replicas = {prefill: 1, decode: 2, SPARE: 0}
    old = [_leader(*prefill, "old"), _leader(*decode, "old"), _leader(*decode, "old")]
    pair = [_leader(*prefill, "new"), _leader(*decode, "new")]  # the surge groups are Ready
    assert partitions(plan, old + pair + [_router("old")], replicas) == {prefill: 1, decode: 1}


@pytest.mark.parametrize("spare", [0, 1], ids=["an-empty-pool", "a-pool-with-a-replica"])
def test_a_decode_pool_added_with_the_hash_change_does_not_retire_the_old_router_at_once(spare: int) -> None:
    """The old revision has no leader in the added pool (empty, or not started yet), but its router,
    whose selectors name no pool, still pairs its prefill and decodes: pairs count per role kind, so
    the old router stays until the new revision is full (counted per pool and role, revision_pairs
    gave 0 and the old router was pruned at the first pass, nothing Ready to serve instead)."""
    plan = dataclasses.replace(_plan(_body_with_extra_decode_pool(spare)), compat_hash="new")
    prefill, decode = _keys()
    replicas = {prefill: 1, decode: 2, SPARE: spare}
    pods = [_leader(*prefill, "old"), _leader(*decode, "old"), _leader(*decode, "old"), _router("old")]
    assert "old" in router_weights(plan, pods, replicas, revision_pairs(plan, pods))


def test_a_released_old_group_is_not_held_again_when_a_new_pod_turns_unready() -> None:
    """Step 4 released the old groups 0 (partition 0); LeaderWorkerSet deletes them. While they
    terminate (the engine's grace is shutdownTimeout + 40 s) one new decode turns unready: `old` still
    sees the terminating leaders, `_full` is false, so partition goes back to 1 and the StatefulSet
    recreates ordinal 0 from its currentRevision: an old group reloads 1.6 TB for nothing (no old
    router is left to route it) and is replaced again later."""
    plan = dataclasses.replace(_plan(), compat_hash="new")
    prefill, decode = _keys()
    replicas = {prefill: 1, decode: 2}
    going = [_leader(*prefill, "old", terminating=True), _leader(*decode, "old", terminating=True)]
    new = [_leader(*prefill, "new"), _leader(*decode, "new"), _leader(*decode, "new", ready=False)]
    assert partitions(plan, going + new + [_router("new")], replicas) == {}


def test_an_old_router_pod_stuck_terminating_past_its_grace_does_not_hold_the_old_pair_forever() -> None:
    """A router pod on a node that stopped answering keeps its deletionTimestamp (= deletion time +
    grace) for ever: old_routers() stays true, partition stays 1, a pass runs every 2 s for ever and
    the rollout never ends. Past its deletionTimestamp a pod's container was killed (or its node is
    gone): it carries no request any more."""
    plan = dataclasses.replace(_plan(), compat_hash="new")
    prefill, decode = _keys()
    replicas = {prefill: 1, decode: 2}
    old = [_leader(*prefill, "old"), _leader(*decode, "old")]
    full = [_leader(*prefill, "new"), _leader(*decode, "new"), _leader(*decode, "new")]
    stuck = _router("old", terminating=True)
    stuck["metadata"]["deletionTimestamp"] = "2000-01-01T00:00:00Z"
    assert partitions(plan, old + full + [stuck, _router("new")], replicas) == {}


def test_an_engine_image_change_changes_the_compatibility_hash() -> None:
    """vLLM's NIXL compatibility hash includes vllm.__version__ (docs/vllm-facts.md §0 item 5, and
    compatibility-scoped-rollouts.md lists "the vLLM version" first); the operator's hash does not
    include the serving image, so a spec.engine.image (or pool image, or the operator's pinned default)
    change rolls each role on its own with no hold and one router pairs old and new versions."""
    body = copy.deepcopy(dict(load_examples())["pd-gb300-decode-b200-prefill.yaml"])
    base = _plan(body)
    body["spec"]["engine"]["image"] = "ghcr.io/kimik3-operator/vllm-serving:0.34.0-cuda"
    assert _plan(body).compat_hash != base.compat_hash


# ---- broken groups: replaced, never waited on --------------------------------------------------

def _group(key: tuple[str, str], compat: str, index: int, *, ready: bool = True) -> dict[str, Any]:
    """A group's leader as LeaderWorkerSet labels it: the template revision follows the compatibility
    hash here (a paired role's template changes with it)."""
    pod = _leader(*key, compat, ready)
    pod["metadata"]["labels"].update({"leaderworkerset.sigs.k8s.io/name": f"k3-{key[0]}-{key[1]}",
                                      "leaderworkerset.sigs.k8s.io/group-index": str(index),
                                      "leaderworkerset.sigs.k8s.io/template-revision-hash": f"rev-{compat}"})
    return pod


def _broken(key: tuple[str, str], index: int, compat: str = "old") -> Failure:
    return Failure(CRASH_LOOP, f"pool {key[0]} role {key[1]} group {index}", f"k3-{key[0]}-{key[1]}-{index}",
                   "container vllm CrashLoopBackOff", (f"k3-{key[0]}-{key[1]}", index), f"rev-{compat}")


def test_old_groups_are_those_below_the_replicas_on_another_template_than_the_highest_group() -> None:
    prefill, decode = _keys()
    pods = [_group(decode, "old", 0, ready=False), _group(decode, "old", 1), _group(decode, "new", 2),
            _group(prefill, "old", 0), _group(prefill, "new", 1)]
    old = old_groups(pods, [_broken(decode, 0)], {prefill: 1, decode: 2})
    assert old == {decode: OldGroups(healthy=frozenset({1}), broken=frozenset({0})),
                   prefill: OldGroups(healthy=frozenset({0}), broken=frozenset())}
    assert old[decode].allowance() == 1  # LeaderWorkerSet would count group 0 before replacing group 1
    # a failing group of the new template is no old group: a crash-looping revision gets nothing to eat
    new_fails = [_group(decode, "old", 0), _group(decode, "new", 1, ready=False), _group(decode, "new", 2)]
    assert old_groups(new_fails, [_broken(decode, 1, "new")], {decode: 2}) == {
        decode: OldGroups(healthy=frozenset({0}), broken=frozenset())}
    # no rollout (one template): nothing is old, whatever fails; nothing changes on the LeaderWorkerSet
    steady = [_group(decode, "old", 0, ready=False), _group(decode, "old", 1)]
    assert old_groups(steady, [_broken(decode, 0)], {decode: 2}) == {}
    # a broken group being recreated (no leader now) still counts, by the revision it failed on
    recreated = [_group(decode, "old", 1), _group(decode, "new", 2)]
    assert old_groups(recreated, [_broken(decode, 0)], {decode: 2})[decode].broken == {0}


@pytest.mark.parametrize(("broken", "step1", "step2", "allowance"), [
    ((), 3, 1, 0),            # nothing broken: as before
    ((0,), 3, 2, 1),          # group 0 broken: hold the lowest healthy one (1); LWS may count 0 as spent
    ((2,), 2, 1, 0),          # the highest old group broken: released at once, LWS replaces it first
    ((0, 1), 3, 3, 2),
    ((0, 1, 2), 0, 0, 0),     # nothing healthy to hold
])
def test_the_hold_keeps_a_healthy_old_group_never_a_broken_one(broken: tuple[int, ...], step1: int, step2: int,
                                                               allowance: int) -> None:
    old = OldGroups(healthy=frozenset({0, 1, 2} - set(broken)), broken=frozenset(broken))
    assert (old.hold_all(3), old.hold_one(), old.allowance()) == (step1, step2, allowance)


def test_a_rollout_with_a_broken_old_decode_holds_the_healthy_one_and_ends() -> None:
    """One decode of two crash-loops (group 0) when the rollout starts. Held at partition 1 as before,
    it is the old revision's "whole pair" though it serves nothing, and the new revision is never
    "full" while it is held: the rollout waited on it for ever."""
    plan = dataclasses.replace(_plan(), compat_hash="new")
    prefill, decode = _keys()
    replicas = {prefill: 1, decode: 2}
    old = [_group(prefill, "old", 0), _group(decode, "old", 0, ready=False), _group(decode, "old", 1)]
    failures = [_broken(decode, 0)]
    surge = [_group(prefill, "new", 1), _group(decode, "new", 2)]
    pods = old + surge + [_router("old")]
    groups = old_groups(pods, failures, replicas)
    assert partitions(plan, pods, replicas, groups) == {prefill: 1, decode: 2}  # decode group 1 keeps the old pair
    # full: the new revision has its 2 decodes less the broken one; its router is Ready: the old goes
    pods += [_router("new")]
    assert router_weights(plan, pods, replicas, {"old": 1, "new": 1}, groups) == {"new": 1}
    # once its pods are gone the old groups are released, the broken one with them
    gone = old + surge + [_router("new")]
    assert partitions(plan, gone, replicas, old_groups(gone, failures, replicas)) == {}
    # and the old router does not come back when the broken group, replaced, starts on the new
    # template (no longer discounted) while the healthy old groups still serve a pair
    replaced = [_group(prefill, "old", 0), _group(decode, "new", 0, ready=False), _group(decode, "old", 1),
                *surge, _router("new")]
    assert router_weights(plan, replaced, replicas, {"old": 1, "new": 1}, old_groups(replaced, [], replicas)) == {
        "new": 1}


def test_a_role_whose_old_groups_all_fail_is_not_held() -> None:
    plan = dataclasses.replace(_plan(), compat_hash="new")
    prefill, decode = _keys()
    replicas = {prefill: 1, decode: 1}
    pods = [_group(prefill, "old", 0), _group(decode, "old", 0, ready=False), _group(decode, "new", 1, ready=False)]
    groups = old_groups(pods, [_broken(decode, 0)], replicas)
    assert partitions(plan, pods, replicas, groups) == {prefill: 1}  # the decode's only old group is replaced


def test_the_allowance_raises_max_unavailable_on_the_rolling_role_only() -> None:
    plan = _plan()
    prefill, decode = _keys()
    children = render_serving(OWNER, plan, allowances={decode: 1})
    role_label = "serving.kimik3.dev/role"
    lws = {o["metadata"]["labels"][role_label]: o["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]
           for o in children if o["kind"] == "LeaderWorkerSet"}
    assert lws["decode"]["maxUnavailable"] == plan.max_unavailable + 1
    assert lws["prefill"]["maxUnavailable"] == plan.max_unavailable
