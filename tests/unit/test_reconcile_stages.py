"""Each stage of the reconcile pass alone, over one Pass (reconcile/reconciler.py): what it reads
from the context, what it leaves in it, and what it writes to the cluster."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kimik3_operator.api.reasons import INVALID_SPEC, MISSING_DEPENDENCY, NO_MATCHING_NODES
from kimik3_operator.k8s.cache import Observation
from kimik3_operator.planner import PlanningError
from kimik3_operator.reconcile.pass_memo import PassMemo
from kimik3_operator.reconcile.reconciler import Pass, apply, fail, observe, plan, prune, status
from tests.support.memory_cluster import NODES, MemoryCluster, NoDra, pd_body, staged

NOW = "2026-11-30T00:00:00Z"


def _observed(cluster: MemoryCluster, **kw: Any) -> Pass:
    p = Pass(cluster, "ns", "k3", now=lambda: NOW, **kw)
    assert observe(p)
    return p


def _planned(cluster: MemoryCluster, **kw: Any) -> Pass:
    p = _observed(cluster, **kw)
    plan(p)
    return p


def test_observe_reads_the_deployment_its_children_and_its_running_pods() -> None:
    cluster = staged(MemoryCluster(pd_body(), NODES))
    cluster.deployment["status"] = {"phase": "Progressing", "observedGeneration": 1}
    cluster.writes.clear()
    p = _observed(cluster)
    assert (p.owner.name, p.owner.namespace, p.owner.uid, p.generation) == ("k3", "ns", "uid-1", 1)
    assert p.previous is not None and p.previous.phase == "Progressing"
    assert set(p.live) == set(cluster.objects)
    assert [o["metadata"]["name"] for o in p.seen.pods] == [o["metadata"]["name"] for o in cluster.pods]
    assert p.own_pods == []  # the finished staging pod holds nothing
    assert cluster.writes == []


@pytest.mark.parametrize("edit", ["gone", "deleting"])
def test_observe_stops_for_a_deployment_that_is_gone_or_going(edit: str) -> None:
    class Gone(MemoryCluster):
        def observe(self, namespace: str, name: str, label: str, body: dict[str, Any] | None = None) -> Observation:
            return Observation(deployment=None)

    cluster = (Gone if edit == "gone" else MemoryCluster)(pd_body(), NODES)
    if edit == "deleting":
        cluster.deployment["metadata"]["deletionTimestamp"] = NOW
    assert not observe(Pass(cluster, "ns", "k3"))


def test_plan_validates_plans_and_remembers() -> None:
    cluster = MemoryCluster(pd_body(), NODES)
    memo = PassMemo()
    first = _planned(cluster, memo=memo)
    assert first.plan is not None and {p.name for p in first.plan.pools} == {"gb300", "b200"}
    assert set(first.facts) == {"gb300", "b200"}
    again = _planned(cluster, memo=memo)
    assert again.plan is first.plan and again.cr is first.cr  # same generation, same nodes: not re-planned
    assert cluster.writes == []


def test_plan_refuses_an_invalid_spec_with_its_reason() -> None:
    body = pd_body()
    body["spec"]["pools"][0]["decode"]["parallelism"] = {"tensor": 5}
    p = _observed(MemoryCluster(body, NODES))
    with pytest.raises(PlanningError) as info:
        plan(p)
    assert info.value.reason == INVALID_SPEC and p.plan is None


def test_plan_leaves_a_stranded_pool_as_it_is() -> None:
    cluster = MemoryCluster(pd_body(), [n for n in NODES if "GB300" not in str(n["metadata"].get("labels"))])
    p = _observed(cluster)
    p.own_pods = [{"metadata": {"labels": {"serving.kimik3.dev/pool": "gb300"}}, "spec": {"nodeName": "gone-1"}}]
    with pytest.raises(PlanningError) as info:
        plan(p)
    assert info.value.reason == NO_MATCHING_NODES and "gone-1" in info.value.message


def test_apply_stages_the_weights_before_anything_serves() -> None:
    cluster = MemoryCluster(pd_body(), NODES)
    p = _planned(cluster)
    apply(p)
    assert p.weights is not None and not p.weights.all_staged
    assert not [k for k in p.outcome.applied if k.startswith("LeaderWorkerSet/")]
    assert any(k.startswith("Job/") for k in p.outcome.applied)
    assert {k for k in p.wanted if k[0] == "Job"} == {k for k in cluster.objects if k[0] == "Job"}


def test_apply_serves_once_staged_and_wants_what_it_applied() -> None:
    cluster = staged(MemoryCluster(pd_body(), NODES))
    p = _planned(cluster)
    apply(p)
    assert p.weights is not None and p.weights.all_staged
    lws = {k for k in cluster.objects if k[0] == "LeaderWorkerSet"}
    assert lws == {("LeaderWorkerSet", "k3-gb300-decode"), ("LeaderWorkerSet", "k3-b200-prefill")}
    assert lws <= p.wanted and set(p.current) <= p.wanted | set(p.live)
    assert p.plan is not None and p.plan.engine.commits  # the staged commit entered the plan


def test_apply_turns_a_missing_api_into_a_planning_problem() -> None:
    p = _planned(staged(NoDra(pd_body(), NODES)))
    with pytest.raises(PlanningError) as info:
        apply(p)
    assert info.value.reason == MISSING_DEPENDENCY and info.value.depends_on_nodes


def test_prune_deletes_only_owned_unwanted_prunable_children() -> None:
    cluster = staged(MemoryCluster(pd_body(), NODES))
    p = _planned(cluster)
    apply(p)
    stray = copy.deepcopy(cluster.objects[("LeaderWorkerSet", "k3-gb300-decode")])
    stray["metadata"]["name"] = "k3-old-decode"
    foreign = copy.deepcopy(stray)
    foreign["metadata"].update(name="someone-elses", ownerReferences=[])
    for o in (stray, foreign):
        cluster.objects[("LeaderWorkerSet", o["metadata"]["name"])] = o
        p.live[("LeaderWorkerSet", o["metadata"]["name"])] = o
    prune(p)
    assert p.outcome.deleted == ["LeaderWorkerSet/k3-old-decode"]
    assert ("LeaderWorkerSet", "someone-elses") in cluster.objects
    assert ("LeaderWorkerSet", "k3-gb300-decode") in cluster.objects


def test_status_writes_only_what_changed() -> None:
    cluster = staged(MemoryCluster(pd_body(), NODES))
    p = _planned(cluster)
    apply(p)
    status(p)
    assert p.outcome.status_written and p.outcome.phase == cluster.deployment["status"]["phase"]
    roles = [r["role"] for pool in cluster.deployment["status"]["pools"] for r in pool["roles"]]
    assert sorted(roles) == ["decode", "prefill"]
    again = _planned(cluster)
    apply(again)
    status(again)
    assert not again.outcome.status_written


def test_fail_writes_the_reason_and_touches_nothing_else() -> None:
    cluster = MemoryCluster(pd_body(), NODES)
    p = _observed(cluster)
    fail(p, PlanningError(INVALID_SPEC, "pools[0]: no"))
    ready = next(c for c in cluster.deployment["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", INVALID_SPEC, "pools[0]: no")
    assert p.outcome.error is not None and cluster.objects == {}
    assert [w.split()[0] for w in cluster.writes if not w.startswith("event")] == ["status"]
