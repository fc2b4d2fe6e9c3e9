"""spec.network: the engines admit the deployment's own pods (and scrapers on their HTTP port), the
routers admit the clients the spec names (the namespace by default) on their front's port; the
selectors pick exactly the pods each policy is about, matched here the way the API server matches them."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.planner import plan_deployment, pool_facts
from kimik3_operator.render import Owner, render_serving
from tests.support.cases import load_examples
from tests.support.nodes import all_pools

OWNER = Owner(name="k3", namespace="inference", uid="u")
PD = dict(load_examples())["pd-gb300-decode-b200-prefill.yaml"]
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def _objects(network: dict[str, Any] | None = None, **router: Any) -> list[dict[str, Any]]:
    body = copy.deepcopy(PD)
    if network is not None:
        body["spec"]["network"] = network
    body["spec"]["router"] = {**body["spec"].get("router", {}), **router}
    spec = KimiK3Deployment.model_validate(body).spec
    plan = plan_deployment(spec, {p.name: pool_facts(p.node_selector, all_pools()) for p in spec.pools})
    return render_serving(OWNER, plan)


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector as the API server evaluates it."""
    ok = all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())
    for e in selector.get("matchExpressions") or []:
        present, value = e["key"] in labels, labels.get(e["key"])
        ok &= {"Exists": present, "DoesNotExist": not present, "In": value in e.get("values", []),
               "NotIn": value not in e.get("values", [])}[e["operator"]]
    return ok


def _pod_labels(objs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Every pod template's labels: LWS leader and worker templates, router Deployments."""
    out = {}
    for o in objs:
        if o["kind"] == "LeaderWorkerSet":
            t = o["spec"]["leaderWorkerTemplate"]
            for part in ("leaderTemplate", "workerTemplate"):
                if part in t:
                    out[f"{o['metadata']['name']}/{part}"] = t[part]["metadata"]["labels"]
        elif o["kind"] == "Deployment":
            out[o["metadata"]["name"]] = o["spec"]["template"]["metadata"]["labels"]
    return out


def test_engines_admit_their_own_deployment_and_routers_the_namespace_by_default() -> None:
    objs = _objects()
    policies = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "NetworkPolicy"}
    assert set(policies) == {"k3-engines", "k3-routers"}
    pods = _pod_labels(objs)
    engines = {n for n, labels in pods.items() if _matches(policies["k3-engines"]["podSelector"], labels)}
    routers = {n for n, labels in pods.items() if _matches(policies["k3-routers"]["podSelector"], labels)}
    assert engines == {n for n in pods if "/" in n} and routers == {n for n in pods if "/" not in n}
    (own,) = policies["k3-engines"]["ingress"]
    assert set(own) == {"from"}  # every port: NIXL, UCX, NCCL pick theirs at run time
    (peer,) = own["from"]
    assert all(_matches(peer["podSelector"], labels) for labels in pods.values())  # routers and peers
    assert not _matches(peer["podSelector"], {"app": "someone-else"})
    clients, metrics = policies["k3-routers"]["ingress"]
    assert clients == {"ports": [{"port": "http", "protocol": "TCP"}], "from": [{"podSelector": {}}]}
    assert "from" not in metrics  # metrics only: anywhere, as the chart's own policy
    assert {p["port"] for p in metrics["ports"]} == {"metrics", "front-metrics"}


def test_clients_and_scrapers_come_from_the_spec() -> None:
    gateway = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}},
               "podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["envoy"]}]}}
    block = {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.1.0/24"]}}
    objs = _objects({"clients": [gateway, block], "metricsFrom": [PROMETHEUS]})
    policies = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "NetworkPolicy"}
    own, scrape = policies["k3-engines"]["ingress"]
    assert scrape == {"ports": [{"port": 8000, "protocol": "TCP"}], "from": [PROMETHEUS]}
    clients, metrics = policies["k3-routers"]["ingress"]
    assert clients["from"] == [gateway, block]  # as written
    assert metrics["from"] == [PROMETHEUS]


def test_an_empty_selector_stays_empty() -> None:
    objs = _objects({"clients": [{"namespaceSelector": {}}]})
    (routers,) = [o["spec"] for o in objs if o["metadata"]["name"] == "k3-routers"]
    assert routers["ingress"][0]["from"] == [{"namespaceSelector": {}}]  # every namespace's pods


def test_policies_off_renders_none_and_no_router_no_router_policy() -> None:
    assert not [o for o in _objects({"policies": False}) if o["kind"] == "NetworkPolicy"]
    assert [o["metadata"]["name"] for o in _objects(replicas=0) if o["kind"] == "NetworkPolicy"] == ["k3-engines"]


@pytest.mark.parametrize("peer", [
    {}, {"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}, {"ipBlock": {"cidr": "not-a-cidr"}},
    {"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
    {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}},
    {"podSelector": {"matchLabels": {"bad key!": "x"}}},
])
def test_malformed_peers_are_refused_at_admission(peer: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        _objects({"clients": [peer]})
