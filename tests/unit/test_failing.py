"""Failing replicas told apart from starting, rolling and scaling ones (reconcile/failing.py), and
what the status and its events say of them (reconcile/status.py)."""

from __future__ import annotations

from typing import Any

from kimik3_operator.api.reasons import (
    CONTAINER_EXITED,
    CRASH_LOOP,
    ENGINE_NOT_READY,
    IMAGE_PULL,
    INSUFFICIENT_CAPACITY,
    OOM_KILLED,
    UNSCHEDULABLE,
    UPDATING,
)
from kimik3_operator.reconcile.failing import Failure, FailureMemory, failing
from kimik3_operator.reconcile.status import compute_status, transitions
from tests.unit.test_status import OWNER, SERVING, T0, T1, _cond, _plan

KEY = ("ns", "k3")
SLOTS = {"k3-gb300-decode": ("pool gb300 role decode", 2)}


def pod(group: int, *, ready: bool, revision: str = "r1", worker: int = 0, uid: str = "u",
        container: dict[str, Any] | None = None, deleting: bool = False,
        unschedulable: bool = False) -> dict[str, Any]:
    name = f"k3-gb300-decode-{group}" + (f"-{worker}" if worker else "")
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if unschedulable:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable"})
    meta: dict[str, Any] = {"name": name, "uid": uid, "labels": {
        "leaderworkerset.sigs.k8s.io/name": "k3-gb300-decode", "leaderworkerset.sigs.k8s.io/group-index": str(group),
        "leaderworkerset.sigs.k8s.io/worker-index": str(worker),
        "leaderworkerset.sigs.k8s.io/template-revision-hash": revision, "app.kubernetes.io/component": "decode"}}
    if deleting:
        meta["deletionTimestamp"] = T0
    status: dict[str, Any] = {"conditions": conditions, "phase": "Pending" if unschedulable else "Running"}
    if container is not None:
        status["containerStatuses"] = [{"name": "vllm", **container}]
    return {"metadata": meta, "status": status}


CRASHED = {"restartCount": 1, "state": {"running": {}},
           "lastState": {"terminated": {"exitCode": 137, "reason": "Error"}}}
LOOPING = {"restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
           "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}
OOM = {"restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
       "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
IMAGE = {"restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff"}}}


def test_starting_scaling_out_and_rolling_replicas_do_not_fail() -> None:
    memory = FailureMemory()
    assert failing(memory, KEY, [pod(0, ready=False), pod(1, ready=False)], SLOTS) == []  # cold start
    assert failing(memory, KEY, [pod(0, ready=True), pod(1, ready=True)], SLOTS) == []
    rolled = [pod(0, ready=False, revision="r2", uid="n"), pod(1, ready=True)]
    assert failing(memory, KEY, rolled, SLOTS) == []  # the rollout replaced group 0
    grown = {"k3-gb300-decode": ("pool gb300 role decode", 3)}
    assert failing(memory, KEY, [pod(0, ready=True), pod(1, ready=True), pod(2, ready=False)], grown) == []
    assert failing(memory, KEY, [pod(0, ready=True), pod(1, ready=True, deleting=True)], SLOTS) == []


def test_a_crash_names_the_pod_and_stays_while_lws_recreates_the_group_until_it_is_ready() -> None:
    memory = FailureMemory()
    failing(memory, KEY, [pod(0, ready=True), pod(1, ready=True)], SLOTS)
    (crash,) = failing(memory, KEY, [pod(0, ready=True), pod(1, ready=False, container=CRASHED)], SLOTS)
    assert (crash.reason, crash.pod) == (CONTAINER_EXITED, "k3-gb300-decode-1")
    assert "exited 137" in crash.detail and crash.what == "pool gb300 role decode group 1"
    recreating = [pod(0, ready=True), pod(1, ready=False, uid="old", container=CRASHED, deleting=True)]
    assert failing(memory, KEY, recreating, SLOTS)[0].reason == CONTAINER_EXITED
    (starting,) = failing(memory, KEY, [pod(0, ready=True), pod(1, ready=False, uid="new")], SLOTS)
    assert starting.reason == CONTAINER_EXITED and "being recreated" in starting.detail
    assert failing(memory, KEY, [pod(0, ready=True), pod(1, ready=True, uid="new")], SLOTS) == []
    assert failing(memory, KEY, [pod(0, ready=True), pod(1, ready=False, uid="new")], SLOTS)[0].reason == (
        ENGINE_NOT_READY)  # Ready once on this revision, then not: a hang


def test_the_reason_is_the_kubelets() -> None:
    for container, reason in ((LOOPING, CRASH_LOOP), (OOM, OOM_KILLED), (IMAGE, IMAGE_PULL)):
        (f,) = failing(FailureMemory(), KEY, [pod(0, ready=True), pod(1, ready=False, container=container)], SLOTS)
        assert f.reason == reason, container


