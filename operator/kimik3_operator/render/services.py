"""The ClusterIP Service in front of a role's leader pods (the role's endpoint)."""

from __future__ import annotations

from typing import Any

from ..contract.kinds import SERVICE
from ..planner import PoolPlan, RolePlan
from .engine import HTTP_PORT
from .names import LABEL_COMPAT, Owner, object_meta, service_name, workload_name
from .workloads import LWS_NAME_LABEL, LWS_WORKER_INDEX_LABEL


def leader_service(owner: Owner, pool: PoolPlan, role: RolePlan, paired_hash: str | None = None) -> dict[str, Any]:
    """`paired_hash`: for prefill and decode, the one revision both roles' Services send traffic to
    (reconcile/pairing.py), so a request never pairs engines that cannot hand KV over."""
    selector = {LWS_NAME_LABEL: workload_name(owner, pool.name, role.role), LWS_WORKER_INDEX_LABEL: "0"}
    if paired_hash and role.role in ("prefill", "decode"):
        selector[LABEL_COMPAT] = paired_hash
    return {
        **SERVICE.type_meta(),
        "metadata": object_meta(owner, service_name(owner, pool.name, role.role), pool.name, role.role),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def service_url(owner: Owner, pool: str, role: str) -> str:
    return f"http://{service_name(owner, pool, role)}.{owner.namespace}.svc:{HTTP_PORT}"
