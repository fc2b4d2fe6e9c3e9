"""A scale-in restarts a failing group it keeps (reconcile/scale_in.py): once per fall of the count,
only for failures a new start may cure, never a group being removed or one already going."""

from __future__ import annotations

from kimik3_operator.api.reasons import CRASH_LOOP, ENGINE_NOT_READY, IMAGE_PULL, UNSCHEDULABLE
from kimik3_operator.reconcile.failing import Failure, FailureMemory, failing
from kimik3_operator.reconcile.scale_in import restarts
from tests.unit.test_failing import KEY, LOOPING, pod

LWS = "k3-gb300-decode"


def _slots(replicas: int) -> dict[str, tuple[str, int]]:
    return {LWS: ("pool gb300 role decode", replicas)}


def _failure(group: int, reason: str) -> Failure:
    return Failure(reason, f"group {group}", f"{LWS}-{group}", "x", (LWS, group), "r1")


def test_a_fall_of_the_count_restarts_the_kept_groups_a_new_start_may_cure() -> None:
    memory = FailureMemory()
    assert memory.fallen(KEY, {LWS: 3}) == {}  # the first pass of a process knows no count before
    fallen = memory.fallen(KEY, {LWS: 2})
    assert fallen == {LWS: 2}
    pods = [pod(g, ready=g != 1, uid=f"u{g}") for g in range(3)]
    (restart,) = restarts(fallen, [_failure(1, ENGINE_NOT_READY)], pods)
    assert restart.slot == (LWS, 1) and restart.pod["metadata"]["uid"] == "u1"
    assert restart.note() == "restarted for the scale-in to 2 replicas"
    # the same count at the next pass: no fall, no second restart of the recreated group
    assert memory.fallen(KEY, {LWS: 2}) == {}
    assert restarts({}, [_failure(1, ENGINE_NOT_READY)], pods) == []


def test_a_group_being_removed_or_one_a_new_pod_fails_the_same_way_is_left() -> None:
    pods = [pod(g, ready=False, uid=f"u{g}") for g in range(4)]
    failures = [_failure(0, IMAGE_PULL), _failure(1, UNSCHEDULABLE), _failure(3, CRASH_LOOP)]
    assert restarts({LWS: 2}, failures, pods) == []  # group 3 goes with the scale-in
    going = [pod(0, ready=False, uid="u0", deleting=True)]
    assert restarts({LWS: 2}, [_failure(0, CRASH_LOOP)], going) == []  # its leader is already going
    worker_only = [pod(0, ready=False, worker=1)]
    assert restarts({LWS: 2}, [_failure(0, CRASH_LOOP)], worker_only) == []  # no leader to delete
    assert restarts({"other": 1}, [_failure(0, CRASH_LOOP)], pods) == []  # another role fell


def test_a_restarted_group_reads_as_failing_until_ready_and_what_was_said_lasts_that_long() -> None:
    memory = FailureMemory()
    slots = _slots(2)
    ready = [pod(0, ready=True, uid="u0"), pod(1, ready=True, uid="u1")]
    assert failing(memory, KEY, ready, slots) == []
    hung = [ready[0], pod(1, ready=False, uid="u1")]
    (failure,) = failing(memory, KEY, hung, slots)
    assert failure.reason == ENGINE_NOT_READY
    memory.note_restart(KEY, failure, "restarted for the scale-in to 2 replicas")
    # the old leader going, then no leader, then the new one starting: failing all along, not flapping
    for pods in ([ready[0], pod(1, ready=False, uid="u1", deleting=True)], [ready[0]],
                 [ready[0], pod(1, ready=False, uid="u9")]):
        (still,) = failing(memory, KEY, pods, slots)
        assert still.group == (LWS, 1) and "being recreated" in still.detail
        assert memory.restart_notes(KEY, [still.group]) == {(LWS, 1): "restarted for the scale-in to 2 replicas"}
    assert failing(memory, KEY, [ready[0], pod(1, ready=True, uid="u9")], slots) == []
    assert memory.restart_notes(KEY, []) == {}  # recovered: forgotten
    assert memory.restart_notes(KEY, [(LWS, 1)]) == {}  # a later failure is a new story
    memory.note_restart(KEY, _failure(0, CRASH_LOOP), "n")
    memory.fallen(KEY, {LWS: 1})
    memory.forget_all_but([])
    assert memory.restart_notes(KEY, [(LWS, 0)]) == {} and memory.fallen(KEY, {LWS: 0}) == {}


def test_a_crash_looping_group_below_the_new_count_is_found_and_restarted() -> None:
    memory = FailureMemory()
    pods = [pod(0, ready=True, uid="u0"), pod(1, ready=False, uid="u1", container=LOOPING),
            pod(2, ready=True, uid="u2")]
    memory.fallen(KEY, {LWS: 3})
    failures = failing(memory, KEY, pods, _slots(2))
    (restart,) = restarts(memory.fallen(KEY, {LWS: 2}), failures, pods)
    assert restart.slot == (LWS, 1)
