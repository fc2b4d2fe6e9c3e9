"""What a reconcile pass reads, held current by one informer per kind (informer.py).

Why informers of our own rather than kopf indexes: a pass runs on the resync worker, outside any
kopf handler, where kopf's indexes are not handed over; an index also cannot tell a pass that a
relist after a watch gap dropped an object. One informer per kind (per watched namespace for the
children, whose rights may be a Role per namespace) gives the pass a consistent view, the relist
diff, and write-through of our own writes, in ~250 lines on the kubernetes client.

The kinds: the KimiK3Deployments (resync keys, bodies), nodes (planning facts), every namespace's
pods that hold resources (GPU capacity: a field selector keeps finished pods out), this operator's
own pods in every phase (a staging pod's termination message outlives its run), and every child
kind, selected by the managed-by label and indexed by deployment. Each is kept as the view its
readers define (node_view, pod_gpu_view, own_pod_view, child_view): a fraction of its size, and
an event that changes nothing of the view, as a node heartbeat, leaves the store (and the facts
memo keyed on the node store's revision) as it was. Events of the child kinds the registry flags
`watched` start a pass of their owner (`on_child`), after the store took them in, so that pass sees
the change that triggered it.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client import rest
from kubernetes.dynamic import DynamicClient

from ..api import GROUP, KIND, VERSION
from ..contract.kinds import BY_KIND, CHILD_KINDS, ChildKind
from ..contract.names import LABEL_DEPLOYMENT, MANAGED_BY, MANAGED_BY_LABEL
from ..planner.capacity import pod_gpu_view
from ..planner.facts import node_view
from .informer import Informer, Key, Watched, key_of
from .managed_fields import fields_text

log = logging.getLogger(__name__)

ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
OURS = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
SYNC_SECONDS = 60.0
"""How long a pass waits for the first lists before it gives up (retried like an API error)."""


class CacheNotSynced(Exception):
    """A pass needed a kind whose first list has not arrived (API server unreachable, rights missing)."""


@dataclass(frozen=True)
class Observation:
    """Everything one pass reads, taken once at its start."""

    deployment: dict[str, Any] | None
    nodes: Sequence[dict[str, Any]] = ()
    """Every node, as much of it as planning reads (planner.facts.node_view)."""
    nodes_revision: int | None = None
    """Equal while the nodes are unchanged (Informer.revision): what node facts may be remembered by."""
    active_pods: Sequence[dict[str, Any]] = ()
    """Every namespace's pods that hold (or wait for) resources, as much of each as the GPU capacity
    check reads (planner.capacity.pod_gpu_view)."""
    active_pods_revision: int | None = None
    """Equal while those pods are unchanged: what GPU usage may be remembered by."""
    children: Sequence[dict[str, Any]] = ()
    """This deployment's objects of every child kind."""
    pods: Sequence[dict[str, Any]] = field(default_factory=tuple)
    """This deployment's pods in every phase (serving, router, staging)."""


def active_pod_view(pod: dict[str, Any]) -> dict[str, Any]:
    """Capacity's part of a pod, and the label that tells which deployment's own it is."""
    return pod_gpu_view(pod, (LABEL_DEPLOYMENT,))


def own_pod_view(pod: dict[str, Any]) -> dict[str, Any]:
    """What a pass reads of its deployment's pods: metadata (labels, owner, creation and deletion
    times: reconcile/pairing.py, reconcile/weights_status.py), the node it runs on (the stranded
    check) and the whole status (readiness, IP, a staging pod's termination message). Their specs
    (a serving pod's command line, env and volumes) and managedFields are most of their size."""
    meta = {k: v for k, v in (pod.get("metadata") or {}).items() if k != "managedFields"}
    node = (pod.get("spec") or {}).get("nodeName")
    return {"apiVersion": pod.get("apiVersion", "v1"), "kind": pod.get("kind", "Pod"), "metadata": meta,
            "spec": {"nodeName": node} if node else {}, "status": pod.get("status") or {}}


TEMPLATES = ("template", "leaderWorkerTemplate")
"""The pod templates of a Job, a Deployment and a LeaderWorkerSet: most of a child's size, and
never read back (a pass compares our desired-state hash annotation, not the spec)."""


