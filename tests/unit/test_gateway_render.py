"""spec.router.gateway: one HTTPRoute from the user's Gateway to the deployment's endpoint (the first
router's Service), with the front's longest answer as its request timeout; none without a gateway;
names Gateway API refuses are refused at admission."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.planner import plan_deployment, pool_facts
from kimik3_operator.render import Owner, render_serving
from kimik3_operator.render.front import ANSWER_SECONDS
from tests.support.cases import load_examples
from tests.support.nodes import all_pools

OWNER = Owner(name="k3", namespace="inference", uid="u")
EXAMPLES = dict(load_examples())
PD = EXAMPLES["pd-gb300-decode-b200-prefill.yaml"]


def _objects(body: dict[str, Any], gateway: dict[str, Any] | None) -> list[dict[str, Any]]:
    body = copy.deepcopy(body)
    if gateway is not None:
        body["spec"]["router"] = {**body["spec"].get("router", {}), "gateway": gateway}
    spec = KimiK3Deployment.model_validate(body).spec
    plan = plan_deployment(spec, {p.name: pool_facts(p.node_selector, all_pools()) for p in spec.pools})
    return render_serving(OWNER, plan)


def _routes(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == "HTTPRoute"]


def test_no_gateway_no_route() -> None:
    assert _routes(_objects(PD, None)) == []


def test_the_route_leads_from_the_gateway_to_the_endpoint() -> None:
    objs = _objects(PD, {"name": "public", "namespace": "gateways", "sectionName": "https",
                         "hostnames": ["k3.example.com", "*.k3.example.com"]})
    (route,) = _routes(objs)
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["metadata"]["name"] == "k3-router" and route["metadata"]["namespace"] == "inference"
    assert route["metadata"]["ownerReferences"] == [OWNER.reference()]
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                            "name": "public", "namespace": "gateways", "sectionName": "https"}]
    assert route["spec"]["hostnames"] == ["k3.example.com", "*.k3.example.com"]
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    http = next(p for p in services["k3-router"]["spec"]["ports"] if p["name"] == "http")
    assert backend == {"group": "", "kind": "Service", "name": "k3-router", "port": http["port"]}
    assert "matches" not in rule  # every path: the router pod's front keeps the allowlist
    assert rule["timeouts"] == {"request": f"{ANSWER_SECONDS}s"}


def test_defaults_leave_the_gateway_to_choose() -> None:
    """No namespace, listener or host names: the route names the Gateway in its own namespace and
    takes what its listeners allow."""
    (route,) = _routes(_objects(PD, {"name": "public"}))
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                            "name": "public"}]
    assert "hostnames" not in route["spec"]


def test_a_deployment_with_both_routers_routes_to_its_endpoint() -> None:
    """P/D and aggregated roles: two routers; the route leads to the first (status.endpoint's)."""
    body = copy.deepcopy(PD)
    body["spec"]["pools"].append(copy.deepcopy(EXAMPLES["gb300-aggregated-tp8.yaml"]["spec"]["pools"][0]))
    objs = _objects(body, {"name": "public"})
    assert {o["metadata"]["name"] for o in objs if o["kind"] == "Service" and "router" in o["metadata"]["name"]} \
        == {"k3-router", "k3-router-aggregated"}
    (route,) = _routes(objs)
    assert route["spec"]["rules"][0]["backendRefs"][0]["name"] == "k3-router"


def test_no_router_no_route() -> None:
    body = copy.deepcopy(PD)
    body["spec"]["router"] = {"replicas": 0}
    assert _routes(_objects(body, {"name": "public"})) == []


@pytest.mark.parametrize("gateway", [
    {"name": "Public"}, {"name": "-gw"}, {"name": ""}, {},
    {"name": "gw", "namespace": "a.b"}, {"name": "gw", "sectionName": "HTTPS"},
    {"name": "gw", "hostnames": ["k3.example.com:443"]}, {"name": "gw", "hostnames": ["*"]},
    {"name": "gw", "hostnames": ["K3.example.com"]}, {"name": "gw", "hostnames": ["h"] * 17},
])
def test_names_gateway_api_refuses_are_refused_at_admission(gateway: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        _objects(PD, gateway)
