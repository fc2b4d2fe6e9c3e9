"""Autoscaled roles in a reconcile pass: hand the replica count over to the scaler, count what runs,
and (SLO mode) run the operator's own scaler every spec.autoscaling.intervalSeconds.

The count of an autoscaled role belongs to its scaler, so the main apply leaves spec.replicas out
(render/workloads.py). Left out alone, a field the main apply owned would be reset by the API
server to the LeaderWorkerSet's default of 1; so while the main field manager still owns it, the
autoscaler's manager first applies the current count (Kubernetes' documented hand-over, "Transferring
ownership" in the server-side apply docs). A new LeaderWorkerSet is created with the planned count.
HPA and KEDA then write through /scale; the SLO scaler applies the count under the same manager.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..api.reasons import INSUFFICIENT_CAPACITY, SCALED_DOWN, SCALED_UP
from ..api.status import KimiK3DeploymentStatus, RoleAutoscalingStatus
from ..contract import timestamps
from ..contract.kinds import HORIZONTAL_POD_AUTOSCALER, SCALED_OBJECT
from ..contract.names import AUTOSCALER_FIELD_MANAGER, FIELD_MANAGER
from ..k8s import Cluster
from ..k8s.managed_fields import fields_of
from ..metrics import SCALER_DECISIONS, SCALER_REPLICAS
from ..planner import Plan, PlanningError, PoolPlan
from ..planner.autoscale import clamp
from ..planner.capacity import replicas_that_fit
from ..planner.facts import PoolFacts
from ..planner.scaling import RoleScaling, ScalingSettings
from ..planner.slo_scaler import Decision, Memory, Observation, decide, trend_range, within_ratio
from ..planner.traps import check_traps
from ..prometheus import NO_URL, Prometheus, PrometheusError
from ..render.names import Owner, workload_name
from ..render.promql import latency_query, load_query, selector, trend_query

log = logging.getLogger(__name__)

OPERATOR_SCALER = "operator"
Key = tuple[str, str]


def with_live_counts(owner: Owner, plan: Plan, workloads: Mapping[str, Mapping[str, Any]]) -> Plan:
    """The plan with each autoscaled role at the count its LeaderWorkerSet asks for now: what
    status reports as desired and what capacity is checked against."""
    pools = []
    for pool in plan.pools:
        roles = []
        for role in pool.roles:
            live = workloads.get(workload_name(owner, pool.name, role.role)) or {}
            asked = (live.get("spec") or {}).get("replicas")
            roles.append(dataclasses.replace(role, replicas=int(asked))
                         if role.autoscaling and asked is not None else role)
        pools.append(dataclasses.replace(pool, roles=tuple(roles)))
    return dataclasses.replace(plan, pools=tuple(pools))


def owns_replicas(obj: Mapping[str, Any], manager: str) -> bool:
    for entry in (obj.get("metadata") or {}).get("managedFields") or []:
        if entry.get("manager") == manager and entry.get("subresource") in (None, ""):
            if "f:replicas" in (fields_of(entry).get("f:spec") or {}):
                return True
    return False


def hand_over(cluster: Cluster, owner: Owner, plan: Plan, live: Mapping[str, Mapping[str, Any]],
              desired: list[dict[str, Any]]) -> None:
    """Before the main apply: give every autoscaled role's count to the autoscaler's manager while
    the main manager still owns it, and create a missing LeaderWorkerSet with its planned count."""
    for pool, role in plan.role_plans():
        if role.autoscaling is None:
            continue
        name = workload_name(owner, pool.name, role.role)
        obj = live.get(name)
        if obj is None:
            for child in desired:
                if child["kind"] == "LeaderWorkerSet" and child["metadata"]["name"] == name:
                    child["spec"]["replicas"] = role.replicas
            continue
        if owns_replicas(obj, FIELD_MANAGER) and not owns_replicas(obj, AUTOSCALER_FIELD_MANAGER):
            current = int((obj.get("spec") or {}).get("replicas") or role.replicas)
            cluster.set_replicas(dict(obj), clamp(current, role.autoscaling))


def scaler_name(owner: Owner, pool: str, role: str, scaling: RoleScaling) -> str:
    if scaling.mode == "HPA":
        return f"{HORIZONTAL_POD_AUTOSCALER.kind}/{workload_name(owner, pool, role)}"
    if scaling.mode == "KEDA":
        return f"{SCALED_OBJECT.kind}/{workload_name(owner, pool, role)}"
    return OPERATOR_SCALER


def previous_autoscaling(previous: KimiK3DeploymentStatus | None) -> dict[Key, RoleAutoscalingStatus]:
    return {(p.name, r.role): r.autoscaling for p in (previous.pools if previous else [])
            for r in p.roles if r.autoscaling is not None}


def autoscaling_statuses(owner: Owner, plan: Plan, kept: Mapping[Key, RoleAutoscalingStatus]
                         ) -> dict[Key, RoleAutoscalingStatus]:
    """Each autoscaled role's status: the plan's settings, and the SLO scaler's memory as `kept`
    (from its last decision, or the previous status) when its mode still is SLO."""
    out: dict[Key, RoleAutoscalingStatus] = {}
    for pool, role in plan.role_plans():
        s = role.autoscaling
        if s is None:
            continue
        memory = kept.get((pool.name, role.role)) if s.mode == "SLO" else None
        out[(pool.name, role.role)] = RoleAutoscalingStatus(
            mode=s.mode, min_replicas=s.min_replicas, max_replicas=s.max_replicas, metric=s.metric,
            target=s.target, target_source=s.target_source, scaler=scaler_name(owner, pool.name, role.role, s),
            last_scale_time=memory.last_scale_time if memory else None,
            last_scale=memory.last_scale if memory else None,
            breach_since=memory.breach_since if memory else None,
            calm_since=memory.calm_since if memory else None,
            capacity_limited=memory.capacity_limited if memory else None)
    return out


class SloScaler:
    """The operator's own scaler: one decision per SLO-mode role every interval, per deployment."""

    def __init__(self, prometheus_url: str | None, clock: Callable[[], float] = time.time) -> None:
        self.prometheus_url = prometheus_url
        self._clock = clock
        self._next: dict[Key, float] = {}
        self._asked: dict[Key, float] = {}
        """When next_due last returned each deployment."""
        self._clients: dict[str, Prometheus] = {}

    def url(self, plan: Plan) -> str | None:
        return (plan.scaling.prometheus_url if plan.scaling else None) or self.prometheus_url

    def due(self, key: Key, plan: Plan) -> bool:
        if plan.scaling is None or not any(r.autoscaling and r.autoscaling.mode == "SLO" for _, r in plan.role_plans()):
            self._next.pop(key, None)
            return False
        return self._clock() >= self._next.get(key, 0.0)

    def forget_all_but(self, keys: set[Key]) -> None:
        self._next = {k: v for k, v in self._next.items() if k in keys}
        self._asked = {k: v for k, v in self._asked.items() if k in keys}

    def next_due(self, hold: float = 0.0) -> tuple[float, set[Key]]:
        """Seconds until the next deployment's decision is due, and the deployments due now. A
        deployment returned is not returned again for `hold` seconds: its pass sets its next time
        when it decides, and one that ends before deciding (a plan that fails, weights that are not
        staged) would otherwise be due again at once, a busy loop for the caller."""
        now = self._clock()
        when = {k: max(t, self._asked.get(k, float("-inf")) + hold) for k, t in self._next.items()}
        due = {k for k, t in when.items() if t <= now}
        for key in due:
            self._asked[key] = now
        waits = [t - now for k, t in when.items() if k not in due] + ([hold] if due else [])
        return min(waits, default=float("inf")), due

    def step(self, cluster: Cluster, owner: Owner, plan: Plan, facts: Mapping[str, PoolFacts],
             used: Mapping[str, int], workloads: Mapping[str, Mapping[str, Any]],
             kept: Mapping[Key, RoleAutoscalingStatus], involved: dict[str, Any],
             waiting: Mapping[str, int] | None = None,
             ) -> tuple[dict[Key, RoleAutoscalingStatus], dict[str, Mapping[str, Any]]]:
        """Decide every SLO-mode role of `plan` (live counts) and apply the changes; return the
        scaler's memory per role for status, and the workloads it rescaled as they are now. A role
        whose metrics cannot be read holds. `waiting`: groups Kueue has not admitted, by workload."""
        assert plan.scaling is not None
        settings = plan.scaling
        now = self._clock()
        self._next[(owner.namespace, owner.name)] = now + settings.interval_seconds
        url = self.url(plan)
        decisions: dict[Key, tuple[Decision, int, Mapping[str, Any]]] = {}
        memory_out = dict(kept)
        rescaled: dict[str, Mapping[str, Any]] = {}
        for pool, role in plan.role_plans():
            scaling = role.autoscaling
            workload = workloads.get(workload_name(owner, pool.name, role.role))
            if scaling is None or scaling.mode != "SLO" or workload is None:
                continue
            key = (pool.name, role.role)
            previous = kept.get(key)
            memory = Memory(timestamps.seconds(previous.last_scale_time), timestamps.seconds(previous.breach_since),
                            timestamps.seconds(previous.calm_since)) if previous else Memory()
            current = int((workload.get("spec") or {}).get("replicas") or 0)
            ready = int((workload.get("status") or {}).get("readyReplicas") or 0)
            lead = role.cold_start.ready_seconds if role.cold_start else 0.0
            try:
                observed = self._observe(url, owner, pool.name, role.role, scaling, settings, lead)
            except PrometheusError as exc:
                log.warning("SLO scaler of %s/%s %s: %s", owner.namespace, owner.name, key, exc)
                SCALER_DECISIONS.labels(owner.namespace, owner.name, pool.name, role.role, "error").inc()
                continue
            fits = replicas_that_fit(plan, facts, used, pool.name, role.role, scaling.max_replicas)
            decision = decide(scaling, settings, now=now, current=current, ready=ready, observed=observed,
                              memory=memory, fits=fits, queued=(waiting or {}).get(workload["metadata"]["name"], 0),
                              lead_seconds=lead)
            decisions[key] = (decision, current, workload)
        self._balance(plan, decisions, now)
        for (pool_name, role_name), (decision, current, workload) in decisions.items():
            SCALER_DECISIONS.labels(owner.namespace, owner.name, pool_name, role_name, decision.direction).inc()
            SCALER_REPLICAS.labels(owner.namespace, owner.name, pool_name, role_name).set(decision.replicas)
            previous = kept.get((pool_name, role_name))
            status = previous or RoleAutoscalingStatus(mode="SLO", min_replicas=0, max_replicas=0, metric="",
                                                       target=0, target_source="", scaler=OPERATOR_SCALER)
            update: dict[str, Any] = {
                "breach_since": (timestamps.stamp(decision.memory.breach_since)
                                 if decision.memory.breach_since else None),
                "calm_since": timestamps.stamp(decision.memory.calm_since) if decision.memory.calm_since else None,
                "capacity_limited": decision.capacity_limited}
            where = f"pool {pool_name} role {role_name}"
            if decision.replicas != current:
                rescaled[workload["metadata"]["name"]] = cluster.set_replicas(dict(workload), decision.replicas)
                change = f"{decision.direction} {current} -> {decision.replicas}: {decision.reason.split(': ', 1)[1]}"
                update |= {"last_scale_time": timestamps.stamp(now), "last_scale": change}
                cluster.post_event(involved, owner.namespace, "Normal",
                                   SCALED_UP if decision.replicas > current else SCALED_DOWN, f"{where}: {change}")
            if decision.capacity_limited and decision.capacity_limited != (previous and previous.capacity_limited):
                cluster.post_event(involved, owner.namespace, "Warning", INSUFFICIENT_CAPACITY,
                                   f"{where}: {decision.capacity_limited}")
            log.info("SLO scaler %s/%s %s: %s", owner.namespace, owner.name, where, decision.reason)
            memory_out[(pool_name, role_name)] = status.model_copy(update=update)
        return memory_out, rescaled

    @staticmethod
    def _avoid_traps(plan: Plan, decisions: dict[Key, tuple[Decision, int, Mapping[str, Any]]]) -> None:
        accepted = plan.scaling.accepted_issues if plan.scaling else frozenset()

        def counted(pools: tuple[PoolPlan, ...]) -> tuple[PoolPlan, ...]:
            return tuple(dataclasses.replace(p, roles=tuple(
                dataclasses.replace(r, replicas=decisions[(p.name, r.role)][0].replicas)
                if (p.name, r.role) in decisions else r for r in p.roles)) for p in pools)
        try:
            check_traps(counted(plan.pools), accepted)
        except PlanningError as exc:
            for key, (decision, current, workload) in list(decisions.items()):
                if decision.replicas < current:
                    decisions[key] = (Decision(current, f"hold: {decision.reason.split(': ', 1)[1]}, but "
                                                        f"{exc.message.split(' (accept')[0]}", decision.memory,
                                               decision.capacity_limited), current, workload)

    def _observe(self, url: str | None, owner: Owner, pool: str, role: str, scaling: RoleScaling,
                 settings: ScalingSettings, lead_seconds: float) -> Observation:
        if url is None:
            raise PrometheusError(NO_URL)
        client = self._clients.setdefault(url, Prometheus(url))
        matchers = selector(owner, pool, role)
        window = settings.window_seconds
        return Observation(
            load=client.scalar(load_query(scaling.metric, matchers, window)),
            latency={name: client.scalar(latency_query(name, matchers, window)) for name, _ in scaling.latency_targets},
            trend=self._trend(client, scaling, matchers, window, trend_range(lead_seconds, window)))

    @staticmethod
    def _trend(client: Prometheus, scaling: RoleScaling, matchers: str, window: int, span: int) -> float | None:
        """The smaller of the load's slopes over the last `span` seconds and the span before
        (slo_scaler.trend_range); None when either is missing or unreadable: the lead rule then
        rests, and the load and latency rules decide as before."""
        try:
            slopes = [client.scalar(trend_query(scaling.metric, matchers, window, span, earlier=earlier))
                      for earlier in (False, True)]
        except PrometheusError as exc:
            log.info("SLO scaler: no load trend (%s)", exc)
            return None
        return None if any(v is None for v in slopes) else min(v for v in slopes if v is not None)

    @staticmethod
    def _balance(plan: Plan, decisions: dict[Key, tuple[Decision, int, Mapping[str, Any]]], now: float) -> None:
        """Keep total prefill replicas per decode replica inside spec.autoscaling.prefillDecodeRatio,
        by moving the first SLO-scaled prefill role (within its min/max); and never scale into a
        known trap the spec did not accept (1P1D, traps.py): such a scale-down holds instead."""
        SloScaler._avoid_traps(plan, decisions)
        ratio = plan.scaling.ratio if plan.scaling else None
        if ratio is None:
            return
        counts = {(p.name, r.role): decisions[(p.name, r.role)][0].replicas if (p.name, r.role) in decisions
                  else r.replicas for p, r in plan.role_plans()}
        prefill = sum(n for (_, role), n in counts.items() if role == "prefill")
        decode = sum(n for (_, role), n in counts.items() if role == "decode")
        wanted, why = within_ratio(prefill, decode, ratio)
        movable = next((k for k in decisions if k[1] == "prefill"), None)
        if not why or movable is None:
            return
        decision, current, workload = decisions[movable]
        scaling = next(r.autoscaling for p, r in plan.role_plans() if (p.name, r.role) == movable)
        assert scaling is not None
        replicas = clamp(decision.replicas + wanted - prefill, scaling)
        if replicas != decision.replicas:
            direction = "up" if replicas > current else "down"
            moved = dataclasses.replace(decision.memory, last_scale=now)
            decisions[movable] = (Decision(replicas, f"{direction}: {why}", moved, decision.capacity_limited),
                                  current, workload)
