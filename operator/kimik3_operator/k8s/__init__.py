"""The only package that talks to the Kubernetes API server."""

from .cluster import (
    UNREACHABLE,
    ApplyResult,
    Cluster,
    MissingApiError,
    NoClusterError,
    RejectedApiError,
    TransientApiError,
    api_client,
    unchanged_since_our_apply,
)
from .lease import NotLeaderError, WriteGuard

__all__ = ["UNREACHABLE", "ApplyResult", "Cluster", "MissingApiError", "NoClusterError", "NotLeaderError",
           "RejectedApiError", "TransientApiError", "WriteGuard", "api_client", "unchanged_since_our_apply"]