STATUS_READ: dict[str, tuple[str, ...]] = {
    "Job": ("active", "succeeded", "failed", "conditions"),  # reconcile/weights_status.py
    "LeaderWorkerSet": ("replicas", "readyReplicas", "updatedReplicas", "observedGeneration"),  # status.py role_lag
    "Deployment": ("replicas", "readyReplicas", "updatedReplicas", "observedGeneration"),  # status.py _router_status
}
"""Of each child kind's status, the fields a pass reads; of other kinds none (no pass reads a
claim's, a Service's or a scaler's status). Controllers rewrite the rest on every step (a
Deployment's conditions carry their lastUpdateTime, a LeaderWorkerSet's their transition times):
kept, each would be an event that changes the view, so a pass that can decide nothing new."""

CONDITION_READ = ("type", "status", "reason", "message")
"""Of a Job condition: what weights_status.py reads, not its probe and transition times."""


def child_view(obj: dict[str, Any]) -> dict[str, Any]:
    """What a pass reads of a child: metadata, the spec less its pod template (replicas, a
    Service's selector), data, of the status what STATUS_READ keeps; and of its managedFields what
    the drift check and the autoscaler's hand-over read (k8s/cluster.py `unchanged_since_our_apply`,
    reconcile/autoscaler.py `owns_replicas`): every entry but status writers', each field set as
    canonical JSON text (k8s/managed_fields.py). A deployment's children take ~72 KB of memory so,
    against ~208 KB whole."""
    meta = dict(obj.get("metadata") or {})
    if "managedFields" in meta:
        meta["managedFields"] = [{**e, "fieldsV1": fields_text(e)} for e in meta["managedFields"]
                                 if e.get("subresource") != "status"]
    view = {**obj, "metadata": meta}
    spec = obj.get("spec")
    if isinstance(spec, dict) and any(k in spec for k in TEMPLATES):
        view["spec"] = {k: v for k, v in spec.items() if k not in TEMPLATES}
    view.pop("status", None)
    status = obj.get("status")
    if isinstance(status, dict) and (read := {k: status[k] for k in STATUS_READ.get(obj.get("kind", ""), ())
                                              if k in status}):
        if isinstance(read.get("conditions"), list):
            read["conditions"] = [{k: c[k] for k in CONDITION_READ if k in c} for c in read["conditions"]
                                  if isinstance(c, dict)]
        view["status"] = read
    return view


def deployment_mark(obj: Mapping[str, Any]) -> Hashable | None:
    """(namespace, deployment label) of an object that carries the label: what the stores index
    children and our pods by, and whose pod a GPU is counted for (reconcile/pass_memo.py)."""
    meta = obj.get("metadata") or {}
    value = (meta.get("labels") or {}).get(LABEL_DEPLOYMENT)
    return (meta.get("namespace") or "", value) if value else None


def owner_of(obj: dict[str, Any]) -> Key | None:
    """The KimiK3Deployment that controls `obj`, if one does."""
    meta = obj.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(f"{GROUP}/"):
            return meta.get("namespace") or "", ref.get("name") or ""
    return None


