"""Node-pool facts: what the nodes a pool selects say about their GPUs and fabric.

Input is plain Node objects as the API server returns them (`kubectl get nodes -o yaml`), so
the same code serves the operator, `kimik3 plan --nodes` and table tests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..api.quantity import quantity
from .catalog import product_from_label
from .pod_resources import NodeShape

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
CLIQUE_LABEL = "nvidia.com/gpu.clique"
AMD_PRODUCT_LABELS = ("amd.com/gpu.product-name", "beta.amd.com/gpu.product-name")
PRODUCT_LABELS = (GPU_PRODUCT_LABEL, *AMD_PRODUCT_LABELS)
"""Where a node names its GPU; the values are matched exactly against the GPU table (gpus.py)."""
NVIDIA_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB, as GPU Feature Discovery publishes it
AMD_VRAM_LABELS = ("amd.com/gpu.vram", "beta.amd.com/gpu.vram")  # e.g. "192G" (GiB), AMD's node labeller
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
RDMA_RESOURCE_PREFIXES = ("rdma/", "nvidia.com/rdma", "mellanox.com/")


@dataclass(frozen=True)
class NodeFacts:
    name: str
    labels: Mapping[str, str]
    gpu_resource: str | None
    gpus: int
    product: str | None
    clique: str | None
    rdma_resources: Mapping[str, int]
    arch: str | None
    schedulable: bool
    memory_mib: int | None = None
    allocatable: NodeShape | None = None
    """CPU, memory and ephemeral storage the node offers pods; None when it reports none."""
    product_label: str | None = None
    """The GPU product label as the node carries it (`product` is None when it names no known GPU)."""
    gpu_taints: tuple[Mapping[str, str], ...] = ()
    """Its taints keyed by a GPU resource (`nvidia.com/gpu`, `amd.com/gpu`), in wire form."""


@dataclass(frozen=True)
class PoolFacts:
    """Summary of the nodes one pool selects."""

    nodes: tuple[NodeFacts, ...] = ()
    product: str | None = None
    """Catalog product most nodes carry, None when no node names a known GPU (labels match exactly)."""
    gpu_resource: str | None = None
    gpus_per_node: int | None = None
    """GPUs per node (the smallest count among the pool's nodes, so every pod fits anywhere)."""
    cliques: Mapping[str, int] = field(default_factory=dict)
    """NVLink clique id -> number of nodes in it (NVL72 racks)."""
    rdma_resource: str | None = None
    """An RDMA device resource every node advertises, if any."""
    rdma_per_node: int | None = None
    """Units of `rdma_resource` the nodes advertise (the smallest count)."""
    memory_mib: int | None = None
    """GPU memory the nodes' labels report (the smallest), when they report it."""
    arch: str | None = None
    """CPU architecture most nodes report (GB300/GB200 trays are arm64)."""
    allocatable: NodeShape | None = None
    """The smallest CPU, memory and ephemeral storage among the nodes (each on its own), so a pod
    sized from it fits on any of them; None when a node reports none."""
    unknown_labels: Mapping[str, int] = field(default_factory=dict)
    """GPU product label -> number of the pool's nodes carrying it, for labels that name no product
    of the GPU table (gpus.py). With gpu.product Auto the planner refuses the pool while any are
    there: those nodes would get pods sized for another GPU."""


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _memory_mib(labels: Mapping[str, str]) -> int | None:
    if labels.get(NVIDIA_MEMORY_LABEL, "").isdigit():
        return int(labels[NVIDIA_MEMORY_LABEL])
    vram = next((labels[k] for k in AMD_VRAM_LABELS if k in labels), "")
    if vram[:-1].isdigit() and vram[-1:].upper() == "G":
        return int(vram[:-1]) * 1024
    return None


def node_allocatable(allocatable: Mapping[str, Any]) -> NodeShape | None:
    """CPU, memory and ephemeral storage the node offers pods (`status.allocatable`)."""
    try:
        cpu = quantity(str(allocatable["cpu"]))
        memory = quantity(str(allocatable["memory"]))
        disk = quantity(str(allocatable["ephemeral-storage"])) if "ephemeral-storage" in allocatable else None
    except (KeyError, ValueError):
        return None
    if cpu <= 0 or memory <= 0:
        return None
    return NodeShape(cpu_millis=int(cpu * 1000), memory_bytes=int(memory),
                     ephemeral_bytes=int(disk) if disk else None)


def smallest(shapes: Sequence[NodeShape | None]) -> NodeShape | None:
    known = [s for s in shapes if s is not None]
    if not known or len(known) < len(shapes):
        return None
    disks = [s.ephemeral_bytes for s in known]
    return NodeShape(cpu_millis=min(s.cpu_millis for s in known), memory_bytes=min(s.memory_bytes for s in known),
                     ephemeral_bytes=None if None in disks else min(d for d in disks if d is not None))


def node_view(node: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a node that `node_facts` reads (and the identity a memo keys on). An informer
    keeps only these: a node's heartbeats, images and conditions change every few seconds on a large
    fleet, and would otherwise each look like a change to plan over again."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    spec: dict[str, Any] = {"unschedulable": True} if (node.get("spec") or {}).get("unschedulable") else {}
    if taints := _gpu_taints(node):
        spec["taints"] = list(taints)
    return {"apiVersion": node.get("apiVersion", "v1"), "kind": node.get("kind", "Node"),
            "metadata": {k: meta[k] for k in ("name", "uid", "resourceVersion", "labels") if k in meta},
            "spec": spec,
            "status": {k: status[k] for k in ("allocatable", "capacity") if k in status}}


def _gpu_taints(node: Mapping[str, Any]) -> tuple[Mapping[str, str], ...]:
    """The node's GPU taints only: the node controller's own (not-ready, unreachable) come and go
    with heartbeats and say nothing a plan needs."""
    return tuple({k: str(t[k]) for k in ("key", "value", "effect") if t.get(k)}
                 for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") in GPU_RESOURCES)


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    meta = node.get("metadata") or {}
    labels: dict[str, str] = dict(meta.get("labels") or {})
    status = node.get("status") or {}
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    gpu_resource = next((r for r in GPU_RESOURCES if _quantity(allocatable.get(r, 0)) > 0), None)
    product_label = labels.get(GPU_PRODUCT_LABEL) or next(
        (labels[k] for k in AMD_PRODUCT_LABELS if k in labels), None)
    rdma = {k: _quantity(v) for k, v in allocatable.items()
            if k.startswith(RDMA_RESOURCE_PREFIXES) and _quantity(v) > 0}
    spec = node.get("spec") or {}
    return NodeFacts(
        name=meta.get("name", ""),
        labels=labels,
        gpu_resource=gpu_resource,
        gpus=_quantity(allocatable.get(gpu_resource, 0)) if gpu_resource else 0,
        product=product_from_label(product_label) if product_label else None,
        clique=labels.get(CLIQUE_LABEL),
        rdma_resources=rdma,
        arch=labels.get("kubernetes.io/arch"),
        schedulable=not spec.get("unschedulable", False),
        memory_mib=_memory_mib(labels),
        allocatable=node_allocatable(allocatable),
        product_label=product_label,
        gpu_taints=_gpu_taints(node),
    )


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def pool_facts(selector: Mapping[str, str], nodes: Sequence[Mapping[str, Any]],
               facts_of: Callable[[Mapping[str, Any]], NodeFacts] = node_facts) -> PoolFacts:
    """Facts of the GPU nodes that `selector` picks (nodes without GPUs are ignored). `facts_of`
    may remember each node's facts between passes (reconcile's NodeFactsMemo): the selector is
    checked on the raw labels first, so unpicked nodes cost a label lookup, not their facts."""
    candidates = (n for n in nodes if selects(selector, (n.get("metadata") or {}).get("labels") or {}))
    picked = tuple(f for f in map(facts_of, candidates) if f.gpu_resource and f.schedulable)
    if not picked:
        return PoolFacts()
    products = Counter(f.product for f in picked if f.product)
    rdma_common = set.intersection(*(set(f.rdma_resources) for f in picked))
    return PoolFacts(
        nodes=picked,
        product=products.most_common(1)[0][0] if products else None,
        gpu_resource=Counter(f.gpu_resource for f in picked).most_common(1)[0][0],
        gpus_per_node=min(f.gpus for f in picked),
        cliques=dict(Counter(f.clique for f in picked if f.clique)),
        rdma_resource=min(rdma_common) if rdma_common else None,
        rdma_per_node=min(f.rdma_resources[min(rdma_common)] for f in picked) if rdma_common else None,
        memory_mib=min((f.memory_mib for f in picked if f.memory_mib), default=None),
        arch=Counter(f.arch for f in picked if f.arch).most_common(1)[0][0] if any(f.arch for f in picked) else None,
        allocatable=smallest([f.allocatable for f in picked]),
        unknown_labels=dict(Counter(f.product_label for f in picked if f.product_label and not f.product)),
    )
