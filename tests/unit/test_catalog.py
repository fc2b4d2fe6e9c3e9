"""The GPU catalog and the API's GpuProduct list name the same products: a product the API
accepts without a catalog row would be a KeyError in the planner, a row the API cannot name dead.
Both derive from the GPU table (gpus.py); tests/unit/test_gpus.py checks the rest of it."""

from __future__ import annotations

from typing import get_args

from kimik3_operator.api.spec import GpuProduct
from kimik3_operator.planner.catalog import CATALOG


def test_every_api_gpu_product_has_one_catalog_row_and_every_row_a_product() -> None:
    assert get_args(GpuProduct) == ("Auto", *CATALOG)  # both derive from gpus.GPUS, in its order
    assert all(spec.product == name for name, spec in CATALOG.items())
