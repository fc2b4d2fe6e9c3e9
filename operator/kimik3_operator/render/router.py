"""The router in front of the engines: kimik3-router (router/, docs/router.md), or vllm-router 0.1.17
as the fallback of spec.router.implementation, each following the pods itself; its Service, and the
identity it watches them with. What differs between the two is one row of IMPLEMENTATIONS: the
image and the command line.

Why discovery and not lists (docs/decisions/router-discovery.md): a router given static engine
lists must restart for every change of them, and every restart drops its prefix trees, load and
health, cuts streams, and flips readiness. vllm-router's Kubernetes discovery (src/service_discovery.rs)
watches the pods of its namespace and adds a pod that matches its selectors once it is Running and
Ready, and removes it as soon as it stops matching, turns unready or gets a deletionTimestamp. So the
router's template is constant: scaling, crashes and replacements change which pods are Ready, never
the router. It needs list/watch on pods in its own namespace (a Role for its own ServiceAccount; the
token is mounted in the router pod only), and it matches labels client-side.

One P/D router per revision. NIXL hands KV over only between engines of one compatibility hash, so
each revision's router selects that hash: a request is never handed across revisions, and during a
rollout the old revision's router keeps serving the old pairs while the new one serves the new. All of
them carry the one router label the Service selects, so clients see one endpoint; replicas follow each
revision's routable pairs (`router_replicas`). A revision's router goes once it is not in the weights
(no pair of it left, or retired by the rollout: reconcile/rollout.py), the plan's own revision's
never. The aggregated router pairs nothing and is one Deployment.

The discovery add path waits for each new pod's /health, one pod at a time, up to
`--worker-startup-timeout-secs` (router.rs wait_for_healthy_workers): one Ready pod it cannot reach
stalls every add behind it for that long, and a failed add is retried only on that pod's next event.
Serving pods are Ready only once vLLM answers, so `ADD_WAIT_SECONDS` is short.

Clients never reach the router itself: it listens on the pod's loopback, behind the pod's front
(render/front.py), which passes the OpenAI routes and the health checks and nothing of the router's
admin API.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..api.router_policies import ROUTER_POLICIES
from ..contract.kinds import DEPLOYMENT, ROLE, ROLE_BINDING, SERVICE, SERVICE_ACCOUNT
from ..planner import Plan, RouterPlan
from .disruption import budget
from .engine import HTTP_PORT
from .front import ANSWER_SECONDS, FRONT_PORT, ROUTER_LOOPBACK_PORT, front_container
from .front import METRICS_PORT as FRONT_METRICS_PORT
from .gateway import http_route
from .kubelet import literal
from .names import (
    LABEL_COMPAT,
    LABEL_DEPLOYMENT,
    LABEL_ROLE,
    LABEL_ROUTER,
    Owner,
    bounded,
    deployment_label,
    object_meta,
    owned_labels,
    router_name,
)
from .placement import place
from .workloads import LWS_WORKER_INDEX_LABEL

ROUTER_PORT = FRONT_PORT
"""The port of the router Service and of every router pod: the front's."""
METRICS_PORT = 29000
RUN_AS = 65532  # the router image's non-root user (images/router/Dockerfile)
COMPONENT = "router"
LABEL_REVISION = "serving.kimik3.dev/router-revision"
"""On a P/D router's pods: the compatibility hash it pairs (its Deployment's selector)."""

ADD_WAIT_SECONDS = 20
"""How long the router waits for a newly Ready engine's /health before it gives the add up; every
other add and removal waits behind it (above)."""
ROUTER_ARGS = (
    "--worker-startup-timeout-secs", str(ADD_WAIT_SECONDS), "--worker-startup-check-interval", "1",
    # One health loop over every engine (core/worker_registry.rs). Discovered engines take only the
    # interval from the command line; their threshold is the default 3 (pd_router.rs add_server,
    # health_config None), so a dead engine leaves after ~15 s unless its pod turns unready first.
    "--health-check-interval-secs", "5",
)
PROBE_PERIOD_SECONDS = 5
PRE_STOP_SECONDS = 10
"""The endpoints controller needs a moment to take a terminating router pod out of its Service
before its front stops accepting requests; the front then lets the requests it carries finish."""
ROUTER_STOP_LAG_SECONDS = 2
"""The router stops accepting this much after its front (on SIGTERM it waits for the requests it
carries, streams included, with no limit of its own: axum's graceful shutdown, src/server.rs), so
no request the front still takes finds the router gone."""

