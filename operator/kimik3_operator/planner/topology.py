"""Turn a spec plus node facts into a Plan: hardware per pool, layout and backends per role.

The pool's GPU comes from `gpu.product` or the nodes' labels; GPUs per node from `gpu.perNode`
or node capacity; the NVLink domain from the catalog and the nodes' clique labels (NVL72) or
`interconnect`. Each role's layout is chosen (layout.py) or, when given, checked; a replica
larger than a node becomes one LeaderWorkerSet group, which on NVL72 racks stays inside one
clique and gets a DRA ComputeDomain for multi-node NVLink.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping

from ..api import KimiK3DeploymentSpec, Pool, Role, RoleName
from ..api.quantity import quantity
from ..api.reasons import HARDWARE_UNSUPPORTED, INVALID_SPEC, NO_MATCHING_NODES, PD_INCOMPATIBLE
from ..kimi_k3 import NUM_EXPERTS
from .autoscale import settings as scaling_settings
from .autoscale import with_autoscaling
from .backends import choose_backends
from .blocks import block_size, retention_granularity, round_interval
from .catalog import CATALOG, GpuSpec, closest_labels
from .cold_start import predict as predict_cold_start
from .engine_settings import default_kv_cache_dtype, engine_settings
from .fabric import check_interconnect, expert_dispatch, rdma_plan, with_kv_transport
from .facts import CLIQUE_LABEL, PRODUCT_LABELS, PoolFacts
from .handoff import HandoffBlocks, handoff_blocks, mla_backend, refusal, refused_pairs
from .images import PROJECT_ROUTER_IMAGES, RouterImages, serving_image
from .layout import Fabric, MemoryInputs, check_layout, choose_layout
from .loading import loading
from .network import network_plan
from .plan import EngineSettings, EngineShape, Layout, Plan, PlanningError, PoolPlan, RolePlan
from .pod_resources import NodeShape, node_shape, serving_resources
from .pods import pods_plan
from .router import router_plans
from .scheduling import role_placement
from .shaping import graph_ceiling, overrides_of, shape
from .split import DEFAULT_WORKLOAD, assign_replicas
from .timeouts import startup_timeouts
from .traps import check_traps
from .vision import vision_encoder
from .weights import weights_plan, with_commits


def plan_deployment(spec: KimiK3DeploymentSpec, facts: Mapping[str, PoolFacts],
                    staged: Mapping[str, str] | None = None, prometheus_url: str | None = None,
                    router_images: RouterImages = PROJECT_ROUTER_IMAGES) -> Plan:
    """Plan every pool; raise PlanningError naming the first pool that cannot be planned.
    `staged` maps "model"/"draft" to the commit its staging Job reported; `prometheus_url` and
    `router_images` are the operator's defaults for the scalers and the router pods (the spec's
    spec.autoscaling.prometheusUrl and spec.router.image win)."""
    gpus = [pool_gpu(pool, facts.get(pool.name, PoolFacts())) for pool in spec.pools]
    engine = engine_settings(spec, default_kv_cache_dtype(gpus))
    pools = tuple(plan_pool(spec, engine, pool, facts.get(pool.name, PoolFacts())) for pool in spec.pools)
    check_mla_backends(engine, pools)
    check_pd_pairing(pools)
    pools = align_handoff(spec, engine, pools, facts)
    pools = with_kv_transport(pools, {p.name: p for p in spec.pools}, facts)
    omitted = {(p.name, name) for p in spec.pools for name, role in p.roles() if role.replicas is None}
    pools = with_autoscaling(spec, assign_replicas(spec, engine, pools, omitted))
    check_traps(pools, frozenset(spec.experimental.accept_known_issues if spec.experimental else ()))
    pools, engine = align_blocks(pools, engine)
    pools = with_vision_encoders(engine, with_cold_starts(spec, with_shapes(spec, engine, pools)))
    return with_staged(Plan(pools=pools, engine=engine, compat_hash="", weights=weights_plan(spec),
                            max_surge=spec.rollout.max_surge, max_unavailable=spec.rollout.max_unavailable,
                            routers=router_plans(spec, prefill_rates(spec, pools), router_images),
                            scaling=scaling_settings(spec, pools, prometheus_url),
                            network=network_plan(spec), pods=pods_plan(spec)),
                       staged or {})


def prefill_rates(spec: KimiK3DeploymentSpec, pools: tuple[PoolPlan, ...]) -> dict[tuple[str, RoleName], float]:
    """Prompt tokens per second one replica of each prefilling role takes, as predicted: its prompts
    per second at the workload's prompt length (planner/perf.py), times that length."""
    tokens = (spec.workload or DEFAULT_WORKLOAD).input_tokens
    return {(p.name, r.role): r.predicted["prefillRequestsPerSecond"] * tokens
            for p in pools for r in p.roles if r.predicted.get("prefillRequestsPerSecond")}


