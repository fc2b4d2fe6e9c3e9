"""What the planner knows about each GPU product, and how node labels name them.

Per-GPU figures come from vendor datasheets and AIConfigurator's system files, collected in
docs/perf-model.md §1. `usable_mib` is what `nvidia-smi` (or rocm-smi) reports, which is
also what GPU Feature Discovery publishes as `nvidia.com/gpu.memory`. The catalog has exactly one
row per `GpuProduct` the API accepts (besides Auto); a test holds the two lists together.
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
        GpuSpec(product="GB300", vendor="nvidia", generation="blackwell", usable_mib=284_208, hbm_tb_s=8.0,
                bf16_tflops=2500, fp8_tflops=5000, nvlink_domain=72, gpus_per_node=4, arch="arm64", nic_gb_s=100),
        GpuSpec(product="GB200", vendor="nvidia", generation="blackwell", usable_mib=189_471, hbm_tb_s=8.0,
                bf16_tflops=2500, fp8_tflops=5000, nvlink_domain=72, gpus_per_node=4, arch="arm64", nic_gb_s=50),
        GpuSpec(product="B300", vendor="nvidia", generation="blackwell", usable_mib=275_040, hbm_tb_s=7.75,
                bf16_tflops=2250, fp8_tflops=4500, nvlink_domain=8, gpus_per_node=8, arch="amd64", nic_gb_s=100),
        GpuSpec(product="B200", vendor="nvidia", generation="blackwell", usable_mib=183_359, hbm_tb_s=7.7,
                bf16_tflops=2250, fp8_tflops=4500, nvlink_domain=8, gpus_per_node=8, arch="amd64", nic_gb_s=50),
        GpuSpec(product="H200", vendor="nvidia", generation="hopper", usable_mib=143_771, hbm_tb_s=4.8,
                bf16_tflops=990, fp8_tflops=1980, nvlink_domain=8, gpus_per_node=8, arch="amd64", nic_gb_s=50),
        GpuSpec(product="H100", vendor="nvidia", generation="hopper", usable_mib=81_559, hbm_tb_s=3.35,
                bf16_tflops=990, fp8_tflops=1980, nvlink_domain=8, gpus_per_node=8, arch="amd64", nic_gb_s=50),
        GpuSpec(product="MI355X", vendor="amd", generation="cdna4", usable_mib=294_896, hbm_tb_s=8.0,
                bf16_tflops=2500, fp8_tflops=5000, nvlink_domain=8, gpus_per_node=8, arch="amd64", nic_gb_s=50),
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
