"""The router: which routers a deployment gets, the engine lists they carry (sorted, one revision,
none until they can start), their policies, probes, hardening and resources."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from itertools import takewhile
from typing import Any

import pytest

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.planner import Plan, plan_deployment, pool_facts
from kimik3_operator.render import Owner, RoleEndpoints, render_serving
from kimik3_operator.render.router import STARTUP_TIMEOUT_SECONDS
from tests.support.cases import load_examples
from tests.support.nodes import all_pools

OWNER = Owner(name="k3", namespace="inference", uid="u")
PD = dict(load_examples())["pd-gb300-decode-b200-prefill.yaml"]  # prefill pool b200-prefill, decode gb300-decode
MIXED = dict(load_examples())["design-reference.yaml"]  # P/D on gb300-rack-a, aggregated on b200-hgx
AGGREGATED = dict(load_examples())["gb300-aggregated-tp8.yaml"]


def _plan(body: dict[str, Any], **router: Any) -> Plan:
    body = copy.deepcopy(body)
    body["spec"]["router"] = {**body["spec"].get("router", {}), **router}
    spec = KimiK3Deployment.model_validate(body).spec
    return plan_deployment(spec, {p.name: pool_facts(p.node_selector, all_pools()) for p in spec.pools})


def _routers(plan: Plan, endpoints: Iterable[RoleEndpoints] = (), owner: Owner = OWNER) -> dict[str, dict[str, Any]]:
    """Name -> Deployment of every router rendered, its Service checked along the way."""
    objs = render_serving(owner, plan, endpoints=endpoints)
    deployments = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}
    services = {o["metadata"]["name"]: o for o in objs
                if o["kind"] == "Service" and o["metadata"]["labels"]["app.kubernetes.io/component"] == "router"}
    assert services.keys() == deployments.keys()
    return deployments


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def _values(args: list[str], flag: str) -> list[str]:
    """Every value given to `flag`: the next argument each time, or all of them up to the next flag."""
    if flag == "--worker-urls":
        return list(takewhile(lambda a: not a.startswith("--"), args[args.index(flag) + 1:]))
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


PD_READY = (RoleEndpoints("b200-prefill", "prefill", ("10.244.0.10", "10.244.0.9"), "h"),
            RoleEndpoints("gb300-decode", "decode", ("10.244.1.2",), "h"))


def test_a_pd_router_lists_every_ready_leader_sorted_by_address() -> None:
    (deployment,) = _routers(_plan(PD), PD_READY).values()
    args = _container(deployment)["args"]
    assert _values(args, "--prefill") == ["http://10.244.0.9:8000", "http://10.244.0.10:8000"]
    assert _values(args, "--decode") == ["http://10.244.1.2:8000"]
    assert "--vllm-pd-disaggregation" in args and _values(args, "--kv-connector") == ["nixl"]
    assert "--worker-urls" not in args and "--policy" not in args  # both dropped in P/D mode
    assert deployment["spec"]["replicas"] == 2


def test_the_lists_do_not_depend_on_the_order_the_pods_were_seen_in() -> None:
    shuffled = tuple(RoleEndpoints(e.pool, e.role, tuple(reversed(e.addresses)), e.compat_hash) for e in PD_READY)
    assert _routers(_plan(PD), PD_READY) == _routers(_plan(PD), reversed(shuffled))


def test_ipv6_engines_are_bracketed() -> None:
    endpoints = (RoleEndpoints("gb300-rack-a", "aggregated", ("fd00::10", "fd00::9", "10.0.0.1")),)
    (deployment,) = _routers(_plan(AGGREGATED), endpoints).values()
    assert _values(_container(deployment)["args"], "--worker-urls") == [
        "http://10.0.0.1:8000", "http://[fd00::9]:8000", "http://[fd00::10]:8000"]


@pytest.mark.parametrize(("endpoints", "replicas"), [
    ((), 0),
    (PD_READY[:1], 0),  # prefill without decode: the router would wait, then exit
    (PD_READY[1:], 0),
    ((PD_READY[0], RoleEndpoints("gb300-decode", "decode", (), "h")), 0),
    (PD_READY, 2),
])
def test_no_router_pod_until_every_kind_of_engine_has_a_ready_leader(endpoints: tuple[RoleEndpoints, ...],
                                                                     replicas: int) -> None:
    (deployment,) = _routers(_plan(PD), endpoints).values()
    assert deployment["spec"]["replicas"] == replicas


def test_a_mixed_deployment_gets_a_pd_router_and_an_aggregated_one() -> None:
    endpoints = (RoleEndpoints("gb300-rack-a", "prefill", ("10.0.0.1",), "h"),
                 RoleEndpoints("gb300-rack-a", "decode", ("10.0.0.2",), "h"),
                 RoleEndpoints("b200-hgx", "aggregated", ("10.0.1.1",)))
    routers = _routers(_plan(MIXED), endpoints)
    assert sorted(routers) == ["k3-router", "k3-router-aggregated"]
    pd, aggregated = _container(routers["k3-router"])["args"], _container(routers["k3-router-aggregated"])["args"]
    assert (_values(pd, "--prefill"), _values(pd, "--decode")) == (["http://10.0.0.1:8000"], ["http://10.0.0.2:8000"])
    assert "--worker-urls" not in pd
    assert "--vllm-pd-disaggregation" not in aggregated
    assert _values(aggregated, "--worker-urls") == ["http://10.0.1.1:8000"] and "--prefill" not in aggregated


def test_every_prefill_pool_pairs_with_every_decode_pool_in_one_router() -> None:
    body = copy.deepcopy(MIXED)
    body["spec"]["pools"][1] = {"name": "b200-hgx", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-B200"},
                                "decode": {"replicas": 1, "parallelism": {"tensor": 8, "data": 2, "expert": True}}}
    endpoints = (RoleEndpoints("gb300-rack-a", "prefill", ("10.0.0.1",), "h"),
                 RoleEndpoints("gb300-rack-a", "decode", ("10.0.0.2",), "h"),
                 RoleEndpoints("b200-hgx", "decode", ("10.0.1.1",), "h"))
    (deployment,) = _routers(_plan(body), endpoints).values()
    assert _values(_container(deployment)["args"], "--decode") == ["http://10.0.0.2:8000", "http://10.0.1.1:8000"]


def test_no_router_replicas_renders_no_router() -> None:
    assert _routers(_plan(MIXED, replicas=0), PD_READY) == {}


def test_policies_are_the_routers_own_words() -> None:
    (pd,) = _routers(_plan(PD, prefillPolicy="RoundRobin", decodePolicy="StickyLeastLoaded"), PD_READY).values()
    args = _container(pd)["args"]
    assert (_values(args, "--prefill-policy"), _values(args, "--decode-policy")) == (
        ["round_robin"], ["sticky_least_loaded"])
    (aggregated,) = _routers(_plan(AGGREGATED, policy="ConsistentHash")).values()
    assert _values(_container(aggregated)["args"], "--policy") == ["consistent_hash"]
    (default,) = _routers(_plan(AGGREGATED)).values()
    assert _values(_container(default)["args"], "--policy") == ["cache_aware"]  # prefix-aware by default


def test_policies_outside_the_list_are_refused() -> None:
    body = copy.deepcopy(PD)
    body["spec"]["router"] = {"prefillPolicy": "KvAware"}
    with pytest.raises(ValueError, match="prefillPolicy"):
        KimiK3Deployment.model_validate(body)


def test_probes_wait_as_long_as_the_router_waits_for_its_engines() -> None:
    container = _container(_routers(_plan(PD), PD_READY)["k3-router"])
    assert container["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": "http"}
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/liveness"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= STARTUP_TIMEOUT_SECONDS
    assert _values(container["args"], "--worker-startup-timeout-secs") == [str(STARTUP_TIMEOUT_SECONDS)]
    # both listeners on every address (the router's defaults are loopback only), and exposed
    args = container["args"]
    assert _values(args, "--host") == _values(args, "--prometheus-host") == ["0.0.0.0"]
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [("http", 8000), ("metrics", 29000)]


def test_the_router_is_hardened_and_has_no_api_access() -> None:
    deployment = _routers(_plan(PD), PD_READY)["k3-router"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    security = _container(deployment)["securityContext"]
    assert security == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]}}
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    # a terminating router gets the engines' drain budget for its streams, after the preStop pause
    assert pod["terminationGracePeriodSeconds"] == 10 + 300
    assert _container(deployment)["lifecycle"]["preStop"] == {"sleep": {"seconds": 10}}


def test_resources_default_and_follow_the_spec() -> None:
    default = _container(_routers(_plan(PD))["k3-router"])["resources"]
    assert default == {"requests": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "256Mi"},
                       "limits": {"memory": "2Gi", "ephemeral-storage": "1Gi"}}
    plan = _plan(PD, resources={"requests": {"cpu": "500m"}, "limits": {"cpu": "4", "memory": "3Gi"}})
    assert _container(_routers(plan)["k3-router"])["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi", "ephemeral-storage": "256Mi"},
        "limits": {"cpu": "4", "memory": "3Gi", "ephemeral-storage": "1Gi"}}


def test_the_service_fronts_the_router_pods_and_only_the_lists_roll_the_router() -> None:
    objs = render_serving(OWNER, _plan(PD), endpoints=PD_READY)
    (service,) = [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "k3-router"]
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("http", 8000, "http"), ("metrics", 29000, "metrics")]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == selector
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    moved = (PD_READY[0], RoleEndpoints("gb300-decode", "decode", ("10.244.1.3",), "h"))
    again = render_serving(OWNER, _plan(PD), endpoints=moved)
    changed = {(o["kind"], o["metadata"]["name"]) for o, p in zip(objs, again, strict=True) if o != p}
    assert changed == {("Deployment", "k3-router")}
    (new,) = [o for o in again if o["kind"] == "Deployment"]
    assert new["spec"]["selector"] == deployment["spec"]["selector"]  # immutable on a live Deployment


def test_long_names_stay_valid_service_names_and_distinct() -> None:
    owner = Owner(name="k" * 70, namespace="inference", uid="u")
    names = list(_routers(_plan(MIXED), owner=owner))
    assert len(names) == 2 and len(set(names)) == 2 and all(len(n) <= 63 for n in names)


def _leader_and_worker_commands(plan: Plan, pool: str, role: str) -> tuple[list[str], list[str] | None]:
    (lws,) = [o for o in render_serving(OWNER, plan) if o["kind"] == "LeaderWorkerSet"
              and o["metadata"]["labels"]["serving.kimik3.dev/pool"] == pool
              and o["metadata"]["labels"]["serving.kimik3.dev/role"] == role]
    template = lws["spec"]["leaderWorkerTemplate"]
    leader = (template.get("leaderTemplate") or template["workerTemplate"])["spec"]["containers"][0]["command"]
    worker = template["workerTemplate"]["spec"]["containers"][0]["command"] if "leaderTemplate" in template else None
    return leader, worker


@pytest.mark.parametrize(("router", "prefill", "decode"), [
    ({}, True, True),
    ({"decodePolicy": "RoundRobin"}, True, False),
    ({"prefillPolicy": "Random", "decodePolicy": "ConsistentHash"}, False, False),
    ({"replicas": 0}, False, False),
])
def test_engines_serve_token_ids_exactly_where_a_prefix_aware_router_asks_for_them(
        router: dict[str, Any], prefill: bool, decode: bool) -> None:
    plan = _plan(PD, **router)
    for pool, role, wanted in (("b200-prefill", "prefill", prefill), ("gb300-decode", "decode", decode)):
        leader, worker = _leader_and_worker_commands(plan, pool, role)
        assert ("--enable-scale-out" in leader) == wanted, (role, router)
        assert worker is None or "--enable-scale-out" not in worker  # headless workers serve no HTTP


def test_an_aggregated_router_that_is_cache_aware_gets_token_ids() -> None:
    leader, _ = _leader_and_worker_commands(_plan(AGGREGATED), "gb300-rack-a", "aggregated")
    assert "--enable-scale-out" in leader
    leader, _ = _leader_and_worker_commands(_plan(AGGREGATED, policy="RoundRobin"), "gb300-rack-a", "aggregated")
    assert "--enable-scale-out" not in leader
