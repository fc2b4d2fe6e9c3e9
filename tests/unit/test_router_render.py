"""The router: which routers a deployment gets, what they select (the leaders of one role, of one
revision for P/D, found by the router itself), one Deployment per P/D revision with a pair, the
identity they watch pods with, their policies, probes, hardening and resources."""

from __future__ import annotations

import copy
from itertools import takewhile
from typing import Any

import pytest
from pydantic import ValidationError

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.planner import Plan, plan_deployment, pool_facts
from kimik3_operator.render import Owner, render_serving, render_weights
from kimik3_operator.render.router import ADD_WAIT_SECONDS, router_replicas
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


def _routers(plan: Plan, pairs: dict[str, int] | None = None, owner: Owner = OWNER) -> dict[str, dict[str, Any]]:
    """Name -> Deployment of every router rendered, their Services checked along the way."""
    objs = render_serving(owner, plan, routers=pairs)
    deployments = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}
    services = {o["metadata"]["name"]: o for o in objs
                if o["kind"] == "Service" and o["metadata"]["labels"]["app.kubernetes.io/component"] == "router"}
    assert services.keys() == {d["metadata"]["labels"]["serving.kimik3.dev/router"] for d in deployments.values()}
    return deployments


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    """The router's container (beside it, the front: render/front.py)."""
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "router")  # type: ignore[no-any-return]


def _values(args: list[str], flag: str) -> list[str]:
    """Every value given to `flag`; a selector's pairs, whether given as one `k=v,...` (kimik3-router)
    or one each up to the next flag (vllm-router, nargs=+)."""
    if flag.endswith("selector"):
        given = takewhile(lambda a: not a.startswith("--"), args[args.index(flag) + 1:])
        return [pair for value in given for pair in value.split(",")]
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_a_pd_router_finds_the_leaders_of_its_revision_itself() -> None:
    plan = _plan(PD)
    (deployment,) = _routers(plan).values()
    assert deployment["metadata"]["name"] == f"k3-router-{plan.compat_hash[:10]}"
    args = _container(deployment)["args"]
    assert _values(args, "--namespace") == ["inference"] and _values(args, "--mode") == ["pd"]
    assert _values(args, "--engine-port") == ["8000"]
    common = ["app.kubernetes.io/managed-by=kimik3-operator", "serving.kimik3.dev/deployment=k3"]
    for role in ("prefill", "decode"):
        assert _values(args, f"--{role}-selector") == [
            *common, f"serving.kimik3.dev/role={role}", "leaderworkerset.sigs.k8s.io/worker-index=0",
            f"serving.kimik3.dev/compat-hash={plan.compat_hash}"]
        assert f"--{role}" not in args  # no static list: nothing to restart for
    assert "--policy" not in args and "--selector" not in args
    assert _values(args, "--served-model-name") == ["kimi-k3"]
    assert deployment["spec"]["replicas"] == 2


def test_the_watchdog_follows_the_spec_and_the_planners_prefill_rate() -> None:
    plan = _plan(PD, watchdog={"firstTokenSeconds": 12, "idleGapSeconds": 7})
    args = _container(next(iter(_routers(plan).values())))["args"]
    assert (_values(args, "--first-token-timeout-secs"), _values(args, "--idle-gap-timeout-secs")) == (["12"], ["7"])
    prefill = next(r for p in plan.pools for r in p.roles if r.role == "prefill")
    tokens = KimiK3Deployment.model_validate(PD).spec.workload
    expected = prefill.predicted["prefillRequestsPerSecond"] * (tokens.input_tokens if tokens else 8192)
    assert _values(args, "--prefill-tokens-per-sec") == [str(int(expected))]
    assert _values(args, "--request-timeout-secs") == ["1800"]  # the front's answer timeout