class ClusterCache:
    """The informers a running operator reads from. `on_child(namespace, name, kind)` is called
    from an informer thread when a watched child of that deployment changed."""

    def __init__(self, api: client.ApiClient, namespaces: tuple[str, ...] = (),
                 on_child: Callable[[str, str, str], None] | None = None, **informer_args: Any) -> None:
        dyn = DynamicClient(api)
        self._api = api
        self._on_child = on_child
        scopes: tuple[str | None, ...] = namespaces or (None,)

        def informer(watched: Watched, **kw: Any) -> Informer:
            return Informer(dyn, watched, **kw, **informer_args)

        self.deployments = [informer(Watched(f"{GROUP}/{VERSION}", KIND, ns, keep_managed_fields=True))
                            for ns in scopes]
        self.nodes = informer(Watched("v1", "Node"), view=node_view)
        self.active_pods = informer(Watched("v1", "Pod", field_selector=ACTIVE_PODS), view=active_pod_view)
        self.own_pods = informer(Watched("v1", "Pod", label_selector=OURS), index=deployment_mark,
                                 view=own_pod_view)
        self.children: dict[str, list[Informer]] = {
            kind.kind: [informer(Watched(kind.api_version, kind.kind, ns, OURS), index=deployment_mark,
                                 listener=self._listener(kind), view=child_view) for ns in scopes]
            for kind in CHILD_KINDS}

    def _listener(self, kind: ChildKind) -> Callable[[str, dict[str, Any]], None] | None:
        if not kind.watched or self._on_child is None:
            return None
        on_child = self._on_child

        def listen(_: str, obj: dict[str, Any]) -> None:
            if (owner := owner_of(obj)) is not None:
                on_child(*owner, kind.kind)
        return listen

    def informers(self) -> list[Informer]:
        return [*self.deployments, self.nodes, self.active_pods, self.own_pods,
                *(i for group in self.children.values() for i in group)]

    def start(self) -> ClusterCache:
        # One connection per watch held open, and a few for lists: with urllib3's default pool of
        # 10, the watches beyond it would each open and discard a connection (a TLS handshake) per
        # request.
        config = self._api.configuration
        config.connection_pool_maxsize = max(config.connection_pool_maxsize or 0, len(self.informers()) + 4)
        self._api.rest_client = rest.RESTClientObject(config)
        for inf in self.informers():
            inf.start()
        return self

    def stop(self) -> None:
        for inf in self.informers():
            inf.stop()

    def wait_synced(self, timeout: float = SYNC_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        for inf in self.informers():
            if not inf.synced.wait(max(0.0, deadline - time.monotonic())):
                raise CacheNotSynced(f"no list of {inf.watched.describe()} yet"
                                     + (f": {inf.last_error}" if inf.last_error else ""))

    # ---- reads ----------------------------------------------------------------------------------

    def deployment_keys(self) -> list[Key]:
        return [k for inf in self.deployments for k in inf.keys()]

    def observe(self, namespace: str, name: str, label: str, body: dict[str, Any] | None = None) -> Observation:
        """The pass's view of deployment `name`, whose children carry LABEL_DEPLOYMENT=`label`;
        `body` when the caller holds a fresher copy (kopf's, in a create or update handler).
        Children and this deployment's pods are copies (a pass may build on them); nodes and
        other pods are shared and read only."""
        self.wait_synced()
        if body is not None:
            # Into the store, newest wins: a later pass started by a child event must not read an
            # older spec than this one did (and re-apply what this pass replaced).
            self.note(body)
        body = next((found for inf in self.deployments if (found := inf.get((namespace, name)))), None)
        if body is None:
            return Observation(deployment=None)
        mark = (namespace, label)
        children = [o for group in self.children.values() for inf in group for o in inf.indexed(mark)]
        nodes, revision = self.nodes.items_at()
        active, active_revision = self.active_pods.items_at()
        return Observation(
            deployment=copy.deepcopy(body), nodes=nodes, nodes_revision=revision,
            active_pods=active, active_pods_revision=active_revision,
            children=copy.deepcopy(children), pods=copy.deepcopy(self.own_pods.indexed(mark)))

    # ---- our own writes -------------------------------------------------------------------------

    def _stores(self, obj: dict[str, Any]) -> list[Informer]:
        kind, namespace = obj.get("kind", ""), (obj.get("metadata") or {}).get("namespace")
        if kind == KIND:
            group = self.deployments
        elif kind in BY_KIND:
            group = self.children[kind]
        else:
            return []
        return [i for i in group if i.watched.namespace in (None, namespace)]

    def note(self, obj: dict[str, Any]) -> None:
        for inf in self._stores(obj):
            if not inf.served:
                inf.wake()  # the kind is served after all: follow it from now on
            inf.note(obj)

    def forget(self, obj: dict[str, Any]) -> None:
        for inf in self._stores(obj):
            inf.forget(obj)


__all__ = ["ACTIVE_PODS", "OURS", "CacheNotSynced", "ClusterCache", "Observation", "active_pod_view",
           "child_view", "deployment_mark", "key_of", "own_pod_view", "owner_of"]