def with_staged(plan: Plan, commits: Mapping[str, str]) -> Plan:
    """The plan once checkpoints are staged: their commits enter the compatibility hash (both
    roles must serve the same weights) and the serving pods' wait condition."""
    weights = with_commits(plan.weights, commits)
    engine = dataclasses.replace(plan.engine, commits=tuple((s.name, s.commit) for s in weights.sources if s.commit))
    return dataclasses.replace(plan, engine=engine, weights=weights, compat_hash=compat_hash(engine, plan.pools))


def with_shapes(spec: KimiK3DeploymentSpec, engine: EngineSettings,
                pools: tuple[PoolPlan, ...]) -> tuple[PoolPlan, ...]:
    """Give each role its engine shape (shaping.py) from its predicted batch and the spec's
    per-role overrides."""
    roles = {(p.name, name): r for p in spec.pools for name, r in p.roles()}
    input_tokens = (spec.workload or DEFAULT_WORKLOAD).input_tokens

    def one(pool: PoolPlan, role: RolePlan) -> RolePlan:
        given = roles[(pool.name, role.role)].engine
        result = shape(role.role, CATALOG.get(pool.gpu_product or ""), role.layout, role.moe_backend,
                       batch_at_slo=role.predicted.get("decodeBatchAtSlo"), input_tokens=input_tokens,
                       max_model_len=engine.max_model_len, kv_dtype=engine.kv_dtype_family,
                       spec_tokens=engine.speculative_tokens, ssm_dtype=engine.ssm_dtype,
                       overrides=overrides_of(given))
        check_shape(f"pool {pool.name} role {role.role}", role, result, engine.max_model_len)
        return dataclasses.replace(role, shape=result)

    return tuple(dataclasses.replace(pool, roles=tuple(one(pool, r) for r in pool.roles)) for pool in pools)


def check_shape(where: str, role: RolePlan, result: EngineShape, max_model_len: int | None) -> None:
    """What vLLM 0.33.0 would refuse at start-up, refused at planning: a token budget below the
    sequence count (config/scheduler.py:331-336), a long-prefill threshold past the context
    (:355-360), EPLB without a data-parallel expert group
    (config/parallel.py:563-583) or with experts that do not spread evenly (fused_moe/layer.py:274)."""
    if result.max_num_batched_tokens < result.max_num_seqs:
        raise PlanningError(INVALID_SPEC, f"{where}: maxNumBatchedTokens {result.max_num_batched_tokens} is below "
                                          f"maxNumSeqs {result.max_num_seqs}; vLLM refuses that")
    threshold = result.long_prefill_token_threshold
    if threshold and max_model_len and threshold > max_model_len:
        raise PlanningError(INVALID_SPEC, f"{where}: longPrefillTokenThreshold {threshold} exceeds "
                                          f"engine.maxModelLen {max_model_len}; vLLM refuses that")
    if result.eplb_redundant_experts is None:
        return
    ep = role.layout.tensor * role.layout.data
    if not role.layout.expert or ep <= 1:
        raise PlanningError(INVALID_SPEC, f"{where}: EPLB needs expert parallelism over more than one GPU "
                                          "(parallelism.expert with tensor x data > 1)")
    if (NUM_EXPERTS + result.eplb_redundant_experts) % ep:
        raise PlanningError(INVALID_SPEC, f"{where}: {NUM_EXPERTS} experts plus {result.eplb_redundant_experts} "
                                          f"redundant ones do not divide over {ep} expert-parallel ranks")