def test_the_vllm_router_fallback_renders_its_own_command_line() -> None:
    plan = _plan(PD, implementation="VllmRouter")
    (deployment,) = _routers(plan).values()
    container = _container(deployment)
    assert container["image"] == "ghcr.io/kimik3-operator/vllm-router:0.1.17"
    args = container["args"]
    assert "--service-discovery" in args and _values(args, "--service-discovery-port") == ["8000"]
    assert "--vllm-pd-disaggregation" in args and _values(args, "--kv-connector") == ["nixl"]
    assert _values(args, "--decode-selector")[-1] == f"serving.kimik3.dev/compat-hash={plan.compat_hash}"
    assert _values(args, "--worker-startup-timeout-secs") == [str(ADD_WAIT_SECONDS)]
    assert ADD_WAIT_SECONDS <= 30  # one unreachable Ready pod stalls every add behind it this long
    assert _values(args, "--prometheus-host") == ["0.0.0.0"]
    # the same template but for the router: its serving pods unchanged
    serving = [[o for o in render_serving(OWNER, p) if o["kind"] == "LeaderWorkerSet"] for p in (_plan(PD), plan)]
    assert serving[0] == serving[1]


def test_the_router_never_depends_on_which_engines_are_ready() -> None:
    """Scaling, crashes and replacements change pods, never the router: its Deployment is the same
    whatever the pairs of its own revision, but for the replica count."""
    plan = _plan(PD)
    base = _routers(plan)
    for pairs in ({plan.compat_hash: 1}, {plan.compat_hash: 3}, {}):
        assert _routers(plan, pairs) == base


def test_each_revision_with_a_pair_gets_a_router_behind_the_one_service() -> None:
    plan = _plan(PD)
    objs = render_serving(OWNER, plan, routers={"0ld0ld0ld0ldhash": 3, plan.compat_hash: 1})
    deployments = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}
    (service,) = [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "k3-router"]
    assert sorted(deployments) == sorted(["k3-router-0ld0ld0ld0", f"k3-router-{plan.compat_hash[:10]}"])
    for deployment in deployments.values():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()  # the Service spreads over both
        revision = labels["serving.kimik3.dev/router-revision"]
        assert deployment["spec"]["selector"]["matchLabels"]["serving.kimik3.dev/router-revision"] == revision
        decode = _values(_container(deployment)["args"], "--decode-selector")
        assert decode[-1] == f"serving.kimik3.dev/compat-hash={revision}"
    # replicas follow the pairs each revision can route (2 in all; at least one each)
    assert deployments["k3-router-0ld0ld0ld0"]["spec"]["replicas"] == 2
    assert deployments[f"k3-router-{plan.compat_hash[:10]}"]["spec"]["replicas"] == 1


@pytest.mark.parametrize(("total", "weights", "expected"), [
    (2, {}, {"new": 2}),
    (2, {"new": 3}, {"new": 2}),
    (2, {"old": 4}, {"new": 1, "old": 2}),  # the plan's own router is never scaled to 0
    (2, {"old": 4, "new": 1}, {"new": 1, "old": 2}),
    (4, {"old": 2, "new": 2}, {"new": 2, "old": 2}),
    (4, {"old": 3, "new": 1}, {"new": 1, "old": 3}),
    (1, {"old": 1, "new": 1}, {"new": 1, "old": 1}),
    (2, {"old": 0, "new": 2}, {"new": 2}),  # no pair left: the old revision's router goes
])
def test_router_replicas_per_revision(total: int, weights: dict[str, int], expected: dict[str, int]) -> None:
    assert router_replicas(total, weights, "new") == expected


