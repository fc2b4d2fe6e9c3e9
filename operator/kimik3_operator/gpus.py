"""The GPU products Kimi K3 is planned for: one row each, and the node labels that name them.

This table is the one place a GPU product is spelled. The API's `gpu.product` enum (and so the CRD),
its xGMI/NVLink rules, the planner's catalog, a pod's size before its nodes are seen and the lookup
of node labels are all derived from it; adding a product is one row here plus a regenerated CRD
(`kimik3 crd`, then the chart copy and manifests/install.yaml). docs/decisions/gpu-table.md says why.

Per-GPU figures come from vendor datasheets and AIConfigurator's system files, collected in
docs/perf-model.md §1. `usable_mib` is what `nvidia-smi` (or rocm-smi) reports, which is also
what GPU Feature Discovery publishes as `nvidia.com/gpu.memory`.

Node labels match exactly (ignoring case): `labels` lists every spelling of `nvidia.com/gpu.product`
(GPU Feature Discovery) or `amd.com/gpu.product-name` (AMD's node labeller) that names the product.
A label that is not listed names no product, however close it looks: `NVIDIA-H200-NVL` is a
different part from `NVIDIA-H200` (another memory, bandwidth and NVLink domain), and reading it as
one would plan the wrong memory. The planner refuses such nodes and names the nearest spellings.

Standard library only (an import-linter contract holds it): the API layer imports it.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Literal

Vendor = Literal["nvidia", "amd"]
Generation = Literal["hopper", "blackwell", "cdna4"]
Fabric = Literal["NVLink", "xGMI"]

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class GpuSpec:
    product: str
    """The name in `pools[].gpu.product` and in status."""
    vendor: Vendor
    generation: Generation
    interconnect: Fabric
    """Fabric between the GPUs of one scale-up domain (the node, or an NVL72 rack's clique)."""
    usable_mib: int
    """HBM the driver reports per GPU."""
    hbm_tb_s: float
    """HBM bandwidth per GPU, TB/s."""
    bf16_tflops: float
    fp8_tflops: float
    nvlink_domain: int
    """GPUs in one scale-up (NVLink/xGMI) domain: 72 on NVL72 racks, 8 on HGX/OAM boards."""
    gpus_per_node: int
    """Typical GPUs per node (4 per Grace tray, 8 per HGX board)."""
    arch: Literal["amd64", "arm64"]
    nic_gb_s: float
    """Typical RDMA bandwidth per GPU, GB/s (one NIC per GPU): what a P/D KV hand-off moves at."""
    node_cores: int
    """CPU cores of the product's usual node: a pod's size before the planner sees the nodes."""
    node_memory_gib: int
    """Memory of the product's usual node, GiB (capacity; the nodes' allocatable wins once seen)."""
    labels: tuple[str, ...]
    """Every node-label value that names this product, exactly (compared ignoring case)."""
    compute_capability: tuple[int, int] | None = None
    """CUDA compute capability (major, minor); None off CUDA. vLLM picks the MLA attention backend by
    its major (platforms/cuda.py), which fixes the kernel block a P/D hand-off is cut into."""

    @property
    def usable_bytes(self) -> int:
        return self.usable_mib * MIB

    @property
    def blackwell(self) -> bool:
        return self.generation == "blackwell"

    @property
    def multi_node_nvlink(self) -> bool:
        """An NVLink domain larger than one node: NVL72 trays (clique label, ComputeDomain)."""
        return self.nvlink_domain > self.gpus_per_node


# Node shapes (node_cores, node_memory_gib):
# - GB300/GB200 NVL72 compute tray: 4 GPUs and 2 Grace CPUs (72 Neoverse V2 cores and up to 480 GB
#   LPDDR5X each: 36 Grace, 2,592 cores, 17 TB per rack). NVIDIA Enterprise RA, "NVIDIA GB300 NVL
#   Compute Tray" (docs.nvidia.com/enterprise-reference-architectures/nvl72-ai-factory/latest/
#   components.html). 960 GB = 894 GiB.
# - DGX B200: 2 x Xeon Platinum 8570, 56 cores each; 2 TB DIMMs (DGX B200 user guide, "Hardware
#   Overview"). DGX H100/H200: 2 x Xeon Platinum 8480C, 56 cores each; 2 TB. DGX B300: 2 x Xeon
#   6776P, 64 cores each; 2 TB. 2 TB = 1,862 GiB.
# - 8 x MI355X OAM platforms (OEM, liquid-cooled): dual EPYC 9005; we assume 2 x 64 cores and 2 TB,
#   the low end of what those systems ship with (no single reference design to cite), so a pod
#   planned from it still fits a larger node.
# Labels: what GPU Feature Discovery and AMD's labeller publish, plus the bare `NVIDIA-<product>`
# that hand-labelled and simulated nodes (kwok, bench) carry.
# The row order is the order of the API's enum (and so of the CRD): append new rows, or the CRD's
# enum reorders.
GPUS: tuple[GpuSpec, ...] = (
    GpuSpec(product="GB300", vendor="nvidia", generation="blackwell", interconnect="NVLink", usable_mib=284_208,
            hbm_tb_s=8.0, bf16_tflops=2500, fp8_tflops=5000, nvlink_domain=72, gpus_per_node=4, arch="arm64",
            nic_gb_s=100, node_cores=144, node_memory_gib=894,
            labels=("NVIDIA-GB300",), compute_capability=(10, 3)),
    GpuSpec(product="B300", vendor="nvidia", generation="blackwell", interconnect="NVLink", usable_mib=275_040,
            hbm_tb_s=7.75, bf16_tflops=2250, fp8_tflops=4500, nvlink_domain=8, gpus_per_node=8, arch="amd64",
            nic_gb_s=100, node_cores=128, node_memory_gib=1862,
            labels=("NVIDIA-B300-SXM6-AC", "NVIDIA-B300"), compute_capability=(10, 3)),
    GpuSpec(product="GB200", vendor="nvidia", generation="blackwell", interconnect="NVLink", usable_mib=189_471,
            hbm_tb_s=8.0, bf16_tflops=2500, fp8_tflops=5000, nvlink_domain=72, gpus_per_node=4, arch="arm64",
            nic_gb_s=50, node_cores=144, node_memory_gib=894,
            labels=("NVIDIA-GB200",), compute_capability=(10, 0)),
    GpuSpec(product="B200", vendor="nvidia", generation="blackwell", interconnect="NVLink", usable_mib=183_359,
            hbm_tb_s=7.7, bf16_tflops=2250, fp8_tflops=4500, nvlink_domain=8, gpus_per_node=8, arch="amd64",
            nic_gb_s=50, node_cores=112, node_memory_gib=1862,
            labels=("NVIDIA-B200",), compute_capability=(10, 0)),
    # H200 SXM; the H200 NVL (`NVIDIA-H200-NVL`) is another part
    GpuSpec(product="H200", vendor="nvidia", generation="hopper", interconnect="NVLink", usable_mib=143_771,
            hbm_tb_s=4.8, bf16_tflops=990, fp8_tflops=1980, nvlink_domain=8, gpus_per_node=8, arch="amd64",
            nic_gb_s=50, node_cores=112, node_memory_gib=1862,
            labels=("NVIDIA-H200",), compute_capability=(9, 0)),
    # SXM5; not H100 PCIe or NVL
    GpuSpec(product="H100", vendor="nvidia", generation="hopper", interconnect="NVLink", usable_mib=81_559,
            hbm_tb_s=3.35, bf16_tflops=990, fp8_tflops=1980, nvlink_domain=8, gpus_per_node=8, arch="amd64",
            nic_gb_s=50, node_cores=112, node_memory_gib=1862,
            labels=("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100"), compute_capability=(9, 0)),
    GpuSpec(product="MI355X", vendor="amd", generation="cdna4", interconnect="xGMI", usable_mib=294_896,
            hbm_tb_s=8.0, bf16_tflops=2500, fp8_tflops=5000, nvlink_domain=8, gpus_per_node=8, arch="amd64",
            nic_gb_s=50, node_cores=128, node_memory_gib=1862,
            labels=("AMD_Instinct_MI355X_OAM", "AMD_Instinct_MI355X")),
)

PRODUCTS: tuple[str, ...] = tuple(g.product for g in GPUS)
"""Every product, in the table's order (the API enum's order after Auto)."""

BY_PRODUCT: dict[str, GpuSpec] = {g.product: g for g in GPUS}

LABELS: dict[str, str] = {label: g.product for g in GPUS for label in g.labels}
"""Node-label value, as spelled in the table -> product."""

_BY_FOLDED_LABEL: dict[str, str] = {label.casefold(): label for label in LABELS}


def _check_table() -> None:
    """Import-time guard: a duplicate product or label (even differing only in case) would make the
    lookup ambiguous; a test also runs it."""
    if len(BY_PRODUCT) != len(GPUS):
        raise ValueError("gpus.GPUS: a product has two rows")
    spellings = [label.casefold() for g in GPUS for label in g.labels]
    if len(set(spellings)) != len(spellings) or any(not g.labels for g in GPUS):
        raise ValueError("gpus.GPUS: every row needs labels, and no label may name two rows")


_check_table()


def product_from_label(value: str) -> str | None:
    """The product a node label names (`NVIDIA-GB300`, `NVIDIA-H100-80GB-HBM3`,
    `AMD_Instinct_MI355X`), or None. Exact, ignoring case: `NVIDIA-B200A` or `NVIDIA-H200-NVL`
    name no product here, they are not rounded to `B200` or `H200`."""
    label = _BY_FOLDED_LABEL.get(value.strip().casefold())
    return LABELS[label] if label else None


def closest_labels(value: str, n: int = 3) -> list[str]:
    """The known label spellings nearest to `value` (difflib), best first; empty when none is close."""
    folded = difflib.get_close_matches(value.strip().casefold(), list(_BY_FOLDED_LABEL), n=n, cutoff=0.6)
    return [_BY_FOLDED_LABEL[f] for f in folded]


def products_with(interconnect: Fabric) -> tuple[str, ...]:
    """The products whose scale-up fabric is `interconnect`, in the table's order."""
    return tuple(g.product for g in GPUS if g.interconnect == interconnect)
