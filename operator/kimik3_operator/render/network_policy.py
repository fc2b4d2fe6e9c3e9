"""NetworkPolicies: who may connect to a deployment's engines and routers (spec.network).

- **Engines** (every serving pod: leaders and workers of every role) accept connections from the
  deployment's own pods on any port: its routers (HTTP), their P/D peers (NIXL's side channel and
  UCX's data ports, which UCX picks at run time) and the other pods of their group (NCCL,
  torch.distributed, Gloo, also on ports picked at run time). On their HTTP port also from
  spec.network.metricsFrom: vLLM serves /metrics beside inference there, so a scraper cannot be
  let in to one without the other. Nobody else: a client inside the cluster cannot go around the
  router's front (its API key, its admission limits) to an engine.
- **Routers** accept clients on their HTTP port (the front, render/front.py) from
  spec.network.clients, by default every pod of the namespace; their metrics ports (the router's
  and the front's, metrics only) from metricsFrom, or from anywhere when it is empty, as the chart's
  own policy does for the operator's metrics.

The kubelet's probes need no rule: most network plugins always admit a pod's own node. Egress is
not restricted (the routers reach the API server, the engines their peers and storage).
"""

from __future__ import annotations

from typing import Any

from ..contract.kinds import NETWORK_POLICY
from ..planner import Plan
from .engine import HTTP_PORT
from .names import LABEL_ROLE, Owner, bounded, object_meta, owned_labels
from .router import COMPONENT as ROUTER_COMPONENT


def _policy(owner: Owner, suffix: str, pods: dict[str, Any], ingress: list[dict[str, Any]]) -> dict[str, Any]:
    return {**NETWORK_POLICY.type_meta(), "metadata": object_meta(owner, bounded(f"{owner.name}-{suffix}", 253),
                                                                  None, None),
            "spec": {"podSelector": pods, "policyTypes": ["Ingress"], "ingress": ingress}}


def network_policies(owner: Owner, plan: Plan) -> list[dict[str, Any]]:
    """The engines' policy, and the routers' when the plan has routers; none without spec.network.policies."""
    if plan.network is None:
        return []
    metrics_from = [dict(p) for p in plan.network.metrics_from]
    engines = {"matchLabels": owned_labels(owner), "matchExpressions": [{"key": LABEL_ROLE, "operator": "Exists"}]}
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": {"matchLabels": owned_labels(owner)}}]}]
    if metrics_from:
        ingress.append({"ports": [{"port": HTTP_PORT, "protocol": "TCP"}], "from": metrics_from})
    out = [_policy(owner, "engines", engines, ingress)]
    if plan.routers:
        routers = {"matchLabels": {**owned_labels(owner), "app.kubernetes.io/component": ROUTER_COMPONENT}}
        clients = [dict(p) for p in plan.network.clients] or [{"podSelector": {}}]
        out.append(_policy(owner, "routers", routers, [
            {"ports": [{"port": "http", "protocol": "TCP"}], "from": clients},
            {"ports": [{"port": "metrics", "protocol": "TCP"}, {"port": "front-metrics", "protocol": "TCP"}],
             **({"from": metrics_from} if metrics_from else {})},
        ]))
    return out
