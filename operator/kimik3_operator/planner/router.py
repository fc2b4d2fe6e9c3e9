"""Which routers a deployment gets, and what each one routes to.

One router process is either a prefill/decode router or a load balancer, never both (its
`--worker-urls` are dropped in P/D mode, and an aggregated engine cannot act as a prefill or a
decode). So the prefill and decode roles of every pool share one P/D router (any prefill may feed
any decode of the same revision), and aggregated roles get a load-balancing router of their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..api import KimiK3DeploymentSpec, RoleName
from ..api.spec import RouterAdmission, RouterImplementation, RouterMode
from .images import PROJECT_ROUTER_IMAGES, RouterImages, router_image
from .placement import Placement, placement


@dataclass(frozen=True)
class FrontPlan:
    """What the front of each router pod lets through (render/front.py)."""

    max_concurrent: int | None = None
    """Requests passed to the router at once; None: no limit (and no queue)."""
    queue_size: int = 128
    queue_timeout_seconds: int = 30
    api_key: tuple[str, str] | None = None
    """(Secret, key) of the API key clients must send; None: none asked."""
    max_request_bytes: int = RouterAdmission().body_bytes
    """The largest request body the front passes (413 above it), and the router's own cap."""


@dataclass(frozen=True)
class GatewayPlan:
    """Where the deployment's endpoint is attached in Gateway API (render/gateway.py)."""

    name: str
    namespace: str | None
    section_name: str | None
    hostnames: tuple[str, ...] = ()


@dataclass(frozen=True)
class RouterPlan:
    mode: RouterMode
    routes: tuple[tuple[str, RoleName], ...]
    """(pool, role) of every role whose engines it sends requests to."""
    replicas: int
    policies: tuple[tuple[RoleName, str], ...]
    """(role, API policy name) per kind of engine it picks: prefill and decode, or aggregated."""
    requests: tuple[tuple[str, str], ...]
    limits: tuple[tuple[str, str], ...]
    drain_seconds: int
    """How long a terminating router may finish the streams it carries: the engines' own drain
    budget (spec.engine.shutdownTimeoutSeconds), the same promise to a client either way."""
    placement: Placement = field(default_factory=Placement)
    """Where its pods may run (spec.router's nodeSelector, tolerations and scheduling)."""
    front: FrontPlan = FrontPlan()
    gateway: GatewayPlan | None = None
    """The Gateway its Service is attached to: the first router's (the deployment's endpoint) only."""
    implementation: RouterImplementation = "KimiK3Router"
    image: str = ""
    """The router pods' image: spec.router.image, else the implementation's (planner/images.py)."""
    served_name: str = ""
    """The model name it answers /v1/models with (spec.model.servedName)."""
    first_token_seconds: int = 30
    idle_gap_seconds: int = 60
    max_migrations: int = 2
    """Times one stream may move to another engine mid-way (spec.router.migration.maxPerStream)."""
    prefill_tokens_per_second: int | None = None
    """The slowest prefill rate the planner predicts for the roles it sends prompts to (prefill, or
    aggregated), per replica at the workload's prompt length: the first-token deadline grows by the
    prompt's tokens over it. None: no prediction (the router's default)."""
    traces: tuple[str, float] | None = None
    """(OTLP/HTTP URL, sampling ratio) of the router's own spans (spec.engine.tracing); None: none."""

    @property
    def roles(self) -> tuple[RoleName, ...]:
        """The kinds of engine it needs at least one of before it can start."""
        return tuple(role for role, _ in self.policies)

    @property
    def prefill_policy(self) -> str | None:
        return dict(self.policies).get("prefill")

    @property
    def decode_policy(self) -> str | None:
        return dict(self.policies).get("decode")

    @property
    def policy(self) -> str | None:
        """The aggregated router's."""
        return dict(self.policies).get("aggregated")


def router_plans(spec: KimiK3DeploymentSpec,
                 prefill_rates: Mapping[tuple[str, RoleName], float] | None = None,
                 images: RouterImages = PROJECT_ROUTER_IMAGES) -> tuple[RouterPlan, ...]:
    """The P/D router first when there are prefill/decode roles, then the aggregated one; none
    when spec.router.replicas is 0. `prefill_rates`: prompt tokens per second per replica, by
    (pool, role), as the perf model predicts them; `images`: the operator's router images."""
    router = spec.router
    if router.replicas == 0:
        return ()
    routes = [(pool.name, role) for pool in spec.pools for role, _ in pool.roles()]
    modes: tuple[tuple[RouterMode, tuple[tuple[str, RoleName], ...], tuple[tuple[RoleName, str], ...]], ...] = (
        ("PrefillDecode", tuple(r for r in routes if r[1] != "aggregated"),
         (("prefill", router.prefill_policy), ("decode", router.decode_policy))),
        ("Aggregated", tuple(r for r in routes if r[1] == "aggregated"), (("aggregated", router.policy),)),
    )
    requests, limits = router.resources.requests, router.resources.limits
    admission, key = router.admission, router.api_key
    front = FrontPlan(max_concurrent=admission.max_concurrent_requests, queue_size=admission.queue_size,
                      queue_timeout_seconds=admission.queue_timeout_seconds,
                      api_key=(key.name, key.key) if key else None,
                      max_request_bytes=admission.body_bytes)
    gateway = (GatewayPlan(name=router.gateway.name, namespace=router.gateway.namespace,
                           section_name=router.gateway.section_name, hostnames=tuple(router.gateway.hostnames))
               if router.gateway else None)
    rates = prefill_rates or {}
    tracing = spec.engine.tracing
    url = tracing.router_traces_url if tracing and router.implementation == "KimiK3Router" else None
    traces = (url, tracing.sampling_ratio) if url and tracing else None

    def slowest(routes: tuple[tuple[str, RoleName], ...]) -> int | None:
        found = [rates[r] for r in routes if r[1] in ("prefill", "aggregated") and r in rates]
        return max(1, int(min(found))) if found else None

    return tuple(
        RouterPlan(mode=mode, routes=chosen, replicas=router.replicas, policies=policies,
                   implementation=router.implementation,
                   image=router.image or router_image(router.implementation, images),
                   served_name=spec.model.served_name,
                   first_token_seconds=router.watchdog.first_token_seconds,
                   idle_gap_seconds=router.watchdog.idle_gap_seconds, prefill_tokens_per_second=slowest(chosen),
                   max_migrations=router.migration.max_per_stream,
                   traces=traces,
                   requests=(("cpu", requests.cpu), ("memory", requests.memory)),
                   limits=tuple((k, v) for k, v in (("cpu", limits.cpu), ("memory", limits.memory)) if v is not None),
                   drain_seconds=spec.engine.shutdown_timeout_seconds,
                   placement=placement(router.node_selector, [t.wire() for t in router.tolerations],
                                       router.scheduling), front=front,
                   gateway=gateway if index == 0 else None)
        for index, (mode, chosen, policies) in enumerate((m, c, p) for m, c, p in modes if c))
