"""What the planner knows about each GPU product, and how node labels name them: the planner's view
of the one GPU table, `kimik3_operator/gpus.py` (figures, fabric, usual node and label spellings
live there, one row per product; the API's `GpuProduct` enum is derived from the same rows)."""

from __future__ import annotations

from ..gpus import (
    BY_PRODUCT,
    MIB,
    Generation,
    GpuSpec,
    Vendor,
    closest_labels,
    product_from_label,
)

CATALOG: dict[str, GpuSpec] = dict(BY_PRODUCT)
"""Product -> its row, in the table's order."""

__all__ = ["CATALOG", "MIB", "Generation", "GpuSpec", "Vendor", "closest_labels", "product_from_label"]
