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
from ..planner.facts import CLIQUE_LABEL
from .names import (
    LABEL_DEPLOYMENT,
    LABEL_ROLE,
    MAX_WORKLOAD_NAME,
    Owner,
    bounded,
    deployment_label,
    object_meta,
    workload_name,
)

CLAIM_NAME = "compute-domain-channel"
KV_DOMAIN = "kv"
"""The one domain prefill and decode share when their KV goes over multi-node NVLink: IMEX channels
connect the pods of one ComputeDomain only (planner/fabric.py rule 4)."""


def compute_domain_name(owner: Owner, pool: str, role: str) -> str:
    return f"{workload_name(owner, pool, role)}-cd"


def role_domain_name(owner: Owner, pool: PoolPlan, role: RolePlan) -> str:
    """The domain a role's pods claim from: the deployment's shared KV domain, or the role's own."""
    if role.shared_compute_domain:
        return f"{bounded(f'{owner.name}-{KV_DOMAIN}', MAX_WORKLOAD_NAME)}-cd"
    return compute_domain_name(owner, pool.name, role.role)


def channel_template_name(owner: Owner, pool: PoolPlan, role: RolePlan) -> str:
    return f"{role_domain_name(owner, pool, role)}-channel"


def compute_domain(owner: Owner, pool: PoolPlan, role: RolePlan) -> dict[str, Any]:
    """The role's domain; the shared KV domain carries no pool or role label (it serves several)."""
    shared = role.shared_compute_domain
    meta = object_meta(owner, role_domain_name(owner, pool, role), None if shared else pool.name,
                       None if shared else role.role)
    return {
        **COMPUTE_DOMAIN.type_meta(),
        "metadata": meta,
        "spec": {
            "numNodes": 0,
            "channel": {
                "resourceClaimTemplate": {"name": channel_template_name(owner, pool, role)},
                "allocationMode": "Single",
            },
        },
    }


def pod_claims(owner: Owner, pool: PoolPlan, role: RolePlan) -> list[dict[str, Any]]:
    return [{"name": CLAIM_NAME, "resourceClaimTemplateName": channel_template_name(owner, pool, role)}]


def kv_domain_affinity(owner: Owner) -> dict[str, Any]:
    """Every prefill and decode pod of the shared KV domain lands in one NVLink clique (the
    planner proved the nodes sit in one, or assumed it ahead of them; this holds it)."""
    return {
        "labelSelector": {"matchLabels": {LABEL_DEPLOYMENT: deployment_label(owner)},
                          "matchExpressions": [{"key": LABEL_ROLE, "operator": "In", "values": ["prefill", "decode"]}]},
        "topologyKey": CLIQUE_LABEL,
    }
