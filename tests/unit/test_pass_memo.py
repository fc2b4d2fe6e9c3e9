"""What passes remember between them (reconcile/pass_memo.py) is reused while what it was worked
out from stands, and worked out again as soon as any of it moves: the spec (its generation), the
nodes, the pods holding GPUs elsewhere."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kimik3_operator.reconcile import reconciler
from kimik3_operator.reconcile.pass_memo import PassMemo
from kimik3_operator.reconcile.reconciler import Outcome, Pass, reconcile
from tests.support.memory_cluster import NODES, MemoryCluster, pd_body, staged


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the planner's runs."""
    calls: list[int] = []
    plan = reconciler.plan_deployment

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return plan(*args, **kwargs)

    monkeypatch.setattr(reconciler, "plan_deployment", counting)
    return calls


def _status(cluster: MemoryCluster) -> dict[str, Any]:
    return copy.deepcopy(cluster.deployment["status"])


def test_a_plan_is_reused_until_the_spec_or_the_nodes_change(planned: list[int]) -> None:
    memo = PassMemo()
    cluster = staged(MemoryCluster(pd_body(), NODES))
    reconcile(Pass(cluster, "ns", "k3", memo=memo))
    reconcile(Pass(cluster, "ns", "k3", memo=memo))
    assert len(planned) == 2  # _staged's own pass has no memo; then one plan for two passes

    # A spec change is a new generation (the API server's rule): planned again, children follow.
    cluster.deployment["spec"]["pools"][0]["decode"]["replicas"] = 3
    cluster.deployment["metadata"]["generation"] = 2
    out = reconcile(Pass(cluster, "ns", "k3", memo=memo))
    assert len(planned) == 3 and "LeaderWorkerSet/k3-gb300-decode" in out.applied
    assert cluster.objects[("LeaderWorkerSet", "k3-gb300-decode")]["spec"]["replicas"] == 3

    # A node gone changes the node store: planned again on what is left.
    cluster.nodes = [n for n in cluster.nodes if n["metadata"]["name"] != NODES[-1]["metadata"]["name"]]
    reconcile(Pass(cluster, "ns", "k3", memo=memo))
    assert len(planned) == 4


def test_a_memo_changes_no_outcome(planned: list[int]) -> None:
    """The same passes with and without a memo write the same objects and the same status."""
    runs = []
    for shared in (None, PassMemo()):

        def one_pass(cluster: MemoryCluster, shared: PassMemo | None = shared) -> Outcome:
            """Without a shared memo, each pass starts with an empty one."""
            return reconcile(Pass(cluster, "ns", "k3", memo=shared or PassMemo(), now=lambda: "2026-11-30T00:00:00Z"))

        cluster = staged(MemoryCluster(pd_body(), NODES), now=lambda: "2026-11-30T00:00:00Z")  # no second may tick
        outcomes = [one_pass(cluster) for _ in range(2)]
        cluster.active.append({"metadata": {"name": "other", "namespace": "x", "labels": {}},
                               "spec": {"nodeName": NODES[0]["metadata"]["name"], "containers": [
                                   {"resources": {"requests": {"nvidia.com/gpu": "4"}}}]},
                               "status": {"phase": "Running"}})
        outcomes.append(one_pass(cluster))
        runs.append(([o.applied for o in outcomes], _status(cluster), cluster.objects))
    assert runs[0] == runs[1]


def test_gpus_held_by_other_pods_are_seen_as_soon_as_they_change() -> None:
    """Usage is remembered by the active pods' store revision: a new pod elsewhere shows at once."""
    memo = PassMemo()
    cluster = staged(MemoryCluster(pd_body(), NODES))
    reconcile(Pass(cluster, "ns", "k3", memo=memo))
    assert "do not fit" not in str(cluster.deployment["status"]["conditions"])
    for node in NODES:
        if "GB300" in str(node["metadata"].get("labels")):
            cluster.active.append({"metadata": {"name": f"hog-{node['metadata']['name']}", "namespace": "x",
                                                "labels": {}},
                                   "spec": {"nodeName": node["metadata"]["name"], "containers": [
                                       {"resources": {"requests": {"nvidia.com/gpu": "4"}}}]},
                                   "status": {"phase": "Running"}})
    reconcile(Pass(cluster, "ns", "k3", memo=memo))
    assert "do not fit" in str(cluster.deployment["status"]["conditions"])
