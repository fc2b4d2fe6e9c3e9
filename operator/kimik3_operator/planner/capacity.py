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
from collections.abc import Callable, Hashable, Mapping, Sequence
from itertools import islice
from typing import Any

from .facts import GPU_RESOURCES, NodeFacts, PoolFacts, _quantity
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


def _pod_gpus(pod: Mapping[str, Any]) -> tuple[str, int] | None:
    """(node, GPUs requested) of a pod that holds GPUs there now, else None."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    gpus = sum(_quantity(((c.get("resources") or {}).get("requests") or {}).get(r, 0))
               for c in (pod.get("spec") or {}).get("containers") or [] for r in GPU_RESOURCES)
    return node, gpus


def gpus_used(pods: Sequence[Mapping[str, Any]], own: Callable[[Any], bool]) -> dict[str, int]:
    """GPUs requested per node by pods that are not `own`."""
    used: dict[str, int] = defaultdict(int)
    for pod in pods:
        if not own(pod) and (held := _pod_gpus(pod)) is not None:
            used[held[0]] += held[1]
    return used


class GpuUsage:
    """GPUs per node held by every pod, and by each owner's: what `gpus_used` answers for any one
    owner with one walk over the pods (`used_except`), where a walk per answer cost every pass of
    every deployment a walk over the cluster's pods."""

    def __init__(self, pods: Sequence[Mapping[str, Any]], owner_of: Callable[[Mapping[str, Any]], Hashable]) -> None:
        self.total: dict[str, int] = defaultdict(int)
        self.by_owner: dict[Hashable, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for pod in pods:
            if (held := _pod_gpus(pod)) is not None:
                self.total[held[0]] += held[1]
                self.by_owner[owner_of(pod)][held[0]] += held[1]

    def used_except(self, owner: Hashable) -> dict[str, int]:
        """`gpus_used(pods, own)` where `own` picks the pods `owner_of` gives `owner`."""
        mine = self.by_owner.get(owner) or {}
        return {node: left for node, gpus in self.total.items() if (left := gpus - mine.get(node, 0))}


class _Free:
    """GPUs left per node as replicas are placed: the nodes' GPUs less `used` less what earlier
    replicas of this placement took, worked out for the nodes looked at only (a pool of a thousand
    free nodes places a replica on its first)."""

    def __init__(self, used: Mapping[str, int]) -> None:
        self.used = used
        self.taken: defaultdict[str, int] = defaultdict(int)

    def __call__(self, node: NodeFacts) -> int:
        return node.gpus - self.used.get(node.name, 0) - self.taken[node.name]


def shortfalls(plan: Plan, facts: Mapping[str, PoolFacts], used: Mapping[str, int],
               surge: Mapping[tuple[str, str], int] | None = None) -> list[str]:
    """One message per role whose replicas cannot all be placed now. `surge`: per (pool, role) that
    rolls with its old groups held (reconcile/rollout.py), the surge groups LeaderWorkerSet starts
    beside them: without room for those the rollout cannot move, while everything keeps serving."""
    free = _Free(used)
    messages = []
    for pool in plan.pools:
        nodes = facts.get(pool.name, PoolFacts()).nodes
        if not nodes:
            continue  # planned ahead of its nodes: nothing to place on yet
        for role in pool.roles:
            extra = (surge or {}).get((pool.name, role.role), 0)
            placed = 0
            for _ in range(role.replicas + extra):
                if not _place(nodes, free, role.nodes_per_replica, role.gpus_per_pod, bool(role.group_topology_key)):
                    break
                placed += 1
            if placed < role.replicas:
                messages.append(_message(pool.name, role.role, placed, role.replicas, role.nodes_per_replica,
                                         role.gpus_per_pod, bool(role.group_topology_key), nodes, free))
            elif placed < role.replicas + extra:
                messages.append(_surge_message(pool.name, role.role, placed - role.replicas, extra, role.replicas,
                                               role.nodes_per_replica, role.gpus_per_pod,
                                               bool(role.group_topology_key), nodes, free))
    return messages


def _groups(nodes: tuple[Any, ...], by_clique: bool) -> dict[str, Sequence[Any]]:
    if not by_clique:
        return {NO_CLIQUE: nodes}
    groups: dict[str, list[Any]] = defaultdict(list)
    for node in nodes:
        groups[node.clique or NO_CLIQUE].append(node)
    return dict(groups)


def _place(nodes: tuple[Any, ...], free: _Free, count: int, gpus: int, by_clique: bool) -> bool:
    for members in _groups(nodes, by_clique).values():
        fitting = list(islice((n for n in members if free(n) >= gpus), count))
        if len(fitting) >= count:
            for node in fitting:
                free.taken[node.name] += gpus
            return True
    return False


def _room(count: int, gpus: int, by_clique: bool, nodes: tuple[Any, ...], free: _Free) -> str:
    """What one group needs, and what the nodes have left for it."""
    where = "in one NVLink clique" if by_clique else "in the pool"
    available = ", ".join(f"{clique or 'pool'}: {sum(1 for n in members if free(n) >= gpus)}"
                          for clique, members in sorted(_groups(nodes, by_clique).items()))
    return f"each needs {count} node(s) with {gpus} free GPUs {where}; nodes left with {gpus} free GPUs ({available})"


def _message(pool: str, role: str, placed: int, replicas: int, count: int, gpus: int, by_clique: bool,
             nodes: tuple[Any, ...], free: _Free) -> str:
    return (f"pool {pool} role {role}: {replicas - placed} of {replicas} replicas do not fit now; "
            + _room(count, gpus, by_clique, nodes, free))


def _surge_message(pool: str, role: str, placed: int, surge: int, replicas: int, count: int, gpus: int,
                   by_clique: bool, nodes: tuple[Any, ...], free: _Free) -> str:
    return (f"pool {pool} role {role}: the rollout needs room for {surge} new group(s) beside its {replicas} "
            f"serving and the nodes hold {placed}; {_room(count, gpus, by_clique, nodes, free)}. The old revision "
            "serves whole until there is room; to replace groups in place instead (one group fewer while each "
            "restarts), set spec.rollout.maxSurge: 0 and maxUnavailable: 1")


def replicas_that_fit(plan: Plan, facts: Mapping[str, PoolFacts], used: Mapping[str, int], pool_name: str,
                      role_name: str, most: int) -> int:
    """How many replicas of one role the nodes hold now (at most `most`), once every other role's
    planned replicas are placed: what an autoscaler may ask for without leaving pods Pending. A
    pool planned ahead of its nodes holds none."""
    free = _Free(used)
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
