"""DRA ComputeDomain for replicas that span NVL72 trays: multi-node NVLink (IMEX) channels.

NVIDIA's DRA driver turns a ComputeDomain into a ResourceClaimTemplate of the name we give it;
every pod of the role claims one channel from it, which is what lets CUDA map memory across
trays. One domain per (pool, role) with `numNodes: 0` (elastic: it follows where the pods land),
as NVIDIA Dynamo's GB200/GB300 recipes do.
"""

from __future__ import annotations

from typing import Any

from ..contract.kinds import COMPUTE_DOMAIN
from ..planner import PoolPlan, RolePlan
from .names import Owner, object_meta, workload_name

CLAIM_NAME = "compute-domain-channel"


def compute_domain_name(owner: Owner, pool: str, role: str) -> str:
    return f"{workload_name(owner, pool, role)}-cd"


def channel_template_name(owner: Owner, pool: str, role: str) -> str:
    return f"{compute_domain_name(owner, pool, role)}-channel"


def compute_domain(owner: Owner, pool: PoolPlan, role: RolePlan) -> dict[str, Any]:
    return {
        **COMPUTE_DOMAIN.type_meta(),
        "metadata": object_meta(owner, compute_domain_name(owner, pool.name, role.role), pool.name, role.role),
        "spec": {
            "numNodes": 0,
            "channel": {
                "resourceClaimTemplate": {"name": channel_template_name(owner, pool.name, role.role)},
                "allocationMode": "Single",
            },
        },
    }


def pod_claims(owner: Owner, pool: PoolPlan, role: RolePlan) -> list[dict[str, Any]]:
    return [{"name": CLAIM_NAME, "resourceClaimTemplateName": channel_template_name(owner, pool.name, role.role)}]