ROUTER_LOG_FILTER = "vllm_router_rs=info,vllm_router_rs::policies::consistent_hash=warn"
"""RUST_LOG of the router: its own default filter (`vllm_router_rs=<--log-level>`, src/logging.rs
init_logging, which takes RUST_LOG instead when set) with the consistent_hash policy at warn, since
vllm-router 0.1.17 logs every request's session key at info there, three lines a request
(src/policies/consistent_hash.rs:356-415): a client's x-user-id or x-session-id in the pod's logs.
The same template whatever the policies, so no policy change rolls the router for it."""

POLICY_FLAG = {p.name: p.flag for p in ROUTER_POLICIES}
"""API policy -> the router's spelling of it."""


@dataclass(frozen=True)
class RoleEndpoints:
    """The engines of one role a router sends requests to (for status: the router finds them itself)."""

    pool: str
    role: str
    addresses: tuple[str, ...]
    """Pod IPs of the role's ready leader pods."""
    compat_hash: str | None = None
    """For prefill and decode: the compatibility hash all of them carry."""


@dataclass(frozen=True)
class RouterTargets:
    """One router Deployment as it is rendered."""

    name: str
    """The router's name: its Service's, and LABEL_ROUTER on its pods (of every revision)."""
    deployment: str
    plan: RouterPlan
    compat_hash: str | None
    """P/D: the revision it pairs; None for the aggregated router."""
    replicas: int


def router_replicas(total: int, weights: Mapping[str, int], own: str) -> dict[str, int]:
    """Router replicas per P/D revision: `total` shared in proportion to each revision's routable
    pairs (`weights`: the fewest ready leaders over its paired roles), at least one for each revision
    that has a pair, and `own` (the plan's revision) always kept, with `total` while nothing else
    serves. So the Service spreads requests about as the revisions can carry them, and the plan's
    router, once it has served, is never scaled to 0."""
    serving = {h: w for h, w in weights.items() if w > 0}
    if not serving or set(serving) == {own}:
        return {own: total}
    whole = sum(serving.values())
    out = {h: max(1, round(total * w / whole)) for h, w in serving.items()}
    out.setdefault(own, 1)
    return dict(sorted(out.items()))


def router_targets(owner: Owner, plan: Plan, weights: Mapping[str, int] | None = None) -> list[RouterTargets]:
    """The plan's routers: the P/D router `<name>-router` as one Deployment per revision in
    `weights` (compatibility hash -> routable pairs; the plan's own always), the aggregated one
    `<name>-router-aggregated` when a deployment has both kinds, else `<name>-router`."""
    out = []
    for index, router in enumerate(plan.routers):
        name = router_name(owner, "" if index == 0 else f"-{router.mode.lower()}")
        if router.mode != "PrefillDecode":
            out.append(RouterTargets(name=name, deployment=name, plan=router, compat_hash=None,
                                     replicas=router.replicas))
            continue
        for revision, replicas in router_replicas(router.replicas, weights or {}, plan.compat_hash).items():
            out.append(RouterTargets(name=name, deployment=revision_deployment(name, revision), plan=router,
                                     compat_hash=revision, replicas=replicas))
    return out


def revision_deployment(router: str, revision: str) -> str:
    return bounded(f"{router}-{revision[:10]}", 253)


def router_url(owner: Owner, name: str) -> str:
    return f"http://{name}.{owner.namespace}.svc:{ROUTER_PORT}"


def engine_selector(owner: Owner, role: str, compat_hash: str | None) -> list[str]:
    """What the router matches a pod's labels against (every pair, equality, client-side): the
    leaders (worker index 0; the headless workers serve no HTTP) of one role of this deployment,
    and for P/D of one revision."""
    pairs = {**owned_labels(owner), LABEL_ROLE: role,
             LWS_WORKER_INDEX_LABEL: "0", **({LABEL_COMPAT: compat_hash} if compat_hash else {})}
    return [f"{k}={v}" for k, v in pairs.items()]


