"""What the planner knows about each GPU product, and how node labels name them.

Figures are per GPU from vendor datasheets (reference/perf-model.md §1). The planner issue
extends the catalog; the walking skeleton uses it to resolve `Auto` to a visible product.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Vendor = Literal["nvidia", "amd"]
Generation = Literal["hopper", "blackwell", "cdna4"]


@dataclass(frozen=True)
class GpuSpec:
    product: str
    vendor: Vendor
    generation: Generation
    hbm_gib: int
    nvl72: bool
    """Trays of an NVL72 rack: one NVLink domain spans nodes (clique label, ComputeDomain)."""
    arch: Literal["amd64", "arm64"]


CATALOG: dict[str, GpuSpec] = {
    spec.product: spec
    for spec in (
        GpuSpec("GB300", "nvidia", "blackwell", 288, True, "arm64"),
        GpuSpec("GB200", "nvidia", "blackwell", 186, True, "arm64"),
        GpuSpec("B300", "nvidia", "blackwell", 288, False, "amd64"),
        GpuSpec("B200", "nvidia", "blackwell", 180, False, "amd64"),
        GpuSpec("H200", "nvidia", "hopper", 141, False, "amd64"),
        GpuSpec("H100", "nvidia", "hopper", 80, False, "amd64"),
        GpuSpec("MI355X", "amd", "cdna4", 288, False, "amd64"),
    )
}


def product_from_label(value: str) -> str | None:
    """Map a GPU Feature Discovery product label (e.g. `NVIDIA-GB300`, `NVIDIA-H100-80GB-HBM3`,
    `AMD_Instinct_MI355X`) to a catalog product, or None when it names none of them.

    Longest names are tried first so `GB300` is not read as `B300`.
    """
    upper = value.upper().replace("_", "-")
    tokens = [t for t in upper.replace(".", "-").split("-") if t]
    for product in sorted(CATALOG, key=len, reverse=True):
        if product in tokens or any(t.startswith(product) for t in tokens):
            return product
    return None
