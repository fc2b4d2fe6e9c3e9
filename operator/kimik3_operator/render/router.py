"""The router in front of the engines: a Deployment of vllm-router 0.1.17 and its Service.

Its engines are static lists the operator keeps current: one URL per ready leader pod, passed in
as `RoleEndpoints` (the reconciler reads the pods; this stays pure). A P/D router lists prefill and
decode leaders of one compatibility hash only, so a request is never handed from a prefill of one
revision to a decode of another; switching revision is a rollout of the router itself, gated by
its readiness. The router's own Kubernetes discovery is not used: it needs list/watch on every pod
of the namespace, matches labels client-side, and blocks its watch for the whole startup timeout on
a pod it cannot reach (vllm-router 0.1.17 src/service_discovery.rs); nor could a P/D router follow
a revision switch without a restart anyway (its selectors would change).

A static router cannot start without at least one engine per list (it waits for them, then exits),
so until every kind of engine it needs has a ready leader it is rendered with no replicas, paused. Any
change of the lists restarts it: rare for engines that take many minutes to start, and the args
are sorted so an unchanged set never rewrites the Deployment.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..contract.kinds import DEPLOYMENT, SERVICE
from ..planner import Plan, RouterPlan
from ..planner.images import ROUTER_IMAGE
from .engine import HTTP_PORT
from .kubelet import literal, literals
from .names import LABEL_DEPLOYMENT, LABEL_ROUTER, Owner, deployment_label, object_meta, router_name

ROUTER_PORT = 8000
METRICS_PORT = 29000
RUN_AS = 65532  # the router image's non-root user (images/router/Dockerfile)
COMPONENT = "router"

STARTUP_TIMEOUT_SECONDS = 300
"""How long a starting router waits for one healthy engine per list before it exits (its default,
600, would hide a wrong list for ten minutes)."""
HEALTH_ARGS = (
    "--worker-startup-timeout-secs", str(STARTUP_TIMEOUT_SECONDS), "--worker-startup-check-interval", "2",
    # A dead engine stops getting requests after ~10 s instead of the defaults' 3 minutes: the
    # P/D path has no retry and no circuit breaker (src/routers/http/vllm_pd_router.rs).
    "--health-check-interval-secs", "5", "--health-failure-threshold", "2", "--health-success-threshold", "1",
)
PROBE_PERIOD_SECONDS = 5
PRE_STOP_SECONDS = 10
"""The endpoints controller needs a moment to take a terminating router out of its Service before
it stops accepting requests; on SIGTERM it then waits for the requests it carries, streams
included, with no limit of its own (axum's graceful shutdown, src/server.rs)."""

POLICY_FLAG = {
    "CacheAware": "cache_aware",
    "RoundRobin": "round_robin",
    "ConsistentHash": "consistent_hash",
    "StickyLeastLoaded": "sticky_least_loaded",
    "Random": "random",
}
"""API policy -> the router's spelling of it."""


@dataclass(frozen=True)
class RoleEndpoints:
    """The engines of one role a router may send requests to."""

    pool: str
    role: str
    addresses: tuple[str, ...]
    """Pod IPs of the role's ready leader pods."""
    compat_hash: str | None = None
    """For prefill and decode: the compatibility hash all of them carry."""


@dataclass(frozen=True)
class RouterTargets:
    """One router as it is rendered: its plan, its name and the engines it lists."""

    name: str
    plan: RouterPlan
    workers: tuple[tuple[str, tuple[str, ...]], ...]
    """(role, sorted engine URLs) per kind of engine the router picks."""
    compat_hash: str | None

    def urls(self, role: str) -> tuple[str, ...]:
        return dict(self.workers).get(role, ())

    @property
    def missing(self) -> tuple[str, ...]:
        """Kinds of engine with no ready leader: the router cannot start yet."""
        return tuple(role for role in self.plan.roles if not self.urls(role))

    @property
    def replicas(self) -> int:
        return 0 if self.missing else self.plan.replicas


def _address_key(address: str) -> tuple[int, Any]:
    ip = ipaddress.ip_address(address)
    return ip.version, ip


def engine_url(address: str) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{HTTP_PORT}"


def router_targets(owner: Owner, plan: Plan, endpoints: Iterable[RoleEndpoints] = ()) -> list[RouterTargets]:
    """The plan's routers, the first named `<name>-router`, a second `<name>-router-aggregated`."""
    endpoints = tuple(endpoints)
    out = []
    for index, router in enumerate(plan.routers):
        mine = [e for e in endpoints if (e.pool, e.role) in router.routes]
        workers = tuple(
            (role, tuple(engine_url(a) for a in sorted({a for e in mine if e.role == role for a in e.addresses},
                                                        key=_address_key)))
            for role in router.roles)
        hashes = sorted({e.compat_hash for e in mine if e.compat_hash})
        out.append(RouterTargets(
            name=router_name(owner, "" if index == 0 else f"-{router.mode.lower()}"), plan=router,
            workers=workers, compat_hash=hashes[0] if router.mode == "PrefillDecode" and hashes else None))
    return out


def router_url(owner: Owner, name: str) -> str:
    return f"http://{name}.{owner.namespace}.svc:{ROUTER_PORT}"


def router_args(targets: RouterTargets) -> list[str]:
    """vllm-router's arguments (the image's ENTRYPOINT is vllm-router). Both listeners bind every
    address: the router's defaults are loopback only. The engine URLs come from pod status, not
    from the operator: they go through `literal` like any value the kubelet must not expand."""
    policy = {role: POLICY_FLAG[name] for role, name in targets.plan.policies}
    args = ["--host", "0.0.0.0", "--port", str(ROUTER_PORT),
            "--prometheus-host", "0.0.0.0", "--prometheus-port", str(METRICS_PORT)]
    if targets.plan.mode == "PrefillDecode":
        args += ["--vllm-pd-disaggregation", "--kv-connector", "nixl",
                 "--prefill-policy", policy["prefill"], "--decode-policy", policy["decode"], *HEALTH_ARGS]
        for role in ("prefill", "decode"):
            for url in targets.urls(role):
                args += [f"--{role}", literal(url)]
        return args
    args += ["--policy", policy["aggregated"], *HEALTH_ARGS]
    if targets.urls("aggregated"):
        args += ["--worker-urls", *literals(targets.urls("aggregated"))]
    return args


def _meta(owner: Owner, name: str) -> dict[str, Any]:
    meta = object_meta(owner, name, None, None)
    meta["labels"].update({"app.kubernetes.io/component": COMPONENT, LABEL_ROUTER: name})
    return meta


def pod_selector(owner: Owner, name: str) -> dict[str, str]:
    """Immutable once the Deployment exists: only what never changes for a router."""
    return {LABEL_DEPLOYMENT: deployment_label(owner), LABEL_ROUTER: name}


def router_service(owner: Owner, targets: RouterTargets) -> dict[str, Any]:
    return {
        **SERVICE.type_meta(),
        "metadata": _meta(owner, targets.name),
        "spec": {
            "type": "ClusterIP",
            "selector": pod_selector(owner, targets.name),
            "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": "http", "protocol": "TCP"},
                      {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}],
        },
    }


