"""One kind's objects kept current by list + watch, as client-go's reflector and store do.

A pass reads what it needs from these stores instead of listing per pass, so the operator's reads
no longer grow with deployments x resyncs: each informer lists once, then follows one watch
(re-opened every few minutes, resumed from its last resourceVersion, bookmarks keeping that
version fresh while nothing changes). When the API server no longer holds that version (410 Gone,
after a long disconnect or an etcd compaction) the informer lists again and tells its listener
about every object that appeared, changed or vanished meanwhile, so a watch gap never hides a
deletion. A kind the cluster does not serve (no LWS, no KEDA) is an empty store that looks again
every `rediscover_seconds`, or at once when woken (an apply just found the kind served).

Objects are the API server's JSON as plain dicts, shared read-only: they are replaced, never
changed in place, and readers that modify take copies (`ClusterCache.observe`).
"""

from __future__ import annotations

import json
import logging
import random
import socket
import threading
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ResourceNotFoundError
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger(__name__)

Key = tuple[str, str]
"""(namespace, name); namespace "" for cluster-scoped objects."""
Listener = Callable[[str, dict[str, Any]], None]
"""Called with ("ADDED" | "MODIFIED" | "DELETED", object) from the informer's thread."""

PAGE = 500
"""Objects per list page (client-go's default): a 1,000-node list is two requests, not one huge one."""


class Gone(Exception):
    """The API server no longer has the resourceVersion a watch or a list continuation asked for."""


