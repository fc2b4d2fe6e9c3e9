"""Which revision the prefill and decode Services and the router send traffic to while a rollout
is under way, and which engines the router lists.

NIXL hands KV and KDA state over only between engines that agree on the compatibility hash, so a
prefill of one revision must never serve a decode of another. Both roles' Services select one
compatibility hash, and switch together: they keep the revision that serves now until the new one
has a ready leader in every paired role, then move at once. Old pods are left to the rolling update.
The P/D router lists the ready leaders of that same hash only, so it switches at the same moment.

The lists follow the pods through the LeaderWorkerSet events: a leader that turns ready or unready
changes its workload's ready count, and a leader replaced under a new IP does both. A change the
workload's status does not show (a restart faster than its controller looks) waits for the resync.
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


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def ready_leader_hashes(pods: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """(pool, role) -> compatibility hashes of its ready leader pods."""
    out: dict[tuple[str, str], set[str]] = {}
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(LABEL_ROLE) in PAIRED and labels.get(LWS_WORKER_INDEX_LABEL) == "0" and _ready(pod):
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


def leader_endpoints(plan: Plan, pods: Iterable[Mapping[str, Any]], paired_hash: str) -> tuple[RoleEndpoints, ...]:
    """Per role of the plan, the IPs of its ready leader pods that are not terminating: of
    `paired_hash` only for prefill and decode; of any revision for aggregated roles, which pair
    with nothing (their rolling update keeps old leaders serving until new ones are ready, as their
    Service does). `pods` are the deployment's own."""
    found: dict[tuple[str, str], set[str]] = {}
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if (labels.get(LWS_WORKER_INDEX_LABEL) != "0" or not _ready(pod)
                or (pod.get("metadata") or {}).get("deletionTimestamp")):
            continue
        if labels.get(LABEL_ROLE) in PAIRED and labels.get(LABEL_COMPAT) != paired_hash:
            continue
        if (address := _address(pod)) is not None:
            found.setdefault((labels.get(LABEL_POOL, ""), labels.get(LABEL_ROLE, "")), set()).add(address)
    return tuple(RoleEndpoints(pool=pool.name, role=role.role,
                               addresses=tuple(sorted(found.get((pool.name, role.role), ()))),
                               compat_hash=paired_hash if role.role in PAIRED else None)
                 for pool, role in plan.role_plans())