def kimik3_router_args(owner: Owner, targets: RouterTargets) -> list[str]:
    """kimik3-router's arguments (the image's ENTRYPOINT, docs/router.md): on the pod's loopback for
    the front, its metrics on every address; the engines found by a watch of the pods with
    server-side label selectors (one flag per role, `k=v,...`); the body cap and the request
    timeout the front's; the drain the engines' own; the watchdog's deadlines from the spec and the
    slowest prefill rate the planner predicts for the roles it routes to; how often a stream may move
    to another engine mid-way."""
    plan = targets.plan
    policy = {role: POLICY_FLAG[name] for role, name in plan.policies}
    args = ["--host", "127.0.0.1", "--port", str(ROUTER_LOOPBACK_PORT),
            "--metrics-host", "0.0.0.0", "--metrics-port", str(METRICS_PORT),
            # A user's string: escaped from the kubelet's $(VAR) expansion, as the engines' copy is.
            "--served-model-name", literal(plan.served_name), "--namespace", owner.namespace,
            "--engine-port", str(HTTP_PORT),
            "--max-payload-size", str(plan.front.max_request_bytes), "--request-timeout-secs", str(ANSWER_SECONDS),
            "--drain-secs", str(plan.drain_seconds), "--first-token-timeout-secs", str(plan.first_token_seconds),
            "--idle-gap-timeout-secs", str(plan.idle_gap_seconds), "--max-migrations", str(plan.max_migrations)]
    if plan.prefill_tokens_per_second is not None:
        args += ["--prefill-tokens-per-sec", str(plan.prefill_tokens_per_second)]
    if plan.traces is not None:
        url, ratio = plan.traces
        args += ["--otlp-traces-endpoint", literal(url), "--trace-sample-ratio", str(ratio),
                 "--trace-service-name", "kimi-k3-router"]
    if plan.mode == "PrefillDecode":
        return [*args, "--mode", "pd", "--prefill-policy", policy["prefill"], "--decode-policy", policy["decode"],
                "--prefill-selector", ",".join(engine_selector(owner, "prefill", targets.compat_hash)),
                "--decode-selector", ",".join(engine_selector(owner, "decode", targets.compat_hash))]
    return [*args, "--mode", "aggregated", "--policy", policy["aggregated"],
            "--selector", ",".join(engine_selector(owner, "aggregated", None))]


def vllm_router_args(owner: Owner, targets: RouterTargets) -> list[str]:
    """vllm-router's arguments (the image's ENTRYPOINT is vllm-router). It serves on the pod's
    loopback only, for the front; its metrics listener (metrics only) binds every address. Each
    selector is one flag with all its pairs: the router's launcher keeps only the last of a repeated
    flag (py_src/vllm_router/router_args.py)."""
    policy = {role: POLICY_FLAG[name] for role, name in targets.plan.policies}
    args = ["--host", "127.0.0.1", "--port", str(ROUTER_LOOPBACK_PORT),
            "--prometheus-host", "0.0.0.0", "--prometheus-port", str(METRICS_PORT),
            "--service-discovery", "--service-discovery-namespace", owner.namespace,
            "--service-discovery-port", str(HTTP_PORT), *ROUTER_ARGS,
            # The front refuses a larger body by its Content-Length; this catches a chunked one.
            "--max-payload-size", str(targets.plan.front.max_request_bytes)]
    if targets.plan.mode == "PrefillDecode":
        return [*args, "--vllm-pd-disaggregation", "--kv-connector", "nixl",
                "--prefill-policy", policy["prefill"], "--decode-policy", policy["decode"],
                "--prefill-selector", *engine_selector(owner, "prefill", targets.compat_hash),
                "--decode-selector", *engine_selector(owner, "decode", targets.compat_hash)]
    return [*args, "--policy", policy["aggregated"], "--selector", *engine_selector(owner, "aggregated", None)]


@dataclass(frozen=True)
class Implementation:
    """What a router implementation renders: its arguments and its log filter (RUST_LOG)."""

    args: Callable[[Owner, RouterTargets], list[str]]
    log_filter: str


IMPLEMENTATIONS: dict[str, Implementation] = {
    "KimiK3Router": Implementation(kimik3_router_args, "info"),  # logs no session key at info (docs/router.md)
    "VllmRouter": Implementation(vllm_router_args, ROUTER_LOG_FILTER),
}
"""spec.router.implementation -> how it is rendered (its image: RouterPlan.image, planner/router.py)."""


def router_args(owner: Owner, targets: RouterTargets) -> list[str]:
    return IMPLEMENTATIONS[targets.plan.implementation].args(owner, targets)


def service_account(owner: Owner) -> str:
    return bounded(f"{owner.name}-router", 253)


def router_identity(owner: Owner, plan: Plan) -> list[dict[str, Any]]:
    """The routers' ServiceAccount, and a Role that lets it list and watch pods in its namespace,
    nothing else: all vllm-router's discovery asks for (src/service_discovery.rs, Api::namespaced)."""
    if not plan.routers:
        return []
    name = service_account(owner)
    meta = object_meta(owner, name, None, None)
    return [
        {**SERVICE_ACCOUNT.type_meta(), "metadata": meta, "automountServiceAccountToken": False},
        {**ROLE.type_meta(), "metadata": meta,
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]},
        {**ROLE_BINDING.type_meta(), "metadata": meta,
         "roleRef": {"apiGroup": ROLE.group, "kind": ROLE.kind, "name": name},
         "subjects": [{"kind": SERVICE_ACCOUNT.kind, "name": name, "namespace": owner.namespace}]},
    ]