def test_a_mixed_deployment_gets_a_pd_router_and_an_aggregated_one() -> None:
    plan = _plan(MIXED)
    routers = _routers(plan)
    assert sorted(routers) == sorted([f"k3-router-{plan.compat_hash[:10]}", "k3-router-aggregated"])
    pd = _container(routers[f"k3-router-{plan.compat_hash[:10]}"])["args"]
    aggregated = _container(routers["k3-router-aggregated"])["args"]
    assert "--selector" not in pd
    assert _values(aggregated, "--mode") == ["aggregated"] and "--prefill-selector" not in aggregated
    assert _values(aggregated, "--selector") == [
        "app.kubernetes.io/managed-by=kimik3-operator", "serving.kimik3.dev/deployment=k3",
        "serving.kimik3.dev/role=aggregated", "leaderworkerset.sigs.k8s.io/worker-index=0"]  # any revision


def test_the_routers_may_watch_pods_in_their_namespace_and_nothing_else() -> None:
    plan = _plan(MIXED)
    objs = {(o["kind"], o["metadata"]["name"]): o for o in render_weights(OWNER, plan)}
    role = objs[("Role", "k3-router")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    binding = objs[("RoleBinding", "k3-router")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "k3-router", "namespace": "inference"}]
    assert binding["roleRef"]["name"] == "k3-router"
    assert objs[("ServiceAccount", "k3-router")]["automountServiceAccountToken"] is False  # only where asked
    for deployment in _routers(plan).values():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "k3-router" and pod["automountServiceAccountToken"] is True
    assert not [o for o in render_weights(OWNER, _plan(MIXED, replicas=0)) if o["metadata"]["name"] == "k3-router"]


def test_no_router_replicas_renders_no_router() -> None:
    assert _routers(_plan(MIXED, replicas=0)) == {}


def test_policies_are_the_routers_own_words() -> None:
    (pd,) = _routers(_plan(PD, prefillPolicy="RoundRobin", decodePolicy="StickyLeastLoaded")).values()
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


def _front(deployment: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "front")  # type: ignore[no-any-return]


def test_probes_and_the_add_wait() -> None:
    (deployment,) = _routers(_plan(PD)).values()
    container, front = _container(deployment), _front(deployment)
    # ready only with a healthy engine of each kind (/health says 200 with none at all), through the front
    assert front["readinessProbe"]["httpGet"] == {"path": "/readiness", "port": "http"}
    assert "readinessProbe" not in container
    assert container["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": "http"}
    assert front["livenessProbe"]["httpGet"] == {"path": "/front/healthz", "port": "front-metrics"}
    assert "startupProbe" not in container  # it listens at once: nothing to wait for
    # the router on the pod's loopback only, behind the front; its metrics on every address
    args = container["args"]
    assert (_values(args, "--host"), _values(args, "--port")) == (["127.0.0.1"], ["8001"])
    assert _values(args, "--metrics-host") == ["0.0.0.0"]
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [("metrics", 29000)]
    assert [(p["name"], p["containerPort"]) for p in front["ports"]] == [("http", 8000), ("front-metrics", 29001)]


def test_the_api_key_comes_from_its_secret_and_admission_from_the_spec() -> None:
    (deployment,) = _routers(_plan(PD, apiKey={"name": "clients", "key": "k"},
                                   admission={"maxConcurrentRequests": 7, "queueSize": 3})).values()
    env = {e["name"]: e for e in _front(deployment)["env"]}
    assert env["KIMIK3_API_KEY"] == {"name": "KIMIK3_API_KEY",
                                     "valueFrom": {"secretKeyRef": {"name": "clients", "key": "k"}}}
    config = env["KIMIK3_FRONT_CONFIG"]["value"]
    assert "secure_memcmp(txn.expected)" in config and "maxconn 7" in config and "queue(router) ge 3" in config
    (plain,) = _routers(_plan(PD)).values()
    config = next(e["value"] for e in _front(plain)["env"] if e["name"] == "KIMIK3_FRONT_CONFIG")
    assert "KIMIK3_API_KEY" not in config and "ge 128" not in config
    assert "server router 127.0.0.1:8001\n" in config  # no limit on the router's slots


