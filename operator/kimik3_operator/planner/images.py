"""The project's images, pinned: the serving images the renderer emits (vLLM 0.33.0, chosen per GPU
vendor), the router and the operator itself. Built from images/ (images/README.md); every reference
here has an exact tag, which tests/images checks.

The CUDA image is one multi-arch tag (amd64 for HGX, arm64 for Grace trays); MI355X pools
need the ROCm build.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import __version__
from .catalog import GpuSpec

IMAGE_REPOSITORY = "ghcr.io/kimik3-operator"
VLLM_VERSION = "0.33.0"
CUDA_IMAGE = f"{IMAGE_REPOSITORY}/vllm-serving:{VLLM_VERSION}-cuda"
ROCM_IMAGE = f"{IMAGE_REPOSITORY}/vllm-serving:{VLLM_VERSION}-rocm"
# The project's router (router/, images/router), tagged with the operator's version; and vLLM's
# (PyPI vllm-router, images/vllm-router), tagged with its own, the fallback of spec.router.implementation.
ROUTER_IMAGE = f"{IMAGE_REPOSITORY}/kimik3-router:{__version__}"
VLLM_ROUTER_VERSION = "0.1.17"
VLLM_ROUTER_IMAGE = f"{IMAGE_REPOSITORY}/vllm-router:{VLLM_ROUTER_VERSION}"
# The operator, tagged with the package version it was built from (images/operator); the chart's
# default (image.repository, tag = appVersion).
OPERATOR_IMAGE = f"{IMAGE_REPOSITORY}/kimik3-operator:{__version__}"


def serving_image(gpu: GpuSpec | None) -> str:
    return ROCM_IMAGE if gpu is not None and gpu.vendor == "amd" else CUDA_IMAGE


@dataclass(frozen=True)
class RouterImages:
    """The router pods' images where a deployment names none (spec.router.image): the operator's
    setting (the chart's routerImages: a mirror, or a release's digests, docs/release.md), else the
    project's tags. Router images stay out of the compatibility hash: a new router rolls the router
    pods only, never an engine."""

    kimik3_router: str = ROUTER_IMAGE
    vllm_router: str = VLLM_ROUTER_IMAGE


PROJECT_ROUTER_IMAGES = RouterImages()


def router_image(implementation: str, defaults: RouterImages = PROJECT_ROUTER_IMAGES) -> str:
    """The router pod's image (its front's too: both images carry HAProxy) for spec.router.implementation."""
    return defaults.vllm_router if implementation == "VllmRouter" else defaults.kimik3_router
