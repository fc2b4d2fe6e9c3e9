"""KimiK3Deployment v1alpha1: the resource's identity (group, version, kind, names) and the whole
object as the API server holds it. Its spec is spec.py, its status status.py."""

from __future__ import annotations

from ..contract.names import GROUP
from .base import StatusModel
from .meta import ObjectMeta
from .spec import KimiK3DeploymentSpec
from .status import KimiK3DeploymentStatus

VERSION = "v1alpha1"
KIND = "KimiK3Deployment"
PLURAL = "kimik3deployments"
SINGULAR = "kimik3deployment"
SHORT_NAMES = ("k3",)


class KimiK3Deployment(StatusModel):
    """The whole resource as read from the API server."""

    api_version: str = f"{GROUP}/{VERSION}"
    kind: str = KIND
    metadata: ObjectMeta
    spec: KimiK3DeploymentSpec
    status: KimiK3DeploymentStatus | None = None
