"""A plan's facts as the status and `kimik3 plan -o json` both show them: one mapping.

A pool's hardware, a role's size, layout and backends, and a router's mode and policies appear in
both with the same values, because both read them from these tables, keyed by the status models'
field names (PoolStatus, RoleStatus, RouterStatus). Each adds what only it knows: the status its
live replica counts and endpoints, the plan output its commands and predictions.
The wire keys are the status models' own aliases, so the two can never spell a fact differently.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from ..api.role_settings import ROLE_SETTINGS
from ..api.status import PoolStatus, RoleStatus, RouterStatus
from ..planner import PoolPlan, RolePlan, RouterPlan

POOL_FIELDS = {
    "name": "name",
    "gpu_product": "gpu_product",
    "interconnect": "interconnect",
    "gpus_per_node": "gpus_per_node",
}
"""PoolStatus field -> attribute of the PoolPlan."""

ROLE_FIELDS = {
    "role": "role",
    "replicas": "replicas",
    "replicas_source": "replicas_source",
    "gpus_per_replica": "gpus_per_replica",
    "nodes_per_replica": "nodes_per_replica",
    "tensor_parallel": "layout.tensor",
    "pipeline_parallel": "layout.pipeline",
    "data_parallel": "layout.data",
    "expert_parallel": "layout.expert",
    "all2all_backend": "all2all_backend",
    "moe_backend": "moe_backend",
    "compute_domain": "compute_domain",
    "expert_dispatch": "expert_dispatch",
    "kv_transport": "kv_transport",
    "rdma_nics": "rdma_request",
    **{s.status_field: f"shape.{s.status_field}" for s in ROLE_SETTINGS},
    "pod_resources": "pod_resources_fields",
    "load_format": "load_format",
    "expert_weight_filter": "expert_weight_filter",
    "cold_start": "cold_start_fields",
    "vision_encoder": "vision_encoder",
}
"""RoleStatus field -> attribute (path) of the RolePlan."""


ROUTER_FIELDS = {
    "mode": "mode",
    "prefill_policy": "prefill_policy",
    "decode_policy": "decode_policy",
    "policy": "policy",
}
"""RouterStatus field -> attribute of the RouterPlan."""


def pool_fields(pool: PoolPlan) -> dict[str, Any]:
    return {field: attrgetter(attr)(pool) for field, attr in POOL_FIELDS.items()}


def role_fields(role: RolePlan) -> dict[str, Any]:
    return {field: attrgetter(attr)(role) for field, attr in ROLE_FIELDS.items()}


def router_fields(router: RouterPlan) -> dict[str, Any]:
    return {field: attrgetter(attr)(router) for field, attr in ROUTER_FIELDS.items()}


def plan_key(field: str) -> str:
    """The key `kimik3 plan -o json` shows a status field's fact under: the status's own."""
    model = next(m for m in (RoleStatus, PoolStatus, RouterStatus) if field in m.model_fields)
    return model.model_fields[field].alias or field


def plan_keys(fields: dict[str, Any]) -> dict[str, Any]:
    return {plan_key(field): value for field, value in fields.items()}