def test_a_replacement_the_scheduler_cannot_place_fails_and_a_scaled_in_group_is_forgotten() -> None:
    memory = FailureMemory()
    failing(memory, KEY, [pod(0, ready=True), pod(1, ready=True)], SLOTS)
    pending = pod(1, ready=False)
    pending["status"]["phase"] = "Pending"  # its node went; LWS made it again; not scheduled yet
    assert failing(memory, KEY, [pod(0, ready=True), pending], SLOTS) == []
    (f,) = failing(memory, KEY, [pod(0, ready=True), pod(1, ready=False, worker=0, unschedulable=True)], SLOTS)
    assert f.reason == UNSCHEDULABLE
    shrunk = {"k3-gb300-decode": ("pool gb300 role decode", 1)}
    assert failing(memory, KEY, [pod(0, ready=True), pod(1, ready=False, container=LOOPING)], shrunk) == []
    assert ("k3-gb300-decode", 1) not in memory._ready[KEY]


def test_a_router_fails_by_its_own_crash_only() -> None:
    router = {"metadata": {"name": "k3-router-abc", "labels": {"app.kubernetes.io/component": "router",
                                                               "serving.kimik3.dev/router": "k3-router"}},
              "status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    assert failing(FailureMemory(), KEY, [router], SLOTS) == []  # no pair yet: its engines say why
    router["status"]["containerStatuses"] = [{"name": "router", **OOM}]
    (f,) = failing(FailureMemory(), KEY, [router], SLOTS)
    assert (f.reason, f.what, f.pod) == (OOM_KILLED, "router k3-router", "k3-router-abc")


def test_a_failing_replica_is_degraded_with_a_warning_and_recovery_is_news() -> None:
    plan = _plan()
    ready = compute_status(owner=OWNER, generation=3, previous=None, plan=plan, error=None, now=T0, **SERVING)
    failure = Failure(OOM_KILLED, "pool gb300 role decode group 1", "k3-gb300-decode-1", "container vllm OOM")
    lagging = {k: v for k, v in SERVING.items()}
    decode = next(n for n in lagging["workloads"] if "decode" in n)
    lagging["workloads"] = {**lagging["workloads"], decode: {
        **lagging["workloads"][decode], "status": {**lagging["workloads"][decode]["status"], "readyReplicas": 1}}}
    broken = compute_status(owner=OWNER, generation=3, previous=ready, plan=plan, error=None, now=T1,
                            failures=[failure], **lagging)
    assert broken.phase == "Degraded" and broken.reason == OOM_KILLED
    degraded = _cond(broken, "Degraded")
    assert degraded.status == "True" and degraded.reason == OOM_KILLED and "k3-gb300-decode-1" in degraded.message
    assert _cond(broken, "Progressing").status == "False"  # no rollout, no scaling: not Updating
    assert _cond(broken, "Ready").status == "False"
    assert transitions(ready, broken)[0][:2] == ("Warning", OOM_KILLED)
    healed = compute_status(owner=OWNER, generation=3, previous=broken, plan=plan, error=None, now=T1, **SERVING)
    assert _cond(healed, "Degraded").status == "False" and healed.phase == "Ready"
    assert transitions(broken, healed)[0][0] == "Normal"


def test_a_failure_during_a_rollout_is_degraded_and_progressing() -> None:
    plan = _plan()
    rolling = {k: v for k, v in SERVING.items()}
    decode = next(n for n in rolling["workloads"] if "decode" in n)
    live = rolling["workloads"][decode]
    rolling["workloads"] = {**rolling["workloads"], decode: {
        **live, "status": {**live["status"], "readyReplicas": 1, "updatedReplicas": 1}}}
    status = compute_status(owner=OWNER, generation=3, previous=None, plan=plan, error=None, now=T1,
                            failures=[Failure(CRASH_LOOP, "pool gb300 role decode group 0", "p", "loops")], **rolling)
    assert _cond(status, "Progressing").status == "True" and _cond(status, "Progressing").reason == UPDATING
    assert _cond(status, "Degraded").reason == CRASH_LOOP


def test_a_replacement_without_room_reads_as_the_capacity_it_lacks() -> None:
    """A group whose node went and whose new pods find no room: InsufficientCapacity with the numbers,
    not a bare Unschedulable (the capacity rows explain it)."""
    plan = _plan()
    lagging = {k: v for k, v in SERVING.items()}
    decode = next(n for n in lagging["workloads"] if "decode" in n)
    live = lagging["workloads"][decode]
    lagging["workloads"] = {**lagging["workloads"], decode: {**live, "status": {**live["status"], "readyReplicas": 1}}}
    status = compute_status(owner=OWNER, generation=3, previous=None, plan=plan, error=None, now=T1,
                            capacity=["pool gb300-decode role decode: 1 of 2 replicas do not fit now"],
                            failures=[Failure(UNSCHEDULABLE, "pool gb300 role decode group 1", "p", "no room")],
                            **lagging)
    assert _cond(status, "Degraded").reason == INSUFFICIENT_CAPACITY
