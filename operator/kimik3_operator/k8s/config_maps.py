"""Reading one key of a user's ConfigMap (engine.chatTemplate), apart from Cluster's reads.

By `list` with a field selector on the name, not `get`: the operator's role already lists
ConfigMaps (charts/kimik3-operator/files/child-rules.yaml), so this needs no new permission.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes import client


@dataclass(frozen=True)
class ConfigMapKey:
    text: str | None
    """The key's value; None when the ConfigMap or the key is missing."""
    missing: str | None = None
    """What is missing, for a status message: `ConfigMap x` or `key y in ConfigMap x`."""


def read_config_map_key(api: client.ApiClient, namespace: str, name: str, key: str) -> ConfigMapKey:
    found = client.CoreV1Api(api).list_namespaced_config_map(
        namespace, field_selector=f"metadata.name={name}").items
    if not found:
        return ConfigMapKey(None, f"ConfigMap {name}")
    data = found[0].data or {}
    if key not in data:
        return ConfigMapKey(None, f"key {key} in ConfigMap {name}")
    return ConfigMapKey(data[key])
