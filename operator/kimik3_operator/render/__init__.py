"""Pure rendering: Plan -> the Kubernetes objects (plain dicts) that serve it."""

from __future__ import annotations

from typing import Any

from ..planner import Plan
from .compute_domain import compute_domain
from .names import Owner, stamp_hash
from .services import leader_service
from .workloads import leader_worker_set

# Apply order: what a workload needs (its Service, its ComputeDomain) before the workload.
KIND_ORDER = ("Service", "ComputeDomain", "LeaderWorkerSet")


def render_children(owner: Owner, plan: Plan) -> list[dict[str, Any]]:
    """Every child of one deployment, each stamped with its desired-state hash, in apply order."""
    children: list[dict[str, Any]] = []
    for pool, role in plan.role_plans():
        children.append(leader_service(owner, pool, role))
        if role.compute_domain:
            children.append(compute_domain(owner, pool, role))
        children.append(leader_worker_set(owner, plan, pool, role))
    children.sort(key=lambda o: KIND_ORDER.index(o["kind"]))
    return [stamp_hash(c) for c in children]


__all__ = ["Owner", "render_children"]
