"""Exposure through Gateway API: one HTTPRoute that attaches the deployment's endpoint (the first
router's Service) to a Gateway the user names (spec.router.gateway).

Why a route and not a Service of type LoadBalancer: the gateway the platform team runs holds TLS,
host names and its own policies, as Dynamo, llm-d, KServe and AIBrix users expose their endpoints.
The route passes every path: the router pod's front (render/front.py) keeps the allowlist, the API
key and admission, so what a client may call does not depend on which way it came in.

Its request timeout is the front's own longest answer: a gateway's default (Envoy's per-route
default is 15 s; Gateway API leaves it to the implementation) would cut long generations and
streams. The route carries no status of ours; the Gateway's controller writes whether it was
accepted.
"""

from __future__ import annotations

from typing import Any

from ..contract.kinds import HTTP_ROUTE, SERVICE
from ..planner import GatewayPlan
from .front import ANSWER_SECONDS
from .names import Owner, object_meta


def http_route(owner: Owner, service: str, port: int, gateway: GatewayPlan) -> dict[str, Any]:
    """The HTTPRoute `service` (named as the router's Service it leads to)."""
    parent: dict[str, Any] = {"group": HTTP_ROUTE.group, "kind": "Gateway", "name": gateway.name}
    if gateway.namespace:
        parent["namespace"] = gateway.namespace
    if gateway.section_name:
        parent["sectionName"] = gateway.section_name
    spec: dict[str, Any] = {
        "parentRefs": [parent],
        "rules": [{
            "backendRefs": [{"group": SERVICE.group, "kind": SERVICE.kind, "name": service, "port": port}],
            "timeouts": {"request": f"{ANSWER_SECONDS}s"},
        }],
    }
    if gateway.hostnames:
        spec["hostnames"] = list(gateway.hostnames)
    meta = object_meta(owner, service, None, None)
    meta["labels"]["app.kubernetes.io/component"] = "router"
    return {**HTTP_ROUTE.type_meta(), "metadata": meta, "spec": spec}
