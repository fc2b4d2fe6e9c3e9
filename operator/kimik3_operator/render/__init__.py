"""Pure rendering: Plan -> the Kubernetes objects (plain dicts) that serve it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..contract.kinds import APPLY_ORDER
from ..planner import Plan
from ..planner.images import OPERATOR_IMAGE
from ..planner.pods import PodsPlan
from . import compile_cache
from .autoscalers import scalers
from .compute_domain import compute_domain, role_domain_name
from .disruption import role_budget
from .names import Owner, stamp_hash
from .network_policy import network_policies
from .pod_extras import dressed
from .router import RoleEndpoints, router_children, router_identity
from .services import leader_service
from .weights import weights_children
from .workloads import leader_worker_set


def render_weights(owner: Owner, plan: Plan, tools_image: str = OPERATOR_IMAGE) -> list[dict[str, Any]]:
    """What stages the checkpoints: needed before (and independent of) anything that serves."""
    return _in_apply_order(weights_children(owner, plan.weights, tools_image)
                           + compile_cache.own_claim(owner, plan.weights)
                           # The routers' identity: it never changes, and a router may run while
                           # a new revision stages.
                           + router_identity(owner, plan), plan.pods)


def render_serving(owner: Owner, plan: Plan, paired_hash: str | None = None,
                   routers: Mapping[str, int] | None = None,
                   partitions: Mapping[tuple[str, str], int] | None = None,
                   allowances: Mapping[tuple[str, str], int] | None = None) -> list[dict[str, Any]]:
    """What serves, once the plan carries the staged commits; prefill and decode Services select
    `paired_hash` (default: the plan's own); the P/D router runs per revision of `routers`
    (compatibility hash -> routable pairs, router.router_replicas); a (pool, role) in `partitions`
    keeps that many of its groups on the template they run, one in `allowances` may have that many
    more groups unavailable while it rolls (its broken ones, reconcile/rollout.py). Nothing here
    depends on the operator's version."""
    children: list[dict[str, Any]] = []
    domains: set[str] = set()
    for pool, role in plan.role_plans():
        children.append(leader_service(owner, pool, role, paired_hash or plan.compat_hash))
        if role.compute_domain and (domain := role_domain_name(owner, pool, role)) not in domains:
            domains.add(domain)  # prefill and decode may share one
            children.append(compute_domain(owner, pool, role))
        key = (pool.name, role.role)
        children += [leader_worker_set(owner, plan, pool, role, (partitions or {}).get(key, 0),
                                       (allowances or {}).get(key, 0)),
                     role_budget(owner, pool, role)]
    return _in_apply_order(children + scalers(owner, plan) + router_children(owner, plan, routers)
                           + network_policies(owner, plan), plan.pods)


def render_routers(owner: Owner, plan: Plan, routers: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """The routers alone: they depend on the leaders that serve, not on the staged commits."""
    return _in_apply_order(router_children(owner, plan, routers), plan.pods)


def render_children(owner: Owner, plan: Plan, tools_image: str = OPERATOR_IMAGE,
                    routers: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """Every child of one deployment, each stamped with its desired-state hash, in apply order."""
    return render_weights(owner, plan, tools_image) + render_serving(owner, plan, routers=routers)


def _in_apply_order(children: list[dict[str, Any]], pods: PodsPlan | None) -> list[dict[str, Any]]:
    """Dressed with spec.pods, stamped with their desired-state hashes, sorted by kind (stable
    within a kind)."""
    return [stamp_hash(dressed(c, pods)) for c in sorted(children, key=lambda o: APPLY_ORDER[o["kind"]])]


__all__ = ["Owner", "RoleEndpoints", "render_children", "render_routers", "render_serving", "render_weights"]
