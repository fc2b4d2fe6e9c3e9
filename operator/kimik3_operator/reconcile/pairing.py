"""Which revision the prefill and decode leader Services select while a rollout is under way, and
which revisions get a P/D router.

NIXL hands KV and KDA state over only between engines that agree on the compatibility hash, so a
prefill of one revision must never serve a decode of another. Both roles' Services select one
compatibility hash, and switch together: they keep the revision that serves now until the new one
has a routable leader in every paired role, then move at once. The routers find their engines
themselves (render/router.py): each P/D router pairs one revision, and every revision with a
routable pair has one (`revision_pairs`), so old and new pairs both serve while a rollout holds the
old groups (rollout.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

from ..planner import Plan
from ..render import RoleEndpoints
from ..render.names import LABEL_COMPAT, LABEL_POOL, LABEL_ROLE
from ..render.workloads import LWS_WORKER_INDEX_LABEL

PAIRED = ("prefill", "decode")


def routable(pod: Mapping[str, Any]) -> bool:
    """Ready and not terminating: what the router's discovery adds (vllm-router 0.1.17
    src/service_discovery.rs: Running, Ready=True, no deletionTimestamp)."""
    status = pod.get("status") or {}
    return (status.get("phase") == "Running" and not (pod.get("metadata") or {}).get("deletionTimestamp")
            and any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []))


def ready_leader_hashes(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """(pool, role) -> compatibility hashes of its routable leader pods (a terminating pod no
    longer counts: the router has already dropped it)."""
    out: dict[tuple[str, str], set[str]] = {}
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(LABEL_ROLE) in PAIRED and labels.get(LWS_WORKER_INDEX_LABEL) == "0" and routable(pod):
            out.setdefault((labels.get(LABEL_POOL, ""), labels[LABEL_ROLE]), set()).add(labels.get(LABEL_COMPAT, ""))
    return out


def serving_hash(plan: Plan, pods: Iterable[Mapping[str, Any]], selected: set[str]) -> str:
    """The hash the paired roles' Services should select. `selected` is what they select now."""
    roles = [(pool.name, role.role) for pool, role in plan.role_plans() if role.role in PAIRED]
    if not roles:
        return plan.compat_hash
    ready = ready_leader_hashes(pods)

    def serves(h: str) -> bool:
        return all(h in ready.get(key, set()) for key in roles)

    if serves(plan.compat_hash):
        return plan.compat_hash
    if len(selected) == 1 and (current := next(iter(selected))) and serves(current):
        return current  # keep the pairs that work until the new revision can take over whole
    return plan.compat_hash


def _address(pod: Mapping[str, Any]) -> str | None:
    ip = (pod.get("status") or {}).get("podIP")
    try:
        return str(ipaddress.ip_address(ip)) if ip else None
    except ValueError:
        return None


def revision_pairs(plan: Plan, pods: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Compatibility hash -> how many pairs of that revision can be routed: the fewer of its
    routable prefill and decode leaders (0 and left out when it has none of one kind). Counted as
    the router pairs them, by role over every pool of the deployment (its selectors name no pool):
    a pool added, emptied or renamed with a hash change leaves the old revision's pairs as they
    are. `pods` are the deployment's own; a plan with no paired role has none."""
    if not any(role.role in PAIRED for _, role in plan.role_plans()):
        return {}
    counts: dict[str, dict[str, int]] = {}
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        role = labels.get(LABEL_ROLE, "")
        if role in PAIRED and labels.get(LWS_WORKER_INDEX_LABEL) == "0" and routable(pod):
            per = counts.setdefault(labels.get(LABEL_COMPAT, ""), {})
            per[role] = per.get(role, 0) + 1
    out = {h: min(per.get(role, 0) for role in PAIRED) for h, per in counts.items()}
    return {h: n for h, n in sorted(out.items()) if n > 0}


def _address_key(address: str) -> tuple[int, Any]:
    ip = ipaddress.ip_address(address)
    return ip.version, ip


def leader_endpoints(plan: Plan, pods: Iterable[Mapping[str, Any]], paired_hash: str | None = None
                     ) -> tuple[RoleEndpoints, ...]:
    """The IPs of the plan's routable leader pods, what the routers' discovery finds: per role, and
    for prefill and decode per revision (only `paired_hash`'s when one is given, with an empty entry
    when it has none); aggregated roles pair with nothing and list every revision's. `pods` are the
    deployment's own."""
    found: dict[tuple[str, str, str | None], set[str]] = {}
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(LWS_WORKER_INDEX_LABEL) != "0" or not routable(pod):
            continue
        paired = labels.get(LABEL_ROLE) in PAIRED
        if paired and paired_hash is not None and labels.get(LABEL_COMPAT) != paired_hash:
            continue
        if (address := _address(pod)) is not None:
            revision = labels.get(LABEL_COMPAT, "") if paired else None
            found.setdefault((labels.get(LABEL_POOL, ""), labels.get(LABEL_ROLE, ""), revision), set()).add(address)
    out = []
    for pool, role in plan.role_plans():
        hashes = ([paired_hash] if paired_hash is not None else
                  sorted(h for p, r, h in found if (p, r) == (pool.name, role.role) and h is not None)
                  ) if role.role in PAIRED else [None]
        out += [RoleEndpoints(pool=pool.name, role=role.role, compat_hash=h,
                              addresses=tuple(sorted(found.get((pool.name, role.role, h), ()), key=_address_key)))
                for h in hashes]
    return tuple(out)
