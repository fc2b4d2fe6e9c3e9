"""The only code that talks to the API server.

Writes are server-side apply with one field manager (force, so a hand edit of a field we own
is taken back) and deletes of objects we own; reads return plain dicts so the pure layers
never see client types. Steady state costs zero writes: `apply` skips an object whose live copy
carries the same desired-hash annotation and that nobody else has written since our last apply
(a write to its status aside; one through /scale, as `kubectl scale` or an HPA makes, counts).
With leader election every request but a read asks the elector's WriteGuard first, in the one
place all of them pass (`_GuardedClient.request`), so no write path can forget to.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import DynamicApiError, NotFoundError, ResourceNotFoundError

from ..api import GROUP, KIND, VERSION
from ..contract import timestamps
from ..contract.kinds import LEADER_WORKER_SET
from ..contract.kueue import JOB_UID_LABEL, WORKLOAD_API_VERSION, WORKLOAD_KIND
from ..contract.names import (
    ANNOTATION_HASH,
    AUTOSCALER_FIELD_MANAGER,
    FIELD_MANAGER,
    LABEL_DEPLOYMENT,
)
from ..contract.stager import PROGRESS_FIELD_MANAGER, PROGRESS_KEY
from .cache import ACTIVE_PODS, ClusterCache, Observation
from .config_maps import ConfigMapKey, read_config_map_key
from .identity import IDENTITY, user_agent
from .lease import WriteGuard
from .managed_fields import fields_of, fields_text

HARMLESS_WRITES: dict[str, dict[str, Any]] = {
    PROGRESS_FIELD_MANAGER: {"f:data": {".": {}, f"f:{PROGRESS_KEY}": {}}},
    AUTOSCALER_FIELD_MANAGER: {"f:spec": {"f:replicas": {}}},
}
"""Writers that only touch fields the main apply never sets, and the most each may own: a staging
pod's progress in its ConfigMap, and the replica count of an autoscaled role (which the main apply
leaves out). Their writes are not drift and cost no re-apply. A manager's name is whatever the
client says, so the name alone proves nothing: an entry that owns more than this (a compromised
staging pod writing labels or owner references under its manager's name) is drift like any other."""

log = logging.getLogger(__name__)

class TransientApiError(Exception):
    """An API call failed in a way worth retrying (conflict, throttling, server error)."""


class RejectedApiError(Exception):
    """The API server refused an object as invalid or forbidden: retrying the same object cannot help
    (e.g. a changed storage class on an existing claim, whose spec is immutable)."""

    def __init__(self, kind: str, name: str, status: int, message: str) -> None:
        super().__init__(f"{kind} {name}: {status} {message}")
        self.kind, self.name, self.status, self.message = kind, name, status, message


UNREACHABLE: tuple[type[Exception], ...] = (urllib3.exceptions.HTTPError,)
"""The API server could not be reached or the connection broke (refused while it restarts,
reset mid-response): worth a prompt retry, like a TransientApiError."""


class MissingApiError(Exception):
    """The cluster does not serve a kind the plan needs (e.g. no LWS or DRA driver installed)."""

    def __init__(self, api_version: str, kind: str) -> None:
        super().__init__(f"the cluster does not serve {kind} ({api_version})")
        self.api_version, self.kind = api_version, kind


@dataclass(frozen=True)
class ApplyResult:
    obj: dict[str, Any]
    written: bool


class NoClusterError(Exception):
    """No kubeconfig (or not its context) and not in a pod: nothing says where the API server is."""


def api_client(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """A client from the given kubeconfig (and context), else $KUBECONFIG/~/.kube/config, else
    in-cluster. Its User-Agent names this process's identity, so the audit log tells replicas apart."""
    try:
        api = config.new_client_from_config(config_file=kubeconfig, context=context)
    except config.ConfigException as exc:
        if kubeconfig or context:
            raise NoClusterError(str(exc)) from None
        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException as inside:
            raise NoClusterError(f"{exc}; and not in a pod: {inside}") from None
        api = client.ApiClient(cfg)
    api.user_agent = user_agent()
    return api


def _translate(exc: ApiException | DynamicApiError) -> Exception:
    status = getattr(exc, "status", None) or 0
    if status in (409, 429) or status >= 500:
        return TransientApiError(f"{status} {getattr(exc, 'reason', '')}: {getattr(exc, 'body', '')}")
    return exc


class _GuardedClient(DynamicClient):  # type: ignore[misc]  # the client is untyped (Any)
    """The dynamic client, whose every request that is not a read raises NotLeaderError, unsent,
    when the guard says this replica may no longer write."""

    def __init__(self, api: client.ApiClient, guard: WriteGuard | None) -> None:
        self._guard = guard
        super().__init__(api)

    def request(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        if self._guard is not None and method.upper() != "GET":
            self._guard.check()
        started, cpu = time.monotonic(), time.thread_time()
        try:
            return super().request(method, path, body=body, **params)
        finally:
            _spent.seconds = getattr(_spent, "seconds", 0.0) + time.monotonic() - started
            _spent.cpu = getattr(_spent, "cpu", 0.0) + time.thread_time() - cpu


_spent = threading.local()


def api_time() -> tuple[float, float]:
    """Seconds this thread spent in API requests since it last asked, as (wall, its own CPU): a
    pass's API time, the rest of its duration and CPU being the operator's own work."""
    spent = (float(getattr(_spent, "seconds", 0.0)), float(getattr(_spent, "cpu", 0.0)))
    _spent.seconds = _spent.cpu = 0.0
    return spent


class Cluster:
    """Typed-dict access to the few resources the operator reads and writes. With a `guard`
    (leader election), writes are sent only while it allows them. With a `cache`, a pass reads
    from its informers (`observe`) and what our writes return goes into it, so the next pass sees
    them even before their watch events arrive."""

    def __init__(self, api: client.ApiClient, guard: WriteGuard | None = None,
                 cache: ClusterCache | None = None) -> None:
        self._dyn = _GuardedClient(api, guard)
        self.cache = cache
        # uid -> the writes to the object as our last apply left them (`writes_digest`).
        self._applied: dict[str, str] = {}

    def _resource(self, api_version: str, kind: str) -> Any:
        return self._dyn.resources.get(api_version=api_version, kind=kind)

    # ---- reads --------------------------------------------------------------------------------

    def observe(self, namespace: str, name: str, label: str, body: dict[str, Any] | None = None) -> Observation:
        """Everything a pass of deployment `name` reads (ClusterCache.observe): from the informers,
        never a list per pass."""
        if self.cache is None:
            raise RuntimeError("a reconcile pass reads from a ClusterCache: construct Cluster(api, guard, cache)")
        return self.cache.observe(namespace, name, label, body)

    def read_config_map_key(self, namespace: str, name: str, key: str) -> ConfigMapKey:
        """One key of a user's ConfigMap (engine.chatTemplate), read when engines are about to roll."""
        return read_config_map_key(self._dyn.client, namespace, name, key)

    def read_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One KimiK3Deployment as the API server holds it, for `kimik3 plan NAMESPACE/NAME`; None
        when there is no such object."""
        try:
            res = self._resource(f"{GROUP}/{VERSION}", KIND)
        except ResourceNotFoundError as exc:
            raise MissingApiError(f"{GROUP}/{VERSION}", KIND) from exc
        try:
            return dict(res.get(name=name, namespace=namespace).to_dict())
        except NotFoundError:
            return None

    def list_nodes(self) -> list[dict[str, Any]]:
        """One list, for `kimik3 plan` against the live cluster (a reconcile pass reads the informers)."""
        return [n.to_dict() for n in self._resource("v1", "Node").get().items]

    def list_workloads(self, namespace: str, label: str) -> list[dict[str, Any]]:
        """A deployment's LeaderWorkerSets (by its deployment label), for `kimik3 plan --diff`."""
        res = self._resource(LEADER_WORKER_SET.api_version, LEADER_WORKER_SET.kind)
        return [o.to_dict() for o in res.get(namespace=namespace, label_selector=f"{LABEL_DEPLOYMENT}={label}").items]

    def list_active_pods(self) -> list[dict[str, Any]]:
        """Every namespace's pods that hold (or wait for) resources, for `kimik3 plan`'s capacity."""
        return [p.to_dict() for p in self._resource("v1", "Pod").get(field_selector=ACTIVE_PODS).items]

    def list_kueue_workloads(self, namespace: str, job_uids: Sequence[str]) -> list[dict[str, Any]] | None:
        """Kueue's Workloads of the LeaderWorkerSets `job_uids` (the label Kueue puts on each), for
        the Admitted condition; None when the cluster serves no Workload kind (no Kueue)."""
        try:
            res = self._resource(WORKLOAD_API_VERSION, WORKLOAD_KIND)
        except ResourceNotFoundError:
            return None
        if not job_uids:
            return []
        selector = f"{JOB_UID_LABEL} in ({','.join(sorted(job_uids))})"
        try:
            return [w.to_dict() for w in res.get(namespace=namespace, label_selector=selector).items]
        except (ApiException, DynamicApiError) as exc:
            status = getattr(exc, "status", None) or 0
            raise RejectedApiError(WORKLOAD_KIND, namespace, status, _api_message(exc)) from exc

    # ---- writes -------------------------------------------------------------------------------

    def apply(self, desired: dict[str, Any], live: dict[str, Any] | None) -> ApplyResult:
        """Server-side apply `desired` unless `live` already is what we last applied."""
        if live is not None and unchanged_since_our_apply(
                desired, live, self._applied.get(live["metadata"].get("uid", ""))):
            return ApplyResult(live, written=False)
        try:
            res = self._resource(desired["apiVersion"], desired["kind"])
        except ResourceNotFoundError as exc:
            raise MissingApiError(desired["apiVersion"], desired["kind"]) from exc
        try:
            try:
                result = self._server_side_apply(res, desired)
            except (ApiException, DynamicApiError) as exc:
                if live is None or getattr(exc, "status", None) != 422 or "spec" not in desired:
                    raise
                result = self._take_back(res, desired, live, exc)
        except (ApiException, DynamicApiError) as exc:
            translated = _translate(exc)
            if translated is exc and getattr(exc, "status", 0) in (400, 403, 422):
                raise RejectedApiError(desired["kind"], desired["metadata"]["name"], getattr(exc, "status", 0),
                                       _api_message(exc)) from exc
            raise translated from exc
        meta = result.get("metadata") or {}
        self._applied[meta.get("uid", "")] = writes_digest(result)
        self._noted(result)
        log.info("Applied %s %s/%s", desired["kind"], desired["metadata"]["namespace"],
                 desired["metadata"]["name"])
        return ApplyResult(result, written=True)

    def _noted(self, written: dict[str, Any]) -> None:
        if self.cache is not None:
            self.cache.note(written)

    def _server_side_apply(self, res: Any, desired: dict[str, Any]) -> dict[str, Any]:
        obj = self._dyn.server_side_apply(res, body=desired, field_manager=FIELD_MANAGER, force_conflicts=True)
        return obj.to_dict()  # type: ignore[no-any-return]

    def _take_back(self, res: Any, desired: dict[str, Any], live: dict[str, Any], exc: Exception) -> dict[str, Any]:
        """Apply was refused as Invalid on an object someone edited: an edit apply cannot merge.

        A Service port renumbered by hand is a list item of the editor's (the port is the key),
        and ours collides with it on the port name, so no apply succeeds again. Replace the spec
        with ours (the API server keeps a Service's allocated clusterIP), apply, then drop the
        Update entry the replace left under our name: while it co-owns fields, a later apply
        could not remove a field we stop sending.
        """
        meta = live["metadata"]
        where = {"name": meta["name"], "namespace": meta["namespace"], "field_manager": FIELD_MANAGER,
                 "content_type": "application/json-patch+json"}
        log.warning("Apply of %s %s/%s refused (%s); replacing its spec with ours", desired["kind"],
                    meta["namespace"], meta["name"], getattr(exc, "status", exc))
        self._dyn.patch(res, body=[{"op": "test", "path": "/metadata/uid", "value": meta["uid"]},
                                   {"op": "replace", "path": "/spec", "value": desired["spec"]}], **where)
        result = self._server_side_apply(res, desired)
        entries = (result.get("metadata") or {}).get("managedFields") or []
        kept = [e for e in entries if e.get("manager") != FIELD_MANAGER or e.get("operation") == "Apply"]
        if len(kept) < len(entries):
            result = self._dyn.patch(res, body=[
                {"op": "test", "path": "/metadata/resourceVersion", "value": result["metadata"]["resourceVersion"]},
                {"op": "replace", "path": "/metadata/managedFields", "value": kept}], **where).to_dict()
        return result

    def set_replicas(self, workload: dict[str, Any], replicas: int) -> dict[str, Any]:
        """Server-side apply spec.replicas alone under the autoscaler's field manager (see
        AUTOSCALER_FIELD_MANAGER); forced, as the scaler's count wins over a stale owner's."""
        meta = workload["metadata"]
        body = {"apiVersion": workload["apiVersion"], "kind": workload["kind"],
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]}, "spec": {"replicas": replicas}}
        try:
            res = self._resource(workload["apiVersion"], workload["kind"])
            out: dict[str, Any] = self._dyn.server_side_apply(
                res, body=body, field_manager=AUTOSCALER_FIELD_MANAGER, force_conflicts=True).to_dict()
        except (ApiException, DynamicApiError) as exc:
            raise _translate(exc) from exc
        log.info("Set %s %s/%s replicas to %d", workload["kind"], meta["namespace"], meta["name"], replicas)
        self._noted(out)
        return out

    def delete(self, obj: dict[str, Any], grace_seconds: int | None = None) -> None:
        """Delete `obj` if it is still the object we saw; `grace_seconds` overrides a pod's
        terminationGracePeriodSeconds."""
        meta = obj["metadata"]
        res = self._resource(obj["apiVersion"], obj["kind"])
        body: dict[str, Any] = {"preconditions": {"uid": meta["uid"]}, "propagationPolicy": "Background"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        try:
            # Precondition on uid: never delete a same-named object created after we listed.
            res.delete(name=meta["name"], namespace=meta["namespace"], body=body)
        except NotFoundError:
            pass  # gone already
        except (ApiException, DynamicApiError) as exc:
            raise _translate(exc) from exc
        else:
            log.info("Deleted %s %s/%s", obj["kind"], meta["namespace"], meta["name"])
        if self.cache is not None:
            self.cache.forget(obj)

    def post_event(self, involved: dict[str, Any], namespace: str, type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about `involved` (an owner reference of our resource); best effort: an
        event that cannot be posted is logged and never fails a pass."""
        now = timestamps.stamp(time.time())
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": {k: involved[k] for k in ("apiVersion", "kind", "name", "uid")}
            | {"namespace": namespace},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": FIELD_MANAGER}, "reportingComponent": FIELD_MANAGER,
            "reportingInstance": IDENTITY, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            self._resource("v1", "Event").create(body=body, namespace=namespace)
        except (ApiException, DynamicApiError) as exc:
            log.warning("Could not post event %s on %s/%s: %s", reason, namespace, involved["name"], exc)

    def apply_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Server-side apply the whole status: fields we no longer send are removed."""
        res = self._resource(f"{GROUP}/{VERSION}", KIND)
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                "metadata": {"name": name, "namespace": namespace}, "status": status}
        try:
            written = self._dyn.server_side_apply(res.subresources["status"], body=body, name=name,
                                                  namespace=namespace, field_manager=FIELD_MANAGER,
                                                  force_conflicts=True)
            self._noted(written.to_dict())
        except NotFoundError:
            return  # deleted meanwhile: nothing to report on
        except (ApiException, DynamicApiError) as exc:
            raise _translate(exc) from exc


def _api_message(exc: ApiException | DynamicApiError) -> str:
    """The Status message the API server sent, else the HTTP reason."""
    body = getattr(exc, "body", None) or ""
    try:
        return str(json.loads(body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(getattr(exc, "reason", "") or body or exc)


def writes_digest(obj: dict[str, Any]) -> str:
    """A digest of the fields our apply owns on `obj` (our Apply entries outside status).

    Only a write that took or removed one of them can make the object differ from what we set: an
    Update that changes a field we own moves it out of our entry, as a forced apply or a /scale write
    does; one that leaves our fields alone (a controller's annotation, a bound claim's volumeName, a
    staging pod's progress) cannot be undone by applying again, since an apply removes only fields
    its own manager owned. So those cost no re-apply, where a digest of every writer's entry paid one
    no-op apply per foreign write (bench/control_plane.py: the PV controller's and kwok's writes to
    every cache claim)."""
    entries = ((obj.get("metadata") or {}).get("managedFields")) or []
    ours = sorted(f"{e.get('subresource') or ''} {fields_text(e)}" for e in _spec_writes(entries)
                  if e.get("manager") == FIELD_MANAGER and e.get("operation") == "Apply")
    return hashlib.sha256("\n".join(ours).encode()).hexdigest()


def unchanged_since_our_apply(desired: dict[str, Any], live: dict[str, Any],
                              applied: str | None = None) -> bool:
    """True when `live` carries the hash of `desired`, still has the replica count we set
    (`_scaled`), and our fields are as our last apply left them: its result had the
    `writes_digest` `applied`.

    Without `applied` (this process never applied the object: it just started, or took over
    from another replica) only the entries' times tell, and they have one-second resolution: a
    foreign write in the same second as our apply is taken as older, which it almost always is (a
    controller reacting to our apply). With `applied`, times play no part, so a hand edit within
    that second is repaired too, and a write beside our fields costs nothing."""
    meta = live.get("metadata") or {}
    want = ((desired.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_HASH)
    if want is None or (meta.get("annotations") or {}).get(ANNOTATION_HASH) != want or _scaled(desired, live):
        return False
    entries = meta.get("managedFields") or []
    ours = [t for e in _spec_writes(entries)
            if e.get("manager") == FIELD_MANAGER and e.get("operation") == "Apply"
            and (t := timestamps.parse(e.get("time"))) is not None]
    if not ours:
        return False
    if applied is not None:
        return writes_digest(live) == applied
    return all(t <= max(ours) for t in _foreign_writes(entries))


def _scaled(desired: dict[str, Any], live: dict[str, Any]) -> bool:
    """Whether the replica count we set was changed, as a write through /scale (`kubectl scale`,
    an HPA) does.

    Only the value tells for sure. For a custom resource such as a LeaderWorkerSet the API
    server's field manager cannot type the autoscaling/v1 Scale (kubernetes/kubernetes#116311,
    #131892): the write leaves no entry or time of the writer's, at most spec.replicas taken out
    of its owners' entries, which a process that did not make our last apply cannot tell from no
    write at all."""
    want = (desired.get("spec") or {}).get("replicas")
    return want is not None and (live.get("spec") or {}).get("replicas") != want


def _foreign_writes(entries: Iterable[dict[str, Any]]) -> list[datetime]:
    return [t for e in _spec_writes(entries)
            if not (e.get("manager") == FIELD_MANAGER and e.get("operation") == "Apply")
            and not harmless(e) and (t := timestamps.parse(e.get("time"))) is not None]


def harmless(entry: dict[str, Any]) -> bool:
    """Whether a managedFields entry is one of HARMLESS_WRITES, owning no more than its fields."""
    allowed = HARMLESS_WRITES.get(entry.get("manager", ""))
    return allowed is not None and _within(fields_of(entry), allowed)


def _within(fields: Any, allowed: dict[str, Any]) -> bool:
    return isinstance(fields, dict) and all(k in allowed and _within(v, allowed[k]) for k, v in fields.items())


def _spec_writes(entries: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    """Every managedFields entry but those of status writers (a controller reporting, as the LWS
    controller does after each of our applies): those never touch what we set. A write through
    another subresource does: /scale sets spec.replicas, and its entry says `subresource: scale`."""
    return (e for e in entries if e.get("subresource") != "status")
