"""Capacity: replicas that cannot be placed on the nodes present now are counted and explained."""

from __future__ import annotations

from typing import Any

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.planner import plan_deployment, pool_facts
from kimik3_operator.planner.capacity import gpus_used, shortfalls
from tests.support.cases import base_deployment
from tests.support.nodes import b200_nodes, gb300_rack


def _setup(pools: list[dict[str, Any]], nodes: list[dict[str, Any]]):
    body = base_deployment()
    body["spec"]["pools"] = pools
    spec = KimiK3Deployment.model_validate(body).spec
    facts = {p.name: pool_facts(p.node_selector, nodes) for p in spec.pools}
    return plan_deployment(spec, facts), facts


def _pod(node: str, gpus: int, *, ns: str = "other", label: str | None = None,
         phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "labels": {"serving.kimik3.dev/deployment": label} if label else {}},
            "spec": {"nodeName": node, "containers": [{"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": phase}}


GB300 = {"nvidia.com/gpu.product": "NVIDIA-GB300"}
B200 = {"nvidia.com/gpu.product": "NVIDIA-B200"}


def test_enough_room_means_no_shortfall() -> None:
    plan, facts = _setup([{"name": "g", "nodeSelector": GB300, "aggregated": {"replicas": 9}}], gb300_rack())
    assert shortfalls(plan, facts, {}) == []


def test_groups_must_fit_inside_one_clique() -> None:
    # 3 trays in each of two racks: three TP8 replicas need 2 trays in one rack each; only 2 fit.
    nodes = gb300_rack("a", 3) + gb300_rack("b", 3)
    plan, facts = _setup([{"name": "g", "nodeSelector": GB300, "aggregated": {"replicas": 3}}], nodes)
    (message,) = shortfalls(plan, facts, {})
    assert "pool g role aggregated: 1 of 3 replicas do not fit now" in message
    assert "2 node(s) with 4 free GPUs in one NVLink clique" in message
    assert "cluster.a: 1" in message and "cluster.b: 1" in message


def test_gpus_held_by_others_count_and_our_own_pods_do_not() -> None:
    nodes = b200_nodes(4)
    plan, facts = _setup([{"name": "b", "nodeSelector": B200, "aggregated": {"replicas": 2}}], nodes)
    pods = [_pod("b200-0", 8), _pod("b200-1", 8, label="k3-test", ns="default"),
            _pod("b200-2", 8, phase="Succeeded")]
    used = gpus_used(pods, lambda p: p["metadata"]["namespace"] == "default"
                     and p["metadata"]["labels"].get("serving.kimik3.dev/deployment") == "k3-test")
    assert used == {"b200-0": 8}
    (message,) = shortfalls(plan, facts, used)
    assert "1 of 2 replicas do not fit now" in message and "pool: 1" in message


def test_pools_planned_ahead_of_their_nodes_are_not_short() -> None:
    plan, facts = _setup([{"name": "later", "nodeSelector": {"x": "y"}, "gpu": {"product": "B300", "perNode": 8},
                           "aggregated": {"replicas": 4}}], [])
    assert shortfalls(plan, facts, {}) == []


def test_usage_walked_once_answers_as_a_walk_per_owner_would() -> None:
    """GpuUsage.used_except(owner) is gpus_used with `own` picking that owner's pods, for every
    owner, including one with no pod and pods of no deployment."""
    from kimik3_operator.planner.capacity import GpuUsage

    pods = [_pod("n1", 8, ns="a", label="x"), _pod("n1", 0, ns="a", label="y"), _pod("n2", 4, ns="a", label="y"),
            _pod("n2", 4, ns="b", label="y"), _pod("n3", 8), _pod("n3", 8, ns="a", label="x", phase="Failed"),
            {"metadata": {"namespace": "a"}, "spec": {"containers": []}, "status": {"phase": "Pending"}}]

    def owner_of(p: dict[str, Any]) -> tuple[str, str | None]:
        return p["metadata"]["namespace"], p["metadata"]["labels"].get("serving.kimik3.dev/deployment") \
            if p["metadata"].get("labels") else None

    usage = GpuUsage(pods, owner_of)
    for owner in [("a", "x"), ("a", "y"), ("b", "y"), ("c", "z"), ("other", None)]:
        expected = {n: g for n, g in gpus_used(pods, lambda p, o=owner: owner_of(p) == o).items() if g}
        assert usage.used_except(owner) == expected, owner


def test_a_thousand_free_nodes_are_not_each_looked_at_to_place_one_replica() -> None:
    """Placement stops at the first nodes that fit; a node holding others' GPUs is passed over."""
    import dataclasses

    class Counting(dict[str, int]):
        looked: list[str] = []

        def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
            self.looked.append(key)
            return super().get(key, default)

    plan, facts = _setup([{"name": "b", "nodeSelector": B200, "aggregated": {"replicas": 2}}], b200_nodes(1))
    one = facts["b"].nodes[0]
    pool = dataclasses.replace(facts["b"], nodes=tuple(dataclasses.replace(one, name=f"n{i}") for i in range(1000)))
    used = Counting({"n0": 8})
    assert shortfalls(plan, {"b": pool}, used) == []
    # n0 is full, the first free nodes take the replicas; each placement looks from the first node again
    needed = plan.pools[0].roles[0].nodes_per_replica * 2
    assert set(used.looked) == {f"n{i}" for i in range(needed + 1)} and len(used.looked) <= 2 * (needed + 1)


def test_a_held_rollout_without_room_for_its_surge_group_says_so() -> None:
    """Two DEP16 prefill replicas take all four B200 nodes: the plan fits, but a held rollout
    (maxSurge 1) starts a third group beside them, which has nowhere to go."""
    plan, facts = _setup([{"name": "b", "nodeSelector": B200, "prefill": {
        "replicas": 2, "parallelism": {"tensor": 8, "data": 2, "expert": True}}},
        {"name": "g", "nodeSelector": GB300, "decode": {"replicas": 2}}], b200_nodes(4) + gb300_rack())
    assert shortfalls(plan, facts, {}) == []
    (message,) = shortfalls(plan, facts, {}, {("b", "prefill"): 1, ("g", "decode"): 1})
    assert message.startswith("pool b role prefill: the rollout needs room for 1 new group(s) beside its 2 "
                              "serving and the nodes hold 0; each needs 2 node(s) with 8 free GPUs")
    assert "set spec.rollout.maxSurge: 0 and maxUnavailable: 1" in message
    plan, facts = _setup([{"name": "b", "nodeSelector": B200, "prefill": {
        "replicas": 1, "parallelism": {"tensor": 8, "data": 2, "expert": True}}},
        {"name": "g", "nodeSelector": GB300, "decode": {"replicas": 2}}], b200_nodes(4) + gb300_rack())
    assert shortfalls(plan, facts, {}, {("b", "prefill"): 1}) == []  # one replica: room for its surge group
