"""An in-memory stand-in for k8s.Cluster that a reconcile pass runs against, and the P/D
deployment most reconcile tests start from. Shared by the unit tests of the reconcile pass, the
status pace, the pass memo, the SLO scaler, the Disaggregating and Admitted conditions."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from kimik3_operator.contract.names import AUTOSCALER_FIELD_MANAGER, FIELD_MANAGER, LABEL_DEPLOYMENT
from kimik3_operator.k8s import ApplyResult, MissingApiError, unchanged_since_our_apply
from kimik3_operator.k8s.cache import Observation, active_pod_view, child_view, own_pod_view
from kimik3_operator.k8s.cluster import writes_digest
from kimik3_operator.k8s.config_maps import ConfigMapKey
from kimik3_operator.planner.facts import node_view
from kimik3_operator.reconcile.reconciler import Pass, reconcile
from tests.support.cases import base_deployment
from tests.support.nodes import b200_nodes, gb300_rack


def _labelled(pod: dict[str, Any], namespace: str, label: str) -> bool:
    meta = pod["metadata"]
    return meta.get("namespace") == namespace and (meta.get("labels") or {}).get(LABEL_DEPLOYMENT) == label


class MemoryCluster:
    """Implements the Cluster methods reconcile uses. An apply is skipped by the operator's own
    rule (`unchanged_since_our_apply`, with the digest of its last apply as Cluster keeps it), so
    the managedFields the API server would show are kept: an apply owns the spec it sends and
    takes it back from other writers (force), and leaves the status and its writers alone."""

    def __init__(self, deployment: dict[str, Any], nodes: list[dict[str, Any]]) -> None:
        self.deployment = copy.deepcopy(deployment)
        self.deployment["metadata"].update(uid="uid-1", generation=1)
        self.nodes = nodes
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        """This deployment's pods that no longer hold resources (finished staging pods)."""
        self.active: list[dict[str, Any]] = []
        """Pods of every namespace that hold resources."""
        self.config_maps: dict[str, dict[str, str]] = {}
        self.writes: list[str] = []
        self.applied: dict[str, str] = {}
        self.seconds = 0
        self._stores: dict[str, tuple[str | None, int]] = {}

    def _entry(self, manager: str, operation: str, fields: dict[str, Any], subresource: str = "") -> dict[str, Any]:
        """A managedFields entry of a write made now (every write is a second after the last)."""
        self.seconds += 1
        time = (datetime(2026, 11, 30, tzinfo=UTC) + timedelta(seconds=self.seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"manager": manager, "operation": operation, "time": time, "fieldsType": "FieldsV1",
                "fieldsV1": fields, **({"subresource": subresource} if subresource else {})}

    def finish_staging(self, commit: str = "c0ffee" * 6 + "c0ff") -> None:
        """Play the Job controller and kubelet: every staging Job succeeds, its pod reporting `commit`."""
        for (kind, name), job in self.objects.items():
            if kind == "Job":
                job["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
                record = json.dumps({"phase": "Complete", "commit": commit, "filesDone": 3, "filesTotal": 3})
                owner = {"kind": "Job", "name": name, "uid": job["metadata"]["uid"], "controller": True}
                self.pods.append({"metadata": {"name": f"{name}-x", "creationTimestamp": "2026-11-30T00:00:00Z",
                                               "labels": {**job["spec"]["template"]["metadata"]["labels"],
                                                          "batch.kubernetes.io/job-name": name},
                                               "ownerReferences": [owner]},
                                  "status": {"phase": "Succeeded", "containerStatuses": [
                                      {"state": {"terminated": {"exitCode": 0, "message": record}}}]}})

    def _revision(self, store: str, items: list[dict[str, Any]]) -> int:
        """As an informer's revision: moves when the store's contents change, and only then."""
        seen = json.dumps(items, sort_keys=True)
        if self._stores.get(store, (None, 0))[0] != seen:
            self._stores[store] = (seen, self._stores.get(store, (None, 0))[1] + 1)
        return self._stores[store][1]

    def read_config_map_key(self, namespace: str, name: str, key: str) -> ConfigMapKey:
        self.writes.append(f"read configmap {name}")  # a read, counted to show when it happens
        data = self.config_maps.get(name)
        if data is None:
            return ConfigMapKey(None, f"ConfigMap {name}")
        return ConfigMapKey(data[key]) if key in data else ConfigMapKey(None, f"key {key} in ConfigMap {name}")

    def post_event(self, involved: dict[str, Any], namespace: str, type_: str, reason: str, message: str) -> None:
        self.writes.append(f"event {type_} {reason}")

    def observe(self, namespace: str, name: str, label: str, body: dict[str, Any] | None = None) -> Observation:
        """What the informers would hold: this deployment's objects, its pods, the nodes, and the
        pods of every namespace that hold resources (`active`, ours among them), nodes and pods as
        the informers' views keep them."""
        pods = self.pods + [p for p in self.active if _labelled(p, namespace, label)]
        nodes, active = [node_view(n) for n in self.nodes], [active_pod_view(p) for p in self.active]
        return Observation(deployment=copy.deepcopy(body or self.deployment), nodes=nodes,
                           nodes_revision=self._revision("nodes", nodes), active_pods=active,
                           active_pods_revision=self._revision("active", active),
                           children=[child_view(copy.deepcopy(o)) for o in self.objects.values()],
                           pods=[own_pod_view(copy.deepcopy(p)) for p in pods])

    def apply(self, desired: dict[str, Any], live: dict[str, Any] | None) -> ApplyResult:
        key = (desired["kind"], desired["metadata"]["name"])
        if live is not None and unchanged_since_our_apply(desired, live, self.applied.get(live["metadata"]["uid"])):
            return ApplyResult(live, written=False)
        old = self.objects.get(key) or {}
        meta = old.get("metadata") or {}
        obj = copy.deepcopy(desired)
        # A field the apply leaves out stays only while another manager owns it (else the API
        # server removes it, and a LeaderWorkerSet's replicas default to 1).
        others = [e for e in meta.get("managedFields") or []
                  if e["manager"] != FIELD_MANAGER and e.get("subresource") != "status"]
        if key[0] == "LeaderWorkerSet" and "replicas" not in obj["spec"]:
            owned = any("f:replicas" in e["fieldsV1"].get("f:spec", {}) for e in others)
            obj["spec"]["replicas"] = old["spec"]["replicas"] if owned else 1
        spec_changed = not old or obj.get("spec") != old.get("spec")
        ours = self._entry(FIELD_MANAGER, "Apply", {"f:spec": {f"f:{k}": {} for k in desired.get("spec") or {}}})
        obj["metadata"].update(
            uid=meta.get("uid", f"uid-{key[0]}-{key[1]}"),
            generation=int(meta.get("generation") or 0) + (1 if spec_changed else 0),
            managedFields=[ours, *others, *(e for e in meta.get("managedFields") or []
                                            if e.get("subresource") == "status")])
        obj["status"] = old.get("status") or {"readyReplicas": 0}
        self.objects[key] = obj
        self.applied[obj["metadata"]["uid"]] = writes_digest(obj)
        self.writes.append(f"apply {key}")
        return ApplyResult(copy.deepcopy(obj), written=True)

    def set_replicas(self, workload: dict[str, Any], replicas: int) -> dict[str, Any]:
        """The autoscaler's manager applies spec.replicas alone (forced: it leaves other entries)."""
        lws = self.objects[(workload["kind"], workload["metadata"]["name"])]
        if lws["spec"].get("replicas") != replicas:
            lws["metadata"]["generation"] += 1
        lws["spec"]["replicas"] = replicas
        entries = [e for e in lws["metadata"]["managedFields"] if e["manager"] != AUTOSCALER_FIELD_MANAGER]
        lws["metadata"]["managedFields"] = entries + [
            self._entry(AUTOSCALER_FIELD_MANAGER, "Apply", {"f:spec": {"f:replicas": {}}})]
        self.writes.append(f"replicas {workload['metadata']['name']} {replicas}")
        return copy.deepcopy(lws)

    def scale(self, name: str, replicas: int) -> None:
        """A write through a LeaderWorkerSet's /scale (`kubectl scale`, an HPA) as the API server
        records it for a custom resource: spec.replicas leaves its owners' entries, and the
        writer gets no entry (kubernetes/kubernetes#116311)."""
        lws = self.objects[("LeaderWorkerSet", name)]
        lws["spec"]["replicas"] = replicas
        lws["metadata"]["generation"] += 1
        for entry in lws["metadata"]["managedFields"]:
            entry["fieldsV1"].get("f:spec", {}).pop("f:replicas", None)

    def report(self, kind: str, name: str, replicas: int, ready: int | None = None, updated: int | None = None) -> None:
        """The workload controller's status write on the current generation: `replicas` exist, of
        which `ready` are ready and `updated` updated (all of them unless given)."""
        obj = self.objects[(kind, name)]
        obj["status"] = {"replicas": replicas, "readyReplicas": replicas if ready is None else ready,
                         "updatedReplicas": replicas if updated is None else updated,
                         "observedGeneration": obj["metadata"]["generation"]}
        entry = self._entry(f"{kind.lower()}-controller", "Update", {"f:status": {}}, "status")
        obj["metadata"]["managedFields"] = [e for e in obj["metadata"]["managedFields"]
                                            if e["manager"] != entry["manager"]] + [entry]

    def delete(self, obj: dict[str, Any], grace_seconds: int | None = None) -> None:
        del self.objects[(obj["kind"], obj["metadata"]["name"])]
        self.writes.append(f"delete {obj['kind']}/{obj['metadata']['name']}")

    def apply_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.deployment["status"] = status
        self.writes.append("status")


class NoDra(MemoryCluster):
    """A cluster without NVIDIA's DRA driver: the ComputeDomain kind is not served."""

    def apply(self, desired: dict[str, Any], live: dict[str, Any] | None) -> ApplyResult:
        if desired["kind"] == "ComputeDomain":
            raise MissingApiError(desired["apiVersion"], desired["kind"])
        return super().apply(desired, live)


def pd_body() -> dict[str, Any]:
    body = base_deployment(name="k3", namespace="ns")
    body["spec"]["pools"] = [
        {"name": "gb300", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB300"},
         "decode": {"replicas": 2, "parallelism": {"tensor": 8}}},
        {"name": "b200", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-B200"},
         "prefill": {"replicas": 1, "parallelism": {"tensor": 8, "data": 2, "expert": True}}},
    ]
    return body


NODES = gb300_rack() + b200_nodes()


def staged(cluster: MemoryCluster, **kw: Any) -> MemoryCluster:
    reconcile(Pass(cluster, "ns", "k3", **kw))
    cluster.finish_staging()
    return cluster
