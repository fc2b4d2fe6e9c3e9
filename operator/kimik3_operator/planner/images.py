"""Default serving images, pinned to vLLM 0.33.0, chosen per GPU vendor.

The CUDA image is one multi-arch tag (amd64 for HGX, arm64 for Grace trays); MI355X pools
need the ROCm build.
"""

from __future__ import annotations

from .catalog import GpuSpec

IMAGE_REPOSITORY = "ghcr.io/kimik3-operator"
VLLM_VERSION = "0.33.0"
CUDA_IMAGE = f"{IMAGE_REPOSITORY}/vllm-serving:{VLLM_VERSION}-cuda"
ROCM_IMAGE = f"{IMAGE_REPOSITORY}/vllm-serving:{VLLM_VERSION}-rocm"


def serving_image(gpu: GpuSpec | None) -> str:
    return ROCM_IMAGE if gpu is not None and gpu.vendor == "amd" else CUDA_IMAGE
