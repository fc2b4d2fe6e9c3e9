"""Turn a spec plus node facts into a Plan.

Walking-skeleton rules: a pool's roles must carry explicit parallelism and replicas (otherwise
the pool gets reason PlanningNotImplemented); GPUs per node come from `gpu.perNode` or the
nodes; a replica larger than a node spans whole nodes (one LeaderWorkerSet group), and on
NVL72 racks its pods share one NVLink clique.
"""

from __future__ import annotations

import hashlib
import json
from typing import Mapping

from ..api import KimiK3DeploymentSpec, Pool
from ..api.v1alpha1 import Speculative
from .catalog import CATALOG
from .facts import CLIQUE_LABEL, PoolFacts
from .images import serving_image
from .plan import EngineSettings, Layout, Plan, PlanningError, PoolPlan, RolePlan

MODEL_PATH = "/models/kimi-k3"
DRAFT_PATH = "/models/kimi-k3-draft"


def plan_deployment(spec: KimiK3DeploymentSpec, facts: Mapping[str, PoolFacts]) -> Plan:
    """Plan every pool; raise PlanningError naming the first pool that cannot be planned."""
    engine = engine_settings(spec)
    pools = tuple(plan_pool(spec, pool, facts.get(pool.name, PoolFacts())) for pool in spec.pools)
    return Plan(pools=pools, engine=engine, compat_hash=compat_hash(engine))


def plan_pool(spec: KimiK3DeploymentSpec, pool: Pool, facts: PoolFacts) -> PoolPlan:
    product = pool.gpu.product if pool.gpu.product != "Auto" else facts.product
    gpus_per_node = pool.gpu.per_node or facts.gpus_per_node
    if gpus_per_node is None:
        raise PlanningError(
            "NoMatchingNodes",
            f"pool {pool.name}: no schedulable GPU node matches nodeSelector "
            f"{dict(pool.node_selector)} and gpu.perNode is not set",
            depends_on_nodes=True,
        )
    gpu = CATALOG.get(product) if product else None
    roles = tuple(plan_role(pool, name, role, gpus_per_node, facts) for name, role in pool.roles())
    return PoolPlan(
        name=pool.name,
        gpu_product=product,
        interconnect=interconnect(pool, facts),
        gpus_per_node=gpus_per_node,
        gpu_resource=facts.gpu_resource or ("amd.com/gpu" if gpu and gpu.vendor == "amd" else "nvidia.com/gpu"),
        node_selector=dict(pool.node_selector),
        tolerations=tuple(t.wire() for t in pool.tolerations),
        image=pool.image or spec.engine.image or serving_image(gpu),
        roles=roles,
        rdma_resource=facts.rdma_resource,
    )


def plan_role(pool: Pool, name: str, role, gpus_per_node: int, facts: PoolFacts) -> RolePlan:  # noqa: ANN001
    where = f"pool {pool.name} role {name}"
    if role.parallelism is None or role.replicas is None:
        missing = " and ".join(f for f, v in (("parallelism", role.parallelism),
                                               ("replicas", role.replicas)) if v is None)
        raise PlanningError(
            "PlanningNotImplemented",
            f"{where}: {missing} not given; automatic planning is not implemented yet, "
            f"set {missing} explicitly",
        )
    p = role.parallelism
    layout = Layout(tensor=p.tensor, pipeline=p.pipeline, data=p.data, expert=p.expert)
    if layout.gpus <= gpus_per_node:
        nodes, per_pod = 1, layout.gpus
    elif layout.gpus % gpus_per_node == 0:
        nodes, per_pod = layout.gpus // gpus_per_node, gpus_per_node
    else:
        raise PlanningError(
            "InvalidSpec",
            f"{where}: {layout.gpus} GPUs per replica do not fill whole {gpus_per_node}-GPU nodes",
        )
    multi_node_nvlink = nodes > 1 and bool(facts.cliques)
    backends = pool.backends
    return RolePlan(
        role=name,  # type: ignore[arg-type]
        replicas=role.replicas,
        layout=layout,
        gpus_per_pod=per_pod,
        nodes_per_replica=nodes,
        all2all_backend=backends.all2all if backends else None,
        moe_backend=backends.moe if backends else None,
        group_topology_key=CLIQUE_LABEL if multi_node_nvlink else None,
    )


def interconnect(pool: Pool, facts: PoolFacts) -> str:
    if pool.interconnect != "Auto":
        return pool.interconnect
    if facts.cliques:
        return "NVLink"
    if facts.product and CATALOG[facts.product].vendor == "amd":
        return "xGMI"
    return "RDMA" if facts.rdma_resource else "NVLink"


def engine_settings(spec: KimiK3DeploymentSpec) -> EngineSettings:
    engine = spec.engine
    retention = engine.prefix_caching.retention
    interval = {"Interval": retention.interval_tokens, "Selective": 0, "Dense": None}[retention.policy]
    return EngineSettings(
        model_path=MODEL_PATH,
        served_name=spec.model.served_name,
        max_model_len=engine.max_model_len,
        prefix_caching=engine.prefix_caching.enabled,
        retention_interval=interval,
        speculative_config=speculative_config(engine.speculative),
        rust_frontend=engine.rust_frontend,
        extra_args=tuple(engine.extra_args),
        env=tuple((e.name, e.value) for e in engine.env),
    )


def speculative_config(spec: Speculative | None) -> dict[str, object] | None:
    if spec is None:
        return None
    if spec.method == "DSpark":
        return {"method": "dspark", "model": DRAFT_PATH, "num_speculative_tokens": spec.num_speculative_tokens}
    return {"method": "mtp", "num_speculative_tokens": spec.num_speculative_tokens}


def compat_hash(engine: EngineSettings) -> str:
    """Hash of the settings prefill and decode must agree on to hand over KV and KDA state."""
    shared = {
        "model_path": engine.model_path,
        "prefix_caching": engine.prefix_caching,
        "retention_interval": engine.retention_interval,
        "speculative_config": engine.speculative_config,
    }
    return hashlib.sha256(json.dumps(shared, sort_keys=True).encode()).hexdigest()[:16]