def align_blocks(pools: tuple[PoolPlan, ...], engine: EngineSettings) -> tuple[tuple[PoolPlan, ...], EngineSettings]:
    """Give each role the block size vLLM will use, and round a retention interval to a multiple
    of all of them (the status shows the effective value)."""
    pools = tuple(dataclasses.replace(pool, roles=tuple(
        dataclasses.replace(role, block_size=block_size(role.layout.tensor, engine.kv_dtype_family,
                                                        engine.ssm_dtype, engine.speculative_tokens))
        for role in pool.roles)) for pool in pools)
    granularity = retention_granularity([r.block_size for p in pools for r in p.roles if r.block_size])
    interval = engine.retention_requested
    if interval:
        interval = round_interval(interval, granularity)
    return pools, dataclasses.replace(engine, retention_interval=interval, retention_granularity=granularity)


PAIRED = ("prefill", "decode")


def check_mla_backends(engine: EngineSettings, pools: tuple[PoolPlan, ...]) -> None:
    """Every pool's engines need an MLA attention backend for the KV cache dtype (handoff.py)."""
    for pool in pools:
        if pool.gpu_product:
            try:
                mla_backend(CATALOG[pool.gpu_product], engine.kv_cache_dtype)
            except PlanningError as exc:
                raise PlanningError(exc.reason, f"pool {pool.name}: {exc.message}") from exc


def paired_blocks(engine: EngineSettings, pools: tuple[PoolPlan, ...]) -> list[HandoffBlocks]:
    return [handoff_blocks(f"pool {p.name} role {r.role}", r.role, CATALOG[p.gpu_product], r.layout, engine)
            for p in pools if p.gpu_product for r in p.roles if r.role in PAIRED]


def align_handoff(spec: KimiK3DeploymentSpec, engine: EngineSettings, pools: tuple[PoolPlan, ...],
                  facts: Mapping[str, PoolFacts]) -> tuple[PoolPlan, ...]:
    """Every prefill/decode pair must pass vLLM's NIXL handshake (handoff.py). When the roles' own
    layouts do not, the prefill roles whose parallelism the spec leaves out are planned again at one
    tensor size: a decode's, else an explicit prefill's. Decodes are never laid out again: their
    layout is the tight one (memory, inter-token latency), and moving a decode to a prefill's tensor
    size could double its GPUs or cut its speed (a TP8 decode forced to TP1 x DP16). A spec that
    still leaves a pair vLLM refuses is refused with each pair's numbers, and why the re-plan failed."""
    refused = refused_pairs(paired_blocks(engine, pools), engine.prefix_caching)
    if not refused:
        return pools
    given = {(p.name, name) for p in spec.pools for name, r in p.roles() if r.parallelism is not None}
    movable = {(p.name, r.role) for p in pools for r in p.roles
               if r.role == "prefill" and (p.name, r.role) not in given}
    tried = [r.layout.tensor for kind in ("decode", "prefill") for p in pools for r in p.roles
             if r.role == kind and (p.name, r.role) not in movable]
    by_name = {p.name: p for p in spec.pools}
    why = ""
    for tensor in dict.fromkeys(tried) if movable else ():
        try:
            candidate = tuple(
                plan_pool(spec, engine, by_name[p.name], facts.get(p.name, PoolFacts()), {"prefill": tensor})
                if (p.name, "prefill") in movable else p for p in pools)
        except PlanningError as exc:
            why = f" (its prefill planned at tensor size {tensor}: {exc.message})"
            continue
        if not refused_pairs(paired_blocks(engine, candidate), engine.prefix_caching):
            return candidate
    from_nodes = any(p.gpu.product == "Auto" for p in spec.pools if p.prefill is not None or p.decode is not None)
    raise refusal(refused, why, depends_on_nodes=from_nodes)