def test_the_router_is_hardened() -> None:
    (deployment,) = _routers(_plan(PD)).values()
    pod = deployment["spec"]["template"]["spec"]
    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    for container in (_container(deployment), _front(deployment)):
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                "capabilities": {"drop": ["ALL"]}}
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    # a terminating router pod gets the engines' drain budget for its streams, after the preStop
    # pause: the front stops accepting first (HAProxy's soft stop), the router 2 s later
    assert pod["terminationGracePeriodSeconds"] == 10 + 2 + 300
    assert _container(deployment)["lifecycle"]["preStop"] == {"sleep": {"seconds": 12}}
    assert "sleep 10; kill -USR1 1" in _front(deployment)["lifecycle"]["preStop"]["exec"]["command"][2]


def test_resources_default_and_follow_the_spec() -> None:
    (router,) = _routers(_plan(PD)).values()
    default = _container(router)["resources"]
    assert default == {"requests": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "256Mi"},
                       "limits": {"memory": "2Gi", "ephemeral-storage": "1Gi"}}
    plan = _plan(PD, resources={"requests": {"cpu": "500m"}, "limits": {"cpu": "4", "memory": "3Gi"}})
    (router,) = _routers(plan).values()
    assert _container(router)["resources"] == {
        "requests": {"cpu": "500m", "memory": "1Gi", "ephemeral-storage": "256Mi"},
        "limits": {"cpu": "4", "memory": "3Gi", "ephemeral-storage": "1Gi"}}


def test_the_service_fronts_the_router_pods() -> None:
    objs = render_serving(OWNER, _plan(PD))
    (service,) = [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "k3-router"]
    (deployment,) = [o for o in objs if o["kind"] == "Deployment"]
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("http", 8000, "http"), ("metrics", 29000, "metrics"), ("front-metrics", 29001, "front-metrics")]
    assert service["spec"]["selector"].items() <= deployment["spec"]["selector"]["matchLabels"].items()
    template = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= template.items()


def test_long_names_stay_valid_service_names_and_distinct() -> None:
    owner = Owner(name="k" * 70, namespace="inference", uid="u")
    names = [d["metadata"]["labels"]["serving.kimik3.dev/router"] for d in _routers(_plan(MIXED), owner=owner).values()]
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


def test_router_pods_run_where_the_spec_places_them_and_nowhere_in_particular_by_default() -> None:
    """spec.router's nodeSelector and tolerations go to every router pod (each P/D revision and the
    aggregated router); a spec without them renders neither field, so upgrading adds no rollout."""
    toleration = {"key": "example.com/cpu-pool", "operator": "Exists", "effect": "NoSchedule"}
    placed = _plan(MIXED, nodeSelector={"pool": "cpu"}, tolerations=[toleration])
    deployments = _routers(placed, pairs={placed.compat_hash: 1, "0123456789abcdef": 1})
    assert len(deployments) == 3  # two P/D revisions and the aggregated router
    for deployment in deployments.values():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"pool": "cpu"}
        assert pod["tolerations"] == [toleration]
    for deployment in _routers(_plan(MIXED)).values():
        assert not {"nodeSelector", "tolerations"} & deployment["spec"]["template"]["spec"].keys()
    # Serving pods keep their pools' placement: the router's is the router's alone.
    serving = [o for o in render_serving(OWNER, placed) if o["kind"] == "LeaderWorkerSet"]
    assert serving and all(o["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"].get("nodeSelector")
                           != {"pool": "cpu"} for o in serving)


def _engine_env(plan: Plan) -> list[dict[str, dict[str, str]]]:
    """Per LeaderWorkerSet: its leader's and its workers' env, by name."""
    out = []
    for lws in (o for o in render_serving(OWNER, plan) if o["kind"] == "LeaderWorkerSet"):
        template = lws["spec"]["leaderWorkerTemplate"]
        pods = [template.get("leaderTemplate") or template["workerTemplate"], template["workerTemplate"]]
        out += [{e["name"]: e for e in pod["spec"]["containers"][0]["env"]} for pod in pods]
    return out