@dataclass(frozen=True)
class Watched:
    """What one informer follows."""

    api_version: str
    kind: str
    namespace: str | None = None
    """Only this namespace (a Role's rights suffice); every namespace when None."""
    label_selector: str | None = None
    field_selector: str | None = None
    keep_managed_fields: bool = False
    """For an informer without a view: keep the objects' managedFields (the KimiK3Deployments do),
    else drop them (most of an object's size). An informer with a view keeps what the view keeps."""

    def describe(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        sel = ",".join(s for s in (self.label_selector, self.field_selector) if s)
        return f"{self.kind}{where}" + (f" ({sel})" if sel else "")


def key_of(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def _version(obj: dict[str, Any]) -> int | None:
    """The object's resourceVersion as a number, or None. Opaque by contract, but etcd's revision in
    every API server; used only to keep a write's own result from being overwritten by an older event."""
    value = (obj.get("metadata") or {}).get("resourceVersion")
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def raw_get(api: client.ApiClient, path: str, query: list[tuple[str, Any]], read_timeout: float) -> Any:
    """GET `path` as JSON, unparsed (the urllib3 response: a list to json.loads, or a watch to read line
    by line): the typed client would build model objects of every item. Raises Gone on 410 and the
    client's ApiException with the API server's message on any other failure."""
    request = api.param_serialize("GET", path, query_params=query, header_params={"Accept": "application/json"},
                                  auth_settings=["BearerToken"])
    response = api.call_api(*request, _request_timeout=(10, read_timeout))
    if response.status == 410:
        response.read()
        raise Gone()
    if not 200 <= response.status <= 299:
        response.read()
        api.response_deserialize(response, {})  # raises ApiException with the API server's message
    return response.response


def _same_but_version(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    if old is None:
        return False

    def unversioned(obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.get("metadata") or {}
        return {**obj, "metadata": {k: v for k, v in meta.items() if k != "resourceVersion"}}
    return unversioned(old) == unversioned(new)


class Informer:
    """The store of one `Watched`, optionally indexed, fed by a thread of its own."""

    def __init__(self, dyn: DynamicClient, watched: Watched, listener: Listener | None = None,
                 index: Callable[[dict[str, Any]], Hashable | None] | None = None,
                 view: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 watch_seconds: tuple[int, int] = (240, 360), rediscover_seconds: float = 300.0) -> None:
        self._dyn, self.watched, self._listener, self._index_of = dyn, watched, listener, index
        self._view = view
        """What of each object to keep; an event that changes nothing of it changes nothing here
        (no revision, no listener call)."""
        self._watch_seconds, self._rediscover = watch_seconds, rediscover_seconds
        self._lock = threading.Lock()
        self._store: dict[Key, dict[str, Any]] = {}
        self._index: dict[Hashable, dict[Key, dict[str, Any]]] = {}
        self._version: str | None = None
        self.synced = threading.Event()
        """Set once the first list is in (or the kind is known not to be served)."""
        self.served = True
        self.last_error: str | None = None
        self.lists = 0
        """Full lists made: the first, and one after each watch gap."""
        self.revision = 0
        """Goes up with every change to the store: equal revisions, equal contents (a memo's key)."""
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None

    # ---- reads ----------------------------------------------------------------------------------

    def items(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._store.values())

    def items_at(self) -> tuple[list[dict[str, Any]], int]:
        """The objects and the revision they are at, read together."""
        with self._lock:
            return list(self._store.values()), self.revision

    def indexed(self, value: Hashable) -> list[dict[str, Any]]:
        with self._lock:
            return list((self._index.get(value) or {}).values())

    def get(self, key: Key) -> dict[str, Any] | None:
        with self._lock:
            return self._store.get(key)

    def keys(self) -> list[Key]:
        with self._lock:
            return list(self._store)

    # ---- what our own writes returned --------------------------------------------------------

    def note(self, obj: dict[str, Any]) -> None:
        """Take an object our write returned, unless the store already holds a newer version: the
        next pass sees its own write even before the watch delivers it."""
        obj = self._trimmed(obj)
        with self._lock:
            old = self._store.get(key_of(obj))
            new_v, old_v = _version(obj), (_version(old) if old else None)
            if old is not None and (new_v is None or old_v is None or new_v <= old_v):
                return
            self._put(obj)

    def forget(self, obj: dict[str, Any]) -> None:
        """Drop an object we deleted (its DELETED event may come later)."""
        with self._lock:
            self._drop(key_of(obj))

    # ---- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Informer:
        if self._thread is not None:
            self._thread.join(10)  # a stopped one ends within moments (see stop)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.watched.kind}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following, without blocking the caller: the socket of a watch being read is shut
        down, which ends the reading thread's wait (closing the response instead would wait for
        the lock that very read holds)."""
        self._stop.set()
        self._wake.set()
        sock = getattr(getattr(self._response, "connection", None), "sock", None)
        if sock is not None:
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's: no TLS state touched
            except OSError:
                pass  # closed meanwhile

    def wake(self) -> None:
        """Look again now for a kind the cluster did not serve."""
        self._wake.set()

    def _run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                path = self._path()
                if path is None:
                    continue
                if self._version is None:
                    self._relist(path)
                self._watch(path)
                backoff = 1.0
            except Gone:
                log.info("%s: resourceVersion %s is gone; listing again", self.watched.describe(), self._version)
                self._version = None
            except Exception as exc:  # noqa: BLE001 - an informer outlives any one failure
                if self._stop.is_set():
                    return
                self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                log.warning("%s: %s; retrying in %.0fs", self.watched.describe(), self.last_error, backoff)
                self._stop.wait(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, 30.0)

    def _path(self) -> str | None:
        """The kind's URL path, or None (after waiting) while the cluster does not serve it."""
        try:
            resource = self._dyn.resources.get(api_version=self.watched.api_version, kind=self.watched.kind)
        except ResourceNotFoundError:
            if self.served or not self.synced.is_set():
                log.info("%s: not served by this cluster; looking again in %.0fs", self.watched.describe(),
                         self._rediscover)
            self.served = False
            self._replace({}, tell=True)
            self._version = None
            self.synced.set()
            self._wake.wait(self._rediscover)
            self._wake.clear()
            return None
        self.served = True
        path: str = resource.path(namespace=self.watched.namespace)
        return path

    def _get(self, path: str, query: list[tuple[str, Any]], read_timeout: float) -> Any:
        return raw_get(self._dyn.client, path, query, read_timeout)

    def _selectors(self) -> list[tuple[str, Any]]:
        return [(k, v) for k, v in (("labelSelector", self.watched.label_selector),
                                    ("fieldSelector", self.watched.field_selector)) if v]

    def _relist(self, path: str) -> None:
        objects: dict[Key, dict[str, Any]] = {}
        token: str | None = None
        while True:
            query = [*self._selectors(), ("limit", PAGE), *([("continue", token)] if token else [])]
            body = json.loads(self._get(path, query, 60).data)
            for obj in body.get("items") or []:
                obj.setdefault("apiVersion", self.watched.api_version)
                obj.setdefault("kind", self.watched.kind)
                obj = self._trimmed(obj)
                objects[key_of(obj)] = obj
            token = (body.get("metadata") or {}).get("continue")
            if not token:
                break
        self.lists += 1
        self._replace(objects, tell=self.synced.is_set())
        self._version = (body.get("metadata") or {}).get("resourceVersion")
        self.last_error = None
        self.synced.set()

    def _watch(self, path: str) -> None:
        seconds = random.randint(*self._watch_seconds)
        query = [*self._selectors(), ("watch", "true"), ("allowWatchBookmarks", "true"),
                 ("resourceVersion", self._version), ("timeoutSeconds", seconds)]
        self._response = self._get(path, query, seconds + 30)
        try:
            for event_type, obj in self._events(self._response):
                if self._stop.is_set():
                    return
                if event_type == "ERROR":
                    if obj.get("code") == 410:
                        raise Gone()
                    raise RuntimeError(f"watch error: {obj.get('message') or obj}")
                self._version = (obj.get("metadata") or {}).get("resourceVersion") or self._version
                if event_type == "BOOKMARK":
                    continue
                obj = self._trimmed(obj)
                with self._lock:
                    if event_type == "DELETED":
                        self._drop(key_of(obj))
                    elif self._view is not None and _same_but_version(self._store.get(key_of(obj)), obj):
                        continue  # the part we keep is unchanged: keep the object at its version
                    else:
                        self._put(obj)
                self._tell(event_type, obj)
        finally:
            self._response = None

    @staticmethod
    def _events(response: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        for line in iter_resp_lines(response):
            event = json.loads(line)
            yield event.get("type", ""), event.get("object") or {}

    # ---- the store ------------------------------------------------------------------------------

    def _trimmed(self, obj: dict[str, Any]) -> dict[str, Any]:
        if self._view is not None:
            return self._view(obj)
        meta = obj.get("metadata") or {}
        if self.watched.keep_managed_fields or "managedFields" not in meta:
            return obj
        return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}

    def _put(self, obj: dict[str, Any]) -> None:
        self.revision += 1
        key = key_of(obj)
        self._drop(key)
        self._store[key] = obj
        if self._index_of is not None and (value := self._index_of(obj)) is not None:
            self._index.setdefault(value, {})[key] = obj

    def _drop(self, key: Key) -> None:
        self.revision += 1
        old = self._store.pop(key, None)
        if old is not None and self._index_of is not None and (value := self._index_of(old)) is not None:
            bucket = self._index.get(value) or {}
            bucket.pop(key, None)
            if not bucket:
                self._index.pop(value, None)

    def _replace(self, objects: dict[Key, dict[str, Any]], tell: bool) -> None:
        """Swap the whole store for a fresh list; with `tell`, report what the list changed."""
        with self._lock:
            before = self._store
            self._store, self._index = {}, {}
            self.revision += 1
            for obj in objects.values():
                self._put(obj)
        if not tell:
            return
        for key, obj in objects.items():
            old = before.get(key)
            if old is None:
                self._tell("ADDED", obj)
            elif (old.get("metadata") or {}).get("resourceVersion") != (obj.get("metadata") or {}).get(
                    "resourceVersion"):
                self._tell("MODIFIED", obj)
        for key, old in before.items():
            if key not in objects:
                self._tell("DELETED", old)

    def _tell(self, event_type: str, obj: dict[str, Any]) -> None:
        if self._listener is None:
            return
        try:
            self._listener(event_type, obj)
        except Exception:
            log.exception("%s: listener failed", self.watched.describe())
