"""Where a pod may run, as planned (planner/placement.py): one rendering for every pod the operator
makes (serving pods per role, router pods, staging Jobs)."""

from __future__ import annotations

from typing import Any

from ..planner.placement import Placement


def placement(where: Placement) -> dict[str, Any]:
    """The pod spec's `nodeSelector`, `tolerations`, `priorityClassName` and `schedulerName`, and
    its node affinity under `affinity`, each left out when empty: a spec that sets none renders the
    template it rendered before they existed (no rollout on upgrade)."""
    out: dict[str, Any] = {}
    if where.node_selector:
        out["nodeSelector"] = dict(where.node_selector)
    if where.tolerations:
        out["tolerations"] = [dict(t) for t in where.tolerations]
    if where.priority_class_name:
        out["priorityClassName"] = where.priority_class_name
    if where.scheduler_name:
        out["schedulerName"] = where.scheduler_name
    if where.node_affinity:
        out["affinity"] = {"nodeAffinity": dict(where.node_affinity)}
    return out


def place(pod_spec: dict[str, Any], where: Placement) -> dict[str, Any]:
    """`pod_spec` placed: `placement(where)` written into it, its node affinity beside the pod
    (anti-)affinity the pod spec already has."""
    placed = placement(where)
    node = placed.pop("affinity", None)
    pod_spec.update(placed)
    if node:
        pod_spec["affinity"] = {**(pod_spec.get("affinity") or {}), **node}
    return pod_spec
