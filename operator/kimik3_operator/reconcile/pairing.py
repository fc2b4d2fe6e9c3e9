"""Which revision the prefill and decode Services send traffic to while a rollout is under way.

NIXL hands KV and KDA state over only between engines that agree on the compatibility hash, so a
prefill of one revision must never serve a decode of another. Both roles' Services select one
compatibility hash, and switch together: they keep the revision that serves now until the new one
has a ready leader in every paired role, then move at once. Old pods are left to the rolling update.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..planner import Plan
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