def check_pd_pairing(pools: tuple[PoolPlan, ...]) -> None:
    """Prefill and decode on different generations (or vendors) are refused: their MLA backends
    differ (handoff.py: FLASHINFER_MLA on Blackwell, FLASH_ATTN_MLA or FLASHMLA on Hopper), vLLM's
    handshake hash names only the first attention layer's backend (for K3 possibly its KDA one, the
    same on both), so nothing would catch a mismatch in the MLA pages, and no one has run such a pair
    (docs/pd-handoff.md)."""
    kinds = {(CATALOG[p.gpu_product].vendor, CATALOG[p.gpu_product].generation)
             for p in pools if p.gpu_product for r in p.roles if r.role in PAIRED}
    if len(kinds) > 1:
        seen = ", ".join(f"{v} {g}" for v, g in sorted(kinds))
        raise PlanningError(PD_INCOMPATIBLE,
                            f"prefill and decode run on different GPU generations ({seen}): their MLA "
                            "attention backends differ and no such pair is known to hand over KV; keep "
                            "paired roles on one generation or serve each pool aggregated")


def pool_gpu(pool: Pool, facts: PoolFacts) -> GpuSpec:
    """The pool's GPU: gpu.product when set (the user vouches for the nodes), else the product the
    nodes' labels name exactly. With Auto, a node whose label names no product of the GPU table is
    refused, even beside known ones: planning it as its nearest neighbour would size memory, KV and
    pods for another part (an H200 NVL is not an H200)."""
    if pool.gpu.product == "Auto" and facts.unknown_labels:
        raise PlanningError(HARDWARE_UNSUPPORTED, unknown_gpu_message(pool.name, facts), depends_on_nodes=True)
    product = pool.gpu.product if pool.gpu.product != "Auto" else facts.product
    if product is None:
        if not facts.nodes:
            raise PlanningError(
                NO_MATCHING_NODES,
                f"pool {pool.name}: no schedulable GPU node matches nodeSelector {dict(pool.node_selector)}; "
                "set gpu.product (and gpu.perNode) to plan before the nodes exist",
                depends_on_nodes=True)
        raise PlanningError(
            HARDWARE_UNSUPPORTED,
            f"pool {pool.name}: the GPU nodes carry no GPU product label ({', '.join(PRODUCT_LABELS)}), so "
            f"none is one Kimi K3 supports ({', '.join(CATALOG)}); set gpu.product to plan them",
            depends_on_nodes=True)
    gpu = CATALOG[product]
    if facts.memory_mib and pool.gpu.product in ("Auto", product):
        # The nodes know their memory better than a datasheet (e.g. a part with less HBM enabled).
        gpu = dataclasses.replace(gpu, usable_mib=facts.memory_mib)
    return gpu


def unknown_gpu_message(pool: str, facts: PoolFacts) -> str:
    """Which labels name no product, on how many nodes, and the known spellings nearest to each."""
    parts = []
    for label, count in sorted(facts.unknown_labels.items()):
        near = closest_labels(label)
        hint = f"; closest known labels: {', '.join(near)}" if near else ""
        parts.append(f"{label!r} ({count} of {len(facts.nodes)} nodes{hint})")
    gpus = f"GPU {parts[0]} is not one" if len(parts) == 1 else f"GPUs {' and '.join(parts)} are not ones"
    return (f"pool {pool}: {gpus} Kimi K3 supports; node labels must name a product exactly "
            f"({', '.join(CATALOG)}) and are never read as a neighbour: narrow nodeSelector to known "
            "nodes, or set gpu.product if these nodes are that product")


def pool_fabric(pool: Pool, gpu: GpuSpec, facts: PoolFacts) -> Fabric:
    """The NVLink domain; `interconnect: NVLink | xGMI` pins tensor and expert groups inside it."""
    check_interconnect(pool, gpu)
    per_node = pool.gpu.per_node or facts.gpus_per_node or gpu.gpus_per_node
    pinned = pool.interconnect in ("NVLink", "xGMI")
    if pool.interconnect == "RDMA" or not gpu.multi_node_nvlink:
        nvlink = per_node  # the NVLink domain ends at the node
    elif facts.cliques:
        nvlink = max(facts.cliques.values()) * per_node
    elif facts.nodes:
        nvlink = per_node  # NVL72 GPUs without clique labels: no proof of a multi-node domain
    else:
        nvlink = gpu.nvlink_domain  # planning ahead of the nodes: a full rack
    return Fabric(gpu=gpu, gpus_per_node=per_node, nvlink_gpus=nvlink, pinned=pinned)


