"""Where each pod may run: what the planner requires, merged with the user's `scheduling` blocks.

Serving pods tolerate the GPU taints their pool's nodes carry, as Kubernetes' own
ExtendedResourceToleration admission plugin would (key = the extended resource they request,
operator Exists; plugin/pkg/admission/extendedresourcetoleration): GPU nodes are commonly tainted so
(`nvidia.com/gpu`, `amd.com/gpu`: EKS and GKE GPU node groups, NVIDIA's and AMD's operator guides),
and a cluster without that plugin would leave every engine Pending. Routers and staging Jobs request
no GPU and get no such toleration, so on such a cluster they stay off the GPU nodes unless the user
tolerates it.

A user's node affinity is ANDed with the pool's nodeSelector, so a required affinity that no node
of the pool satisfies can never place a pod: refused when planned, naming the pool's nodes, not left
Pending. Capacity is still counted over the pool's nodes (a role that narrows them may find less
room than planned, which status then reports as pods that do not schedule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..api.reasons import NO_MATCHING_NODES
from ..api.spec import NodeSelectorRequirement, NodeSelectorTerm, Scheduling
from .facts import NodeFacts
from .placement import Placement, placement
from .plan import PlanningError


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, str]) -> bool:
    """core/v1 Toleration.ToleratesTaint: an empty key with Exists matches every taint; an empty
    effect every effect; Exists any value, Equal (the default) only the taint's."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    if toleration.get("operator") == "Exists":
        return True
    return bool(toleration.get("key")) and (toleration.get("value") or "") == (taint.get("value") or "")


def gpu_tolerations(nodes: Sequence[NodeFacts], have: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """What the serving pods need to tolerate the GPU taints the pool's nodes carry, beyond the
    tolerations they `have`: {key: <GPU resource>, operator: Exists, effect: <the taint's>}, as
    ExtendedResourceToleration adds. Only taints some node carries and nothing tolerates yet: a
    deployment that already runs (its nodes untainted, or tolerated by the spec) renders the pod
    template it rendered before, and an operator upgrade restarts no engine."""
    out: list[dict[str, Any]] = []
    for taint in (t for n in nodes for t in n.gpu_taints):
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(tolerates(t, taint) for t in [*have, *out]):
            out.append({"key": taint["key"], "operator": "Exists", "effect": taint["effect"]})
    return tuple(out)


def _holds(requirement: NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    """core/v1 NodeSelectorRequirement semantics (k8s.io/component-helpers/scheduling/corev1/nodeaffinity)."""
    value = labels.get(requirement.key)
    match requirement.operator:
        case "In":
            return value is not None and value in requirement.values
        case "NotIn":
            return value is None or value not in requirement.values
        case "Exists":
            return value is not None
        case "DoesNotExist":
            return value is None
        case _:  # Gt, Lt: the label must parse as an integer
            try:
                have, bound = int(value or ""), int(requirement.values[0])
            except ValueError:
                return False
            return have > bound if requirement.operator == "Gt" else have < bound


def _matches(term: NodeSelectorTerm, labels: Mapping[str, str]) -> bool:
    return all(_holds(r, labels) for r in term.match_expressions)


def check_reachable(where: str, scheduling: Scheduling | None, nodes: Sequence[NodeFacts]) -> None:
    """Refuse a required node affinity that none of the pool's schedulable nodes satisfies (planning
    ahead of the nodes, with none seen yet, checks nothing)."""
    affinity = scheduling.node_affinity if scheduling else None
    required = affinity.required_during_scheduling_ignored_during_execution if affinity else None
    seen = [n for n in nodes if n.schedulable]
    if required is None or not seen:
        return
    if not any(_matches(term, n.labels) for n in seen for term in required.node_selector_terms):
        names = ", ".join(sorted(n.name for n in seen)[:8]) + (" ..." if len(seen) > 8 else "")
        raise PlanningError(NO_MATCHING_NODES, f"{where}: scheduling.nodeAffinity's required terms match none of "
                                               f"the pool's {len(seen)} schedulable nodes ({names})",
                            depends_on_nodes=True)


def role_placement(where: str, node_selector: Mapping[str, str], tolerations: Sequence[Mapping[str, Any]],
                   scheduling: Scheduling | None, nodes: Sequence[NodeFacts]) -> Placement:
    """A serving role's placement on its pool's `nodes`: refused when its required node affinity
    matches none of them; the GPU taints they carry tolerated unless the pool or role already does."""
    check_reachable(where, scheduling, nodes)
    own = [*tolerations, *(t.wire() for t in (scheduling.tolerations if scheduling else ()))]
    return placement(node_selector, tolerations, scheduling, *gpu_tolerations(nodes, own))
