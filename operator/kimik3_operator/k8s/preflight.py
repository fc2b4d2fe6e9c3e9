"""Reads what `kimik3 preflight` judges (planner/preflight.py): the kinds the API server serves (its
discovery: /api/v1 and each group's versions), the nodes and the StorageClasses. Read-only: the
checker may run as any user who can list nodes and storage classes."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ..planner.preflight import ClusterView
from .cluster import UNREACHABLE
from .informer import raw_get

TIMEOUT = 30.0


def _get(api: client.ApiClient, path: str) -> Any:
    return json.loads(raw_get(api, path, [], TIMEOUT).data)


def served_kinds(api: client.ApiClient) -> frozenset[tuple[str, str]]:
    """(apiVersion, kind) of every top-level resource in every version of every group the API
    server serves (subresources aside)."""
    served = {("v1", r["kind"]) for r in _get(api, "/api/v1")["resources"] if "/" not in r["name"]}
    for group in _get(api, "/apis")["groups"]:
        for version in group["versions"]:
            listed = _get(api, f"/apis/{version['groupVersion']}")["resources"]
            served |= {(version["groupVersion"], r["kind"]) for r in listed if "/" not in r["name"]}
    return frozenset(served)


class ClusterUnreadable(Exception):
    """The API server could not be reached, or refused a read (its first line says why)."""


def cluster_view(api: client.ApiClient) -> ClusterView:
    try:
        return ClusterView(served=served_kinds(api), nodes=_get(api, "/api/v1/nodes")["items"],
                           storage_classes=_get(api, "/apis/storage.k8s.io/v1/storageclasses")["items"])
    except (*UNREACHABLE, ApiException) as exc:
        raise ClusterUnreadable((str(exc).splitlines() or [type(exc).__name__])[0]) from exc
