"""The KimiK3Deployment API: pydantic models that are the single source of truth for the CRD."""

from ..contract.names import GROUP
from .base import Rule, SpecModel, StatusModel, first_error
from .meta import Condition, ObjectMeta
from .spec import KimiK3DeploymentSpec, Parallelism, Pool, Role, RoleName
from .status import KimiK3DeploymentStatus, PoolStatus, RoleStatus
from .v1alpha1 import KIND, PLURAL, VERSION, KimiK3Deployment

__all__ = [
    "GROUP", "KIND", "PLURAL", "VERSION", "Condition", "KimiK3Deployment", "KimiK3DeploymentSpec",
    "KimiK3DeploymentStatus", "ObjectMeta", "Parallelism", "Pool", "PoolStatus", "Role", "RoleName",
    "RoleStatus", "Rule", "SpecModel", "StatusModel", "first_error",
]