@pytest.mark.parametrize(("limit", "engine"), [
    (None, None),  # the default 30Mi: the engines keep vLLM's 32 MiB, their templates untouched
    ("30Mi", None),
    ("64Mi", str(66 * 2**20)),  # the front's figure plus what the router adds
    ("1Mi", None),
])
def test_one_body_limit_at_the_front_the_router_and_the_engines(limit: str | None, engine: str | None) -> None:
    plan = _plan(PD, **({"admission": {"maxRequestBytes": limit}} if limit else {}))
    expected = str((int(limit[:-2]) if limit else 30) * 2**20)
    (deployment,) = _routers(plan).values()
    assert _values(_container(deployment)["args"], "--max-payload-size") == [expected]
    config = next(e["value"] for e in _front(deployment)["env"] if e["name"] == "KIMIK3_FRONT_CONFIG")
    assert f"if {{ req.hdr_val(content-length) gt {expected} }}" in config
    # the refusal comes before the front waits for the body, and the wait before a router slot
    assert config.index("status 413") < config.index("wait-for-body") < config.index("default_backend router")
    given = [env.get("VLLM_HTTP_MAX_REQUEST_BODY_SIZE", {}).get("value") for env in _engine_env(plan)
             if "VLLM_USE_RUST_FRONTEND" in env]
    assert given and set(given) == {engine}
    workers = [env for env in _engine_env(plan) if "VLLM_USE_RUST_FRONTEND" not in env]
    assert all("VLLM_HTTP_MAX_REQUEST_BODY_SIZE" not in env for env in workers)


def test_the_engines_body_limit_is_the_users_where_engine_env_sets_it() -> None:
    body = copy.deepcopy(PD)
    body["spec"].setdefault("engine", {})["env"] = [{"name": "VLLM_HTTP_MAX_REQUEST_BODY_SIZE", "value": "1000"}]
    plan = _plan(body, admission={"maxRequestBytes": "64Mi"})
    leaders = [env for env in _engine_env(plan) if "VLLM_USE_RUST_FRONTEND" in env]
    assert leaders and all(env["VLLM_HTTP_MAX_REQUEST_BODY_SIZE"]["value"] == "1000" for env in leaders)


def test_spec_router_image_replaces_the_router_and_front_image_and_nothing_else() -> None:
    from kimik3_operator.planner.images import ROUTER_IMAGE, VLLM_ROUTER_IMAGE

    mirror = "registry.example.com/mirror/kimik3-router:0.1.0"
    default = _routers(_plan(PD), {_plan(PD).compat_hash: 1})
    mirrored = _routers(_plan(PD, image=mirror), {_plan(PD).compat_hash: 1})
    for routers, image in ((default, ROUTER_IMAGE), (mirrored, mirror)):
        for deployment in routers.values():
            containers = deployment["spec"]["template"]["spec"]["containers"]
            assert len(containers) == 2 and {c["image"] for c in containers} == {image}
    fallback = _routers(_plan(PD, implementation="VllmRouter"), {_plan(PD).compat_hash: 1})
    assert {c["image"] for d in fallback.values() for c in d["spec"]["template"]["spec"]["containers"]} == {
        VLLM_ROUTER_IMAGE}
    strip = [{**d, "spec": {**d["spec"], "template": "x"}, "metadata": {**d["metadata"], "annotations": {}}}
             for d in (*default.values(), *mirrored.values())]
    assert strip[: len(default)] == strip[len(default):]