def plan_pool(spec: KimiK3DeploymentSpec, engine: EngineSettings, pool: Pool, facts: PoolFacts,
              tensors: Mapping[str, int] | None = None) -> PoolPlan:
    """`tensors`: the tensor size a role whose layout the planner chooses must have (align_handoff)."""
    gpu = pool_gpu(pool, facts)
    fabric = pool_fabric(pool, gpu, facts)
    disaggregated = pool.effective_mode == "Disaggregated"
    mem = MemoryInputs(max_model_len=engine.max_model_len, kv_dtype=engine.kv_dtype_family,
                       spec_tokens=engine.speculative_tokens, ssm_dtype=engine.ssm_dtype)
    roles = tuple(plan_role(pool, name, role, fabric, disaggregated, mem, (tensors or {}).get(name))
                  for name, role in pool.roles())
    roles = with_pod_settings(pool, roles, node_shape(gpu.product, facts.allocatable), fabric.gpus_per_node)
    specs = dict(pool.roles())
    tolerations = tuple(t.wire() for t in pool.tolerations)
    roles = tuple(dataclasses.replace(r, placement=role_placement(
        f"pool {pool.name} role {r.role}", pool.node_selector, tolerations, specs[r.role].scheduling, facts.nodes),
        queue=specs[r.role].queue_name) for r in roles)
    rdma = rdma_plan(pool, facts, fabric.gpus_per_node)
    return PoolPlan(
        name=pool.name,
        gpu_product=gpu.product,
        interconnect=pool_interconnect(gpu, fabric, roles),
        gpus_per_node=fabric.gpus_per_node,
        gpu_resource=facts.gpu_resource or ("amd.com/gpu" if gpu.vendor == "amd" else "nvidia.com/gpu"),
        node_selector=dict(pool.node_selector),
        tolerations=tolerations,
        image=pool.image or spec.engine.image or serving_image(gpu),
        roles=roles,
        rdma=rdma,
        vendor=gpu.vendor,
        arch=facts.arch or gpu.arch,
    )


def with_pod_settings(pool: Pool, roles: tuple[RolePlan, ...], node: NodeShape,
                      gpus_per_node: int) -> tuple[RolePlan, ...]:
    """Each role's pods sized from their GPU share of the node (pod_resources.py)."""
    given = pool.resources
    return tuple(dataclasses.replace(
        r, pod_resources=serving_resources(node, gpus_per_node, r.gpus_per_pod, given.cpu, given.memory,
                                           given.ephemeral_storage)) for r in roles)


def with_cold_starts(spec: KimiK3DeploymentSpec, pools: tuple[PoolPlan, ...]) -> tuple[PoolPlan, ...]:
    """Each role's loader (loading.py; it needs the engine shape's EPLB setting), its predicted cold
    start (cold_start.py; the shape's CUDA-graph sizes) and the start-up deadlines around it
    (timeouts.py)."""
    throughput = float(quantity(spec.model.read_throughput)) if spec.model.read_throughput else None
    from_nodes = {p.name: p.gpu.product == "Auto" for p in spec.pools}

    def one(pool: PoolPlan, role: RolePlan) -> RolePlan:
        eplb = role.shape is not None and role.shape.eplb_redundant_experts is not None
        how = loading(spec.model.loading, pool.vendor, role.layout, eplb, f"pool {pool.name} role {role.role}",
                      vendor_from_nodes=from_nodes[pool.name])
        shape = role.shape
        ceiling = graph_ceiling(shape.max_cudagraph_capture_size if shape else None,
                                shape.max_num_batched_tokens if shape else None, CATALOG.get(pool.gpu_product or ""))
        cold = predict_cold_start(how.pod_read_bytes(role.layout, role.gpus_per_pod), ceiling, throughput)
        return dataclasses.replace(role, loading=how, cold_start=cold, timeouts=startup_timeouts(cold))

    return tuple(dataclasses.replace(pool, roles=tuple(one(pool, r) for r in pool.roles)) for pool in pools)


