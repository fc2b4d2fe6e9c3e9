"""Who may connect to a deployment's pods (spec.network), in the wire form the renderer copies."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..api import KimiK3DeploymentSpec
from ..api.spec import NetworkPeer


@dataclass(frozen=True)
class NetworkPlan:
    clients: tuple[Mapping[str, Any], ...]
    """NetworkPolicyPeers allowed to the routers' client port; empty: the namespace's pods."""
    metrics_from: tuple[Mapping[str, Any], ...]
    """NetworkPolicyPeers allowed to the metrics ports."""


def network_plan(spec: KimiK3DeploymentSpec) -> NetworkPlan | None:
    """None when spec.network.policies is off: no NetworkPolicy rendered (and any left is pruned)."""
    network = spec.network
    if not network.policies:
        return None
    def as_given(peer: NetworkPeer) -> Mapping[str, Any]:
        # what the user wrote: an empty selector ({}: every pod) stays, nothing is filled in
        return peer.model_dump(by_alias=True, exclude_unset=True, mode="json")

    return NetworkPlan(clients=tuple(as_given(p) for p in network.clients),
                       metrics_from=tuple(as_given(p) for p in network.metrics_from))
