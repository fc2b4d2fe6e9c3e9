"""Is there room for the plan on the nodes present now? Said with numbers, not a silent Pending.

A replica needs `nodes_per_replica` nodes with `gpus_per_pod` free GPUs each, all inside one
NVLink clique when the group must share one. GPUs count as used when a running or pending pod
that is not this deployment's own has them on that node. Replicas are placed greedily, pool by
pool and role by role, on what the earlier ones left. Capacity depends on the nodes, so a
shortfall is a status condition and the children are still applied: new nodes (a cluster
autoscaler, a scale-from-zero pool) make the pods schedule on their own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .facts import GPU_RESOURCES, PoolFacts, _quantity
from .plan import Plan

NO_CLIQUE = ""


def pod_gpu_view(pod: Mapping[str, Any], keep_labels: Sequence[str] = ()) -> dict[str, Any]:
    """The parts of a pod that `gpus_used` reads, `keep_labels` of its labels (what tells whose pod
    it is) and its identity: an informer over every pod of the cluster keeps only these (a full pod
    is kilobytes of spec and status the capacity check never looks at)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    labels = meta.get("labels") or {}
    containers = []
    for container in spec.get("containers") or []:
        requests = (container.get("resources") or {}).get("requests") or {}
        gpus = {r: requests[r] for r in GPU_RESOURCES if r in requests}
        if gpus:
            containers.append({"name": container.get("name", ""), "resources": {"requests": gpus}})
    kept = {k: labels[k] for k in keep_labels if k in labels}
    return {"apiVersion": pod.get("apiVersion", "v1"), "kind": pod.get("kind", "Pod"),
            "metadata": {**{k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta},
                         **({"labels": kept} if kept else {})},
            "spec": {k: v for k, v in (("nodeName", spec.get("nodeName")), ("containers", containers)) if v},
            "status": {"phase": phase} if (phase := (pod.get("status") or {}).get("phase")) else {}}


def gpus_used(pods: Sequence[Mapping[str, Any]], own: Callable[[Any], bool]) -> dict[str, int]:
    """GPUs requested per node by pods that are not `own`."""
    used: dict[str, int] = defaultdict(int)
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or own(pod) or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for container in (pod.get("spec") or {}).get("containers") or []:
            requests = ((container.get("resources") or {}).get("requests") or {})
            used[node] += sum(_quantity(requests.get(r, 0)) for r in GPU_RESOURCES)
    return used


def shortfalls(plan: Plan, facts: Mapping[str, PoolFacts], used: Mapping[str, int]) -> list[str]:
    """One message per role whose replicas cannot all be placed now."""
    free = {n.name: n.gpus - used.get(n.name, 0) for pool in facts.values() for n in pool.nodes}
    messages = []
    for pool in plan.pools:
        nodes = facts.get(pool.name, PoolFacts()).nodes
        if not nodes:
            continue  # planned ahead of its nodes: nothing to place on yet
        for role in pool.roles:
            placed = 0
            for _ in range(role.replicas):
                if not _place(nodes, free, role.nodes_per_replica, role.gpus_per_pod, bool(role.group_topology_key)):
                    break
                placed += 1
            if placed < role.replicas:
                messages.append(_message(pool.name, role.role, placed, role.replicas, role.nodes_per_replica,
                                         role.gpus_per_pod, bool(role.group_topology_key), nodes, free))
    return messages


def _groups(nodes: tuple[Any, ...], by_clique: bool) -> dict[str, list[Any]]:
    groups: dict[str, list[Any]] = defaultdict(list)
    for node in nodes:
        groups[(node.clique or NO_CLIQUE) if by_clique else NO_CLIQUE].append(node)
    return groups


def _place(nodes: tuple[Any, ...], free: dict[str, int], count: int, gpus: int, by_clique: bool) -> bool:
    for members in _groups(nodes, by_clique).values():
        fitting = [n for n in members if free[n.name] >= gpus]
        if len(fitting) >= count:
            for node in fitting[:count]:
                free[node.name] -= gpus
            return True
    return False


def _message(pool: str, role: str, placed: int, replicas: int, count: int, gpus: int, by_clique: bool,
             nodes: tuple[Any, ...], free: dict[str, int]) -> str:
    where = "in one NVLink clique" if by_clique else "in the pool"
    available = ", ".join(f"{clique or 'pool'}: {sum(1 for n in members if free[n.name] >= gpus)}"
                          for clique, members in sorted(_groups(nodes, by_clique).items()))
    return (f"pool {pool} role {role}: {replicas - placed} of {replicas} replicas do not fit now; each needs "
            f"{count} node(s) with {gpus} free GPUs {where}; nodes left with {gpus} free GPUs ({available})")


def replicas_that_fit(plan: Plan, facts: Mapping[str, PoolFacts], used: Mapping[str, int], pool_name: str,
                      role_name: str, most: int) -> int:
    """How many replicas of one role the nodes hold now (at most `most`), once every other role's
    planned replicas are placed: what an autoscaler may ask for without leaving pods Pending. A
    pool planned ahead of its nodes holds none."""
    free = {n.name: n.gpus - used.get(n.name, 0) for pool in facts.values() for n in pool.nodes}
    target = None
    for pool in plan.pools:
        nodes = facts.get(pool.name, PoolFacts()).nodes
        for role in pool.roles:
            if (pool.name, role.role) == (pool_name, role_name):
                target = (nodes, role)
                continue
            for _ in range(role.replicas):
                if not nodes or not _place(nodes, free, role.nodes_per_replica, role.gpus_per_pod,
                                           bool(role.group_topology_key)):
                    break
    if target is None or not target[0]:
        return 0
    nodes, role = target
    placed = 0
    by_clique = bool(role.group_topology_key)
    while placed < most and _place(nodes, free, role.nodes_per_replica, role.gpus_per_pod, by_clique):
        placed += 1
    return placed


def pool_capacity(plan: Plan, facts: Mapping[str, PoolFacts], used: Mapping[str, int]) -> dict[str, Any]:
    """Whether the whole plan fits on the nodes now, in numbers: per pool the nodes and GPUs its
    roles need against the nodes present and GPUs free, and the first reason it does not fit
    (the reconciler's shortfalls, or a pool with no node to place on)."""
    pools = []
    for pool in plan.pools:
        nodes = facts.get(pool.name, PoolFacts()).nodes
        pools.append({
            "pool": pool.name,
            "nodesNeeded": sum(r.replicas * r.nodes_per_replica for r in pool.roles),
            "gpusNeeded": sum(r.replicas * r.gpus_per_replica for r in pool.roles),
            "nodes": len(nodes),
            "gpusFree": sum(max(0, n.gpus - used.get(n.name, 0)) for n in nodes),
        })
    empty = [p["pool"] for p in pools if not p["nodes"] and p["gpusNeeded"]]
    reasons = [f"pool {name}: no schedulable node matches its nodeSelector (planned ahead of its nodes)"
               for name in empty] + shortfalls(plan, facts, used)
    return {"fits": not reasons, "pools": pools, "reason": reasons[0] if reasons else None,
            "reasons": reasons}