def with_vision_encoders(engine: EngineSettings, pools: tuple[PoolPlan, ...]) -> tuple[PoolPlan, ...]:
    """Each role's vision-encoder mode (vision.py), from its tensor size and the image limit."""
    images = dict(engine.mm_limits).get("image")
    return tuple(dataclasses.replace(pool, roles=tuple(
        dataclasses.replace(r, vision_encoder=vision_encoder(r.layout.tensor, images)) for r in pool.roles))
        for pool in pools)


def pool_interconnect(gpu: GpuSpec, fabric: Fabric, roles: tuple[RolePlan, ...]) -> str:
    """The fabric inside the pool's largest replica."""
    widest = max((r.layout.gpus for r in roles), default=0)
    return gpu.interconnect if widest <= fabric.nvlink_gpus else "RDMA"


def plan_role(pool: Pool, name: str, role: Role, fabric: Fabric, disaggregated: bool,
              mem: MemoryInputs, tensor: int | None = None) -> RolePlan:
    where = f"pool {pool.name} role {name}"
    try:
        if role.parallelism is None:
            layout = choose_layout(name, fabric, mem, tensor)
        else:
            p = role.parallelism
            layout = Layout(tensor=p.tensor, pipeline=p.pipeline, data=p.data, expert=p.expert)
            check_layout(name, disaggregated, layout, fabric, mem)
        crosses_rdma = layout.gpus > fabric.nvlink_gpus
        all2all, moe = choose_backends(fabric.gpu, layout, fabric.nvlink_gpus,
                                       pool.backends.all2all if pool.backends else None,
                                       pool.backends.moe if pool.backends else None)
    except PlanningError as exc:
        raise PlanningError(exc.reason, f"{where}: {exc.message}", depends_on_nodes=exc.depends_on_nodes) from exc
    node = fabric.gpus_per_node
    nodes = max(1, layout.gpus // node)
    multi_node_nvlink = nodes > 1 and not crosses_rdma
    return RolePlan(
        role=name,  # type: ignore[arg-type]
        replicas=role.replicas or 0,  # omitted: filled in by assign_replicas
        layout=layout,
        gpus_per_pod=min(layout.gpus, node),
        nodes_per_replica=nodes,
        all2all_backend=all2all,
        moe_backend=moe,
        expert_dispatch=expert_dispatch(layout, all2all, moe),
        compute_domain=multi_node_nvlink,
        group_topology_key=CLIQUE_LABEL if multi_node_nvlink else None,
        crosses_rdma=crosses_rdma,
    )


def compat_hash(engine: EngineSettings, pools: tuple[PoolPlan, ...] = ()) -> str:
    """Hash of the settings prefill and decode must agree on to hand over KV and KDA state, and of
    the images the paired roles run: vLLM's own NIXL handshake hashes its version with the model
    config and refuses a peer whose hash differs (docs/vllm-facts.md §0 item 5), so a new serving image
    is a new revision, rolled with the hold, never a prefill of one version handed to a decode of
    another. An aggregated pool's image pairs with nothing and stays out. So is a change of any
    paired role's KV block (its tensor size): the handshake compares how each side cuts its block
    (handoff.py), and an old prefill of another block would be refused by every new decode."""
    contract = engine.pd_contract()
    images = sorted({pool.image for pool in pools if any(role.role in PAIRED for role in pool.roles)})
    if images:
        contract["images"] = images
    blocks = sorted([pool.name, role.role, role.block_size] for pool in pools for role in pool.roles
                    if role.role in PAIRED and role.block_size)
    if blocks:
        contract["kv_blocks"] = blocks
    return hashlib.sha256(json.dumps(contract, sort_keys=True).encode()).hexdigest()[:16]
