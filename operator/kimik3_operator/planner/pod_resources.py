"""CPU, memory and ephemeral storage of a serving pod: its GPU share of the node, less a reserve.

A serving pod that requests only GPUs is BestEffort: under memory pressure the kubelet evicts it
first, while it holds 1.5 TB of weights in page cache and pinned buffers. Each pod gets the node's
allocatable times the share of the node's GPUs it holds (4 of 8 GPUs: half), after a reserve per
node for what else runs there (the GPU and network operators' DaemonSets, CNI, node exporters,
log shippers). Requests equal limits for every resource, so the pod is Guaranteed: the kubelet
evicts it last, the kernel's OOM killer picks it last (oom_score_adj -997), and under the static CPU
manager policy it gets whole, exclusive cores (NUMA-aligned with its GPUs under the topology
manager), which the NCCL/NIXL proxy threads want. llm-d's wide-EP guide sets memory and
ephemeral-storage requests equal to limits but no CPU limit (Burstable;
llm-d/llm-d guides/wide-ep-lws/manifests/modelserver/base/decode.yaml): the same eviction
protection in practice, no exclusive cores. We take the CPU limit too, because a serving pod here
already holds its whole GPU share of the node's cores, so the limit never binds below what the
node could give it.

Where the nodes are not known (`kimik3 plan` without a cluster, a pool planned ahead of its nodes)
the figures are the product's usual node (`NODE_SHAPES`); the nodes' own allocatable wins as soon
as the planner sees them. `pools[].resources` overrides any of the three.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from ..gpus import GPUS

GIB = 1 << 30


@dataclass(frozen=True)
class NodeShape:
    """What one node offers pods: cores, memory and local ephemeral storage (bytes)."""

    cpu_millis: int
    memory_bytes: int
    ephemeral_bytes: int | None = None
    source: str = "nodes"
    """`nodes` (the smallest allocatable among the pool's nodes) or `catalog` (NODE_SHAPES)."""


def _catalog(cores: int, memory_gib: int) -> NodeShape:
    return NodeShape(cpu_millis=cores * 1000, memory_bytes=memory_gib * GIB, source="catalog")


NODE_SHAPES: dict[str, NodeShape] = {g.product: _catalog(g.node_cores, g.node_memory_gib) for g in GPUS}
"""The usual node of each GPU product (the table's node_cores and node_memory_gib, sources cited there)."""

DEFAULT_SHAPE = _catalog(112, 1862)
"""An unknown product (gpu.product Auto before any node is seen): an 8-GPU HGX-class node."""

RESERVE_FRACTION = Decimal("0.08")
RESERVE_MIN_CPU_MILLIS = 2000
RESERVE_MIN_MEMORY_BYTES = 16 * GIB
"""Kept back per node before the GPU share is taken: 8% (at least 2 cores and 16 GiB). Allocatable
already excludes kube- and system-reserved; this is for the DaemonSets of a GPU node (device
plugin, DCGM exporter, GPU feature discovery, network operator, CNI, node exporter), which GKE and
EKS GPU nodes run at 1-3 cores and 5-15 GiB together. From catalog figures (capacity, not
allocatable) the same 8% also covers what the kubelet reserves for itself."""

EPHEMERAL_CAP_BYTES = 200 * GIB
"""What a serving container writes outside its volumes: its logs, /tmp, Python and NCCL scratch
(the weights and compile caches are on claims, /dev/shm is memory). Capped so a 30 TB NVMe node
does not hand a pod a meaningless 15 TB limit."""


@dataclass(frozen=True)
class PodResources:
    cpu: str
    memory: str
    ephemeral_storage: str
    source: str
    """nodes | catalog | spec: where the figures came from (status and `kimik3 plan` show it)."""

    def amounts(self) -> dict[str, str]:
        return {"cpu": self.cpu, "memory": self.memory, "ephemeral-storage": self.ephemeral_storage}


def node_shape(product: str | None, allocatable: NodeShape | None) -> NodeShape:
    """The nodes' own allocatable when known, else the product's usual node."""
    if allocatable is not None and allocatable.cpu_millis > 0 and allocatable.memory_bytes > 0:
        return allocatable
    return NODE_SHAPES.get(product or "", DEFAULT_SHAPE)


def _after_reserve(total: int, minimum: int) -> int:
    return max(0, total - max(minimum, int(total * RESERVE_FRACTION)))


def serving_resources(node: NodeShape, gpus_per_node: int, gpus_per_pod: int,
                      cpu: str | None = None, memory: str | None = None,
                      ephemeral_storage: str | None = None) -> PodResources:
    """The pod's share of `node`, whole cores and whole GiB, unless the spec gave a figure."""
    share = Decimal(min(gpus_per_pod, gpus_per_node)) / Decimal(max(gpus_per_node, 1))
    cores = max(1, int(_after_reserve(node.cpu_millis, RESERVE_MIN_CPU_MILLIS) * share) // 1000)
    memory_gib = max(1, int(_after_reserve(node.memory_bytes, RESERVE_MIN_MEMORY_BYTES) * share) // GIB)
    disk = EPHEMERAL_CAP_BYTES
    if node.ephemeral_bytes:
        disk = min(disk, int(_after_reserve(node.ephemeral_bytes, 0) * share))
    disk_gib = max(1, disk // GIB)
    given = (cpu, memory, ephemeral_storage)
    return PodResources(
        cpu=cpu or str(cores),
        memory=memory or f"{memory_gib}Gi",
        ephemeral_storage=ephemeral_storage or f"{disk_gib}Gi",
        source="spec" if all(given) else node.source + ("+spec" if any(given) else ""),
    )
