"""Names, labels, owner references and the desired-state hash every child carries.

LeaderWorkerSet derives StatefulSet and pod names and a `controller-revision-hash` label from
its own name, so LWS names stay at most 45 characters; longer `<cr>-<pool>-<role>` names are cut
and get a stable hash suffix so two long names never collide.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ..api import GROUP, KIND, VERSION
from ..contract.names import ANNOTATION_HASH, MANAGED_BY_LABEL
from ..contract.names import LABEL_DEPLOYMENT as LABEL_DEPLOYMENT
from ..contract.names import MANAGED_BY as MANAGED_BY

LABEL_POOL = f"{GROUP}/pool"
LABEL_ROLE = f"{GROUP}/role"
LABEL_COMPAT = f"{GROUP}/compat-hash"
LABEL_ROUTER = f"{GROUP}/router"
MAX_WORKLOAD_NAME = 45
MAX_LABEL_VALUE = 63


@dataclass(frozen=True)
class Owner:
    """The KimiK3Deployment that owns every child."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def short_hash(text: str, length: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def bounded(name: str, limit: int) -> str:
    """`name` if it fits in `limit`, else a prefix plus a hash of the whole name."""
    if len(name) <= limit:
        return name
    suffix = short_hash(name)
    return f"{name[: limit - len(suffix) - 1].rstrip('-')}-{suffix}"


def workload_name(owner: Owner, pool: str, role: str) -> str:
    return bounded(f"{owner.name}-{pool}-{role}", MAX_WORKLOAD_NAME)


def service_name(owner: Owner, pool: str, role: str) -> str:
    # LWS already creates a headless Service named after the LWS; ours fronts the leaders.
    return f"{workload_name(owner, pool, role)}-leader"


def router_name(owner: Owner, suffix: str = "") -> str:
    """Its Deployment's and its Service's name (a Service name is a 63-character DNS label), and
    the value of LABEL_ROUTER on its pods."""
    return bounded(f"{owner.name}-router{suffix}", MAX_LABEL_VALUE)


def deployment_label(owner: Owner) -> str:
    """The value of LABEL_DEPLOYMENT on every child (and pod) of `owner`."""
    return bounded(owner.name, MAX_LABEL_VALUE)


def labels(owner: Owner, pool: str | None = None, role: str | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": "kimi-k3",
        "app.kubernetes.io/instance": deployment_label(owner),
        MANAGED_BY_LABEL: MANAGED_BY,
        "app.kubernetes.io/part-of": "kimik3",
        LABEL_DEPLOYMENT: deployment_label(owner),
    }
    if role is not None:
        out["app.kubernetes.io/component"] = role
        out[LABEL_ROLE] = role
    if pool is not None:
        out[LABEL_POOL] = pool
    return out


def owned_labels(owner: Owner) -> dict[str, str]:
    """The labels that select every child (and pod) of one deployment, and nothing else."""
    return {MANAGED_BY_LABEL: MANAGED_BY, LABEL_DEPLOYMENT: deployment_label(owner)}


def object_meta(owner: Owner, name: str, pool: str | None, role: str | None) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner, pool, role),
        "ownerReferences": [owner.reference()],
    }


def desired_hash(obj: dict[str, Any]) -> str:
    """Hash of a rendered object, minus the annotation that will carry it."""
    meta = dict(obj.get("metadata", {}))
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != ANNOTATION_HASH}
    meta["annotations"] = annotations
    canonical = json.dumps({**obj, "metadata": meta}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def stamp_hash(obj: dict[str, Any]) -> dict[str, Any]:
    """Return `obj` with its desired-hash annotation set (apply is skipped while it matches)."""
    meta = dict(obj["metadata"])
    meta["annotations"] = {**(meta.get("annotations") or {}), ANNOTATION_HASH: desired_hash(obj)}
    return {**obj, "metadata": meta}
