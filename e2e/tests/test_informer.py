"""The informers every reconcile pass reads from (k8s/informer.py), against the real API server.

They follow changes through one watch, and a watch gap is no blind spot: after a kube-apiserver
restart the old resourceVersion is gone (its watch cache starts over at etcd's current revision),
the informer lists again, and its listener hears of every object deleted, added or changed while
it was not watching, exactly once each.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import config
from kubernetes.dynamic import DynamicClient

from e2e.harness.kube import kubectl, wait_for
from kimik3_operator.k8s.informer import Informer, Watched

from .test_faults import restart_apiserver

LABEL = "e2e.kimik3.dev/informer"


@pytest.fixture()
def namespace(cluster: dict[str, str]) -> Iterator[str]:
    name = f"informer-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", name)
    yield name
    kubectl("delete", "namespace", name, "--wait=false")


def _configmap(namespace: str, name: str, value: str) -> None:
    kubectl("-n", namespace, "create", "configmap", name, f"--from-literal=v={value}")
    kubectl("-n", namespace, "label", "configmap", name, f"{LABEL}=yes")


class Heard:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, event_type: str, obj: dict[str, Any]) -> None:
        with self._lock:
            self.events.append((event_type, obj["metadata"]["name"]))

    def take(self) -> list[tuple[str, str]]:
        with self._lock:
            out, self.events = self.events, []
            return out


def _informer(namespace: str, heard: Heard) -> Informer:
    dyn = DynamicClient(config.new_client_from_config(config_file=os.environ["KUBECONFIG"]))
    return Informer(dyn, Watched("v1", "ConfigMap", namespace, f"{LABEL}=yes"), listener=heard,
                    watch_seconds=(20, 30)).start()


def _names(informer: Informer) -> dict[str, str]:
    return {o["metadata"]["name"]: o["data"]["v"] for o in informer.items()}


def test_an_informer_follows_adds_changes_and_deletes(namespace: str) -> None:
    heard = Heard()
    _configmap(namespace, "a", "1")
    informer = _informer(namespace, heard)
    try:
        assert informer.synced.wait(30)
        assert _names(informer) == {"a": "1"} and heard.take() == []  # the first list tells nothing
        _configmap(namespace, "b", "1")
        kubectl("-n", namespace, "patch", "configmap", "a", "-p", '{"data":{"v":"2"}}')
        kubectl("-n", namespace, "delete", "configmap", "b")
        kubectl("-n", namespace, "create", "configmap", "unlabelled", "--from-literal=v=0")
        wait_for("the informer to follow", lambda: _names(informer) == {"a": "2"}, timeout=30)
        events = wait_for("the listener to hear the delete", lambda: (e := heard.take()) and ("DELETED", "b") in e
                          and e, timeout=30)
        assert ("MODIFIED", "a") in events and all(name != "unlabelled" for _, name in events)
        assert informer.lists == 1
    finally:
        informer.stop()


def test_a_watch_gap_is_listed_again_and_every_change_in_it_is_heard(namespace: str) -> None:
    heard = Heard()
    for name in ("kept", "changed", "deleted"):
        _configmap(namespace, name, "1")
    informer = _informer(namespace, heard)
    try:
        assert informer.synced.wait(30)
        assert set(_names(informer)) == {"kept", "changed", "deleted"}
    finally:
        informer.stop()  # the gap: store and resourceVersion kept, nobody watching
    kubectl("-n", namespace, "patch", "configmap", "changed", "-p", '{"data":{"v":"2"}}')
    kubectl("-n", namespace, "delete", "configmap", "deleted")
    _configmap(namespace, "added", "1")
    restart_apiserver(crash=False)  # the gap's resourceVersion is no longer in the watch cache
    heard.take()
    informer.start()
    try:
        wait_for("a list after the gap", lambda: informer.lists == 2, timeout=60)
        assert _names(informer) == {"kept": "1", "changed": "2", "added": "1"}
        assert sorted(heard.take()) == [("ADDED", "added"), ("DELETED", "deleted"), ("MODIFIED", "changed")]
    finally:
        informer.stop()