def test_the_operators_router_images_apply_where_a_deployment_names_none_and_leave_the_engines_alone() -> None:
    """The chart's routerImages (`kimik3 run --router-image/--vllm-router-image`, a release's
    digests) replace the project's tags for each implementation; spec.router.image still wins; the
    compatibility hash, and so every engine, is untouched."""
    from kimik3_operator.planner.images import RouterImages

    body = copy.deepcopy(PD)
    spec = KimiK3Deployment.model_validate(body).spec
    facts = {p.name: pool_facts(p.node_selector, all_pools()) for p in spec.pools}
    pinned = RouterImages(kimik3_router="r.example/k3/kimik3-router@sha256:" + "a" * 64,
                          vllm_router="r.example/k3/vllm-router@sha256:" + "b" * 64)
    plain, released = plan_deployment(spec, facts), plan_deployment(spec, facts, router_images=pinned)
    assert [r.image for r in released.routers] == [pinned.kimik3_router] * len(plain.routers)
    assert released.compat_hash == plain.compat_hash and released.pools == plain.pools
    body["spec"]["router"] = {**body["spec"].get("router", {}), "implementation": "VllmRouter"}
    fallback = KimiK3Deployment.model_validate(body).spec
    assert {r.image for r in plan_deployment(fallback, facts, router_images=pinned).routers} == {pinned.vllm_router}
    body["spec"]["router"]["image"] = "mirror.example/vllm-router:0.1.17"
    named = KimiK3Deployment.model_validate(body).spec
    assert {r.image for r in plan_deployment(named, facts, router_images=pinned).routers} == {
        "mirror.example/vllm-router:0.1.17"}


def test_the_router_exports_spans_where_an_otlp_http_receiver_is_known() -> None:
    """spec.engine.tracing reaches kimik3-router as --otlp-traces-endpoint: routerEndpoint, else the
    engines' endpoint when it is OTLP/HTTP over plain HTTP (the router posts JSON to the same
    receiver); with gRPC and no routerEndpoint, or vllm-router, no flag (the traceparent still
    passes); the engines' sampling ratio is the router's."""
    def router_args(tracing: dict[str, Any] | None, **router: Any) -> list[str]:
        body = copy.deepcopy(PD)
        body["spec"].setdefault("engine", {})["rustFrontend"] = False
        if tracing:
            body["spec"]["engine"]["tracing"] = tracing
        (deployment, *_) = _routers(_plan(body, **router), {_plan(body, **router).compat_hash: 1}).values()
        (router,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "router"]
        return [*router.get("command", []), *router.get("args", [])]

    grpc = {"endpoint": "http://otel.monitoring:4317", "samplingRatio": 0.25}
    http = {"endpoint": "http://otel.monitoring:4318/v1/traces", "protocol": "http/protobuf"}
    assert "--otlp-traces-endpoint" not in router_args(None)
    assert "--otlp-traces-endpoint" not in router_args(grpc)
    assert "--otlp-traces-endpoint" not in router_args({**http, "endpoint": "https://otel.monitoring:4318/v1/traces"})
    # An engines' endpoint the router would refuse at start (user info) is not handed to it.
    assert "--otlp-traces-endpoint" not in router_args({**http, "endpoint": "http://u@otel.monitoring:4318/v1/traces"})
    args = router_args({**grpc, "routerEndpoint": "http://otel.monitoring:4318/v1/traces"})
    assert args[args.index("--otlp-traces-endpoint") + 1] == "http://otel.monitoring:4318/v1/traces"
    assert args[args.index("--trace-sample-ratio") + 1] == "0.25"
    args = router_args(http)
    assert args[args.index("--otlp-traces-endpoint") + 1] == "http://otel.monitoring:4318/v1/traces"
    assert "--otlp-traces-endpoint" not in " ".join(router_args(http, implementation="VllmRouter"))
    for refused in ("https://otel.monitoring:4318/v1/traces", "http://otel.monitoring:99999/v1/traces",
                    "http://u@otel.monitoring:4318/v1/traces"):
        body = copy.deepcopy(PD)
        body["spec"].setdefault("engine", {}).update(rustFrontend=False, tracing={**grpc, "routerEndpoint": refused})
        with pytest.raises(ValidationError, match="router_endpoint|routerEndpoint"):
            KimiK3Deployment.model_validate(body)