def _meta(owner: Owner, name: str, targets: RouterTargets | None = None) -> dict[str, Any]:
    meta = object_meta(owner, name, None, None)
    meta["labels"].update({"app.kubernetes.io/component": COMPONENT, LABEL_ROUTER: name})
    if targets is not None and targets.compat_hash:
        meta["labels"][LABEL_REVISION] = targets.compat_hash
    return meta


def pod_selector(owner: Owner, name: str) -> dict[str, str]:
    """What the router's Service selects: its pods of every revision."""
    return {LABEL_DEPLOYMENT: deployment_label(owner), LABEL_ROUTER: name}


def router_service(owner: Owner, name: str) -> dict[str, Any]:
    return {
        **SERVICE.type_meta(),
        "metadata": _meta(owner, name),
        "spec": {
            "type": "ClusterIP",
            "selector": pod_selector(owner, name),
            "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": "http", "protocol": "TCP"},
                      {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
                      {"name": "front-metrics", "port": FRONT_METRICS_PORT, "targetPort": "front-metrics",
                       "protocol": "TCP"}],
        },
    }


ROUTER_EPHEMERAL = ("256Mi", "1Gi")
"""Request and limit of the router's ephemeral storage."""


def router_container(owner: Owner, targets: RouterTargets) -> dict[str, Any]:
    plan = targets.plan
    # Burstable, as Dynamo's frontend and llm-d's scheduler pods are: a stateless proxy that may
    # burst on CPU. Ephemeral storage is its logs and /tmp only (read-only root filesystem).
    resources: dict[str, Any] = {"requests": {**dict(plan.requests), "ephemeral-storage": ROUTER_EPHEMERAL[0]},
                                 "limits": {**dict(plan.limits), "ephemeral-storage": ROUTER_EPHEMERAL[1]}}
    return {
        "name": COMPONENT,
        "image": plan.image,
        "args": router_args(owner, targets),
        "env": [{"name": "RUST_LOG", "value": IMPLEMENTATIONS[plan.implementation].log_filter}],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        # It listens at once (discovery runs beside the server, server.rs startup), on loopback: the
        # kubelet reaches its /liveness through the front (which answers its probes unqueued). The
        # pod's readiness is the front's probe of /readiness: a healthy engine of each kind it
        # needs (pd_router.rs); /health would say 200 with no engine at all.
        "livenessProbe": {"httpGet": {"path": "/liveness", "port": "http"}, "periodSeconds": PROBE_PERIOD_SECONDS,
                          "timeoutSeconds": 5, "failureThreshold": 3},
        "resources": resources,
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SECONDS + ROUTER_STOP_LAG_SECONDS}}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }


def router_deployment(owner: Owner, targets: RouterTargets) -> dict[str, Any]:
    meta = _meta(owner, targets.deployment, targets)
    meta["labels"][LABEL_ROUTER] = targets.name
    selector = {**pod_selector(owner, targets.name),
                **({LABEL_REVISION: targets.compat_hash} if targets.compat_hash else {})}
    return {
        **DEPLOYMENT.type_meta(),
        "metadata": meta,
        "spec": {
            "replicas": targets.replicas,
            "selector": {"matchLabels": selector},
            # Its template never changes with the engines: a new revision is a Deployment of its own.
            "revisionHistoryLimit": 3,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": dict(meta["labels"])},
                "spec": place({
                    "serviceAccountName": service_account(owner),
                    "automountServiceAccountToken": True,  # its discovery watches the pods
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": PRE_STOP_SECONDS + ROUTER_STOP_LAG_SECONDS
                    + targets.plan.drain_seconds,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                        "weight": 100,
                        # apart from every router pod of the deployment, of any revision
                        "podAffinityTerm": {"labelSelector": {"matchLabels": pod_selector(owner, targets.name)},
                                            "topologyKey": "kubernetes.io/hostname"},
                    }]}},
                    "containers": [front_container(targets.plan, PRE_STOP_SECONDS),
                                   router_container(owner, targets)],
                    "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
                }, targets.plan.placement),
            },
        },
    }


def router_children(owner: Owner, plan: Plan, weights: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """A Service and a disruption budget per router of the plan (over its pods of every revision),
    the route from the user's Gateway to the first one's Service, and a Deployment per router and
    revision."""
    out: list[dict[str, Any]] = []
    for targets in router_targets(owner, plan, weights):
        if not any(o["kind"] == SERVICE.kind and o["metadata"]["name"] == targets.name for o in out):
            out += [router_service(owner, targets.name),
                    budget(_meta(owner, targets.name), pod_selector(owner, targets.name))]
            if targets.plan.gateway is not None:
                out.append(http_route(owner, targets.name, ROUTER_PORT, targets.plan.gateway))
        out.append(router_deployment(owner, targets))
    return out
