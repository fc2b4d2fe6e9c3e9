"""What the planner knows about each GPU product, and how node labels name them.

Per-GPU figures come from vendor datasheets and AIConfigurator's system files, collected in
reference/perf-model.md §1. `usable_mib` is what `nvidia-smi` (or rocm-smi) reports, which is
also what GPU Feature Discovery publishes as `nvidia.com/gpu.memory`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Vendor = Literal["nvidia", "amd"]
Generation = Literal["hopper", "blackwell", "cdna4"]

MIB = 1 << 20


@dataclass(frozen=True)
class GpuSpec:
    product: str
    vendor: Vendor
    generation: Generation
    compute_capability: tuple[int, int] | None
    """CUDA SM version (10.3 = Blackwell Ultra); None for AMD."""
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
    """Typical RDMA bandwidth per GPU, GB/s (one NIC per GPU)."""

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

    @property
    def interconnect(self) -> str:
        """Fabric between the GPUs of one node."""
        return "xGMI" if self.vendor == "amd" else "NVLink"


CATALOG: dict[str, GpuSpec] = {
    spec.product: spec
    for spec in (
        GpuSpec("GB300", "nvidia", "blackwell", (10, 3), 284_208, 8.0, 2500, 5000, 72, 4, "arm64", 100),
        GpuSpec("GB200", "nvidia", "blackwell", (10, 0), 189_471, 8.0, 2500, 5000, 72, 4, "arm64", 50),
        GpuSpec("B300", "nvidia", "blackwell", (10, 3), 275_040, 7.75, 2250, 4500, 8, 8, "amd64", 100),
        GpuSpec("B200", "nvidia", "blackwell", (10, 0), 183_359, 7.7, 2250, 4500, 8, 8, "amd64", 50),
        GpuSpec("H200", "nvidia", "hopper", (9, 0), 143_771, 4.8, 990, 1980, 8, 8, "amd64", 50),
        GpuSpec("H100", "nvidia", "hopper", (9, 0), 81_559, 3.35, 990, 1980, 8, 8, "amd64", 50),
        GpuSpec("MI355X", "amd", "cdna4", None, 294_896, 8.0, 2500, 5000, 8, 8, "amd64", 50),
    )
}


def product_from_label(value: str) -> str | None:
    """Map a GPU product label (e.g. `NVIDIA-GB300`, `NVIDIA-H100-80GB-HBM3`,
    `AMD_Instinct_MI355X`) to a catalog product, or None when it names none of them.

    Longest names are tried first so `GB300` is not read as `B300`.
    """
    tokens = [t for t in value.upper().replace("_", "-").replace(".", "-").split("-") if t]
    for product in sorted(CATALOG, key=len, reverse=True):
        if any(t == product or t.startswith(product) for t in tokens):
            return product
    return None