ROUTER_EPHEMERAL = ("256Mi", "1Gi")
"""Request and limit of the router's ephemeral storage."""


def _probe(path: str, **extra: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": PROBE_PERIOD_SECONDS, **extra}


def router_container(targets: RouterTargets) -> dict[str, Any]:
    plan = targets.plan
    # Burstable, as Dynamo's frontend and llm-d's scheduler pods are: a stateless proxy that may
    # burst on CPU. Ephemeral storage is its logs and /tmp only (read-only root filesystem).
    resources: dict[str, Any] = {"requests": {**dict(plan.requests), "ephemeral-storage": ROUTER_EPHEMERAL[0]},
                                 "limits": {**dict(plan.limits), "ephemeral-storage": ROUTER_EPHEMERAL[1]}}
    return {
        "name": COMPONENT,
        "image": ROUTER_IMAGE,
        "args": router_args(targets),
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"},
                  {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}],
        # It listens only once one engine per list answered, so liveness waits behind a startup
        # probe as long as that wait may last; ready means an engine of each kind is healthy.
        "startupProbe": _probe("/liveness", failureThreshold=STARTUP_TIMEOUT_SECONDS // PROBE_PERIOD_SECONDS + 2),
        "livenessProbe": _probe("/liveness", timeoutSeconds=5, failureThreshold=3),
        "readinessProbe": _probe("/readiness", timeoutSeconds=2, failureThreshold=2),
        "resources": resources,
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SECONDS}}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }


def router_deployment(owner: Owner, targets: RouterTargets) -> dict[str, Any]:
    selector = pod_selector(owner, targets.name)
    meta = _meta(owner, targets.name)
    return {
        **DEPLOYMENT.type_meta(),
        "metadata": meta,
        "spec": {
            "replicas": targets.replicas,
            # With nothing to route to it is paused too: the Deployment controller then makes no
            # ReplicaSet for a template that is replaced as soon as engines are ready (one fewer
            # revision, and its status writes, per router brought up: bench/control_plane.py).
            **({"paused": True} if targets.missing else {}),
            "selector": {"matchLabels": selector},
            # Every change of the lists is a new revision: keep few, and never drop below the
            # replicas that serve (a new router is ready only once it reached its engines).
            "revisionHistoryLimit": 3,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": dict(meta["labels"])},
                "spec": {
                    "automountServiceAccountToken": False,  # it never talks to the API server
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": PRE_STOP_SECONDS + targets.plan.drain_seconds,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                        "weight": 100,
                        "podAffinityTerm": {"labelSelector": {"matchLabels": dict(selector)},
                                            "topologyKey": "kubernetes.io/hostname"},
                    }]}},
                    "containers": [router_container(targets)],
                    "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
                },
            },
        },
    }


def router_children(owner: Owner, plan: Plan, endpoints: Iterable[RoleEndpoints] = ()) -> list[dict[str, Any]]:
    """A Service and a Deployment per router of the plan."""
    out = []
    for targets in router_targets(owner, plan, endpoints):
        out += [router_service(owner, targets), router_deployment(owner, targets)]
    return out
