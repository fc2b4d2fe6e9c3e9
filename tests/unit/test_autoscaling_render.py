"""Autoscaling in the plan and the rendered children: targets from the perf model, replicas left
to the scaler, KEDA ScaledObjects and HPAs that target the role's LeaderWorkerSet."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.contract.names import SERIES_LABELS
from kimik3_operator.planner import Plan, PlanningError, plan_deployment, pool_facts
from kimik3_operator.planner.admission import admission_verdict
from kimik3_operator.planner.autoscale import KV_CACHE_TARGET, role_scaling
from kimik3_operator.planner.perf import DECODE_UTILISATION, PREFILL_UTILISATION
from kimik3_operator.render import Owner, render_serving
from kimik3_operator.render.promql import ADAPTER_METRICS, load_query, selector
from kimik3_operator.render.workloads import leader_worker_set
from tests.support.cases import ROOT, load_examples
from tests.support.nodes import all_pools

OWNER = Owner(name="k3", namespace="inference", uid="u")
PD = dict(load_examples())["pd-gb300-decode-b200-prefill.yaml"]  # prefill pool b200-prefill, decode gb300-decode


def _body(prefill: dict[str, Any] | None = None, decode: dict[str, Any] | None = None,
          **spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(PD)
    for pool in body["spec"]["pools"]:
        for role, auto in (("prefill", prefill), ("decode", decode)):
            if role in pool and auto is not None:
                pool[role]["autoscaling"] = auto
    body["spec"].update(spec)
    return body


def _plan(body: dict[str, Any]) -> Plan:
    spec = KimiK3Deployment.model_validate(body).spec
    return plan_deployment(spec, {p.name: pool_facts(p.node_selector, all_pools()) for p in spec.pools})


def _roles(plan: Plan) -> dict[str, Any]:
    return {role.role: role for _, role in plan.role_plans()}


def test_targets_default_to_one_replicas_perf_model_capacity() -> None:
    plan = _plan(_body(prefill={"maxReplicas": 3, "mode": "KEDA"}, decode={"maxReplicas": 4, "mode": "HPA"},
                       autoscaling={"prometheusUrl": "http://prometheus:9090"}))
    roles = _roles(plan)
    prefill, decode = roles["prefill"].autoscaling, roles["decode"].autoscaling
    assert prefill.metric == "PromptTokensPerSecond" and prefill.target_source == "perf model"
    assert prefill.target == pytest.approx(
        roles["prefill"].predicted["prefillRequestsPerSecond"] * 8192 * PREFILL_UTILISATION, rel=1e-3)
    assert decode.metric == "RequestsInFlight"
    assert decode.target == pytest.approx(roles["decode"].predicted["decodeBatchAtSlo"] * DECODE_UTILISATION, rel=1e-3)


def test_an_autoscaled_role_starts_within_min_max_and_its_replicas_are_left_out_of_the_apply() -> None:
    plan = _plan(_body(decode={"minReplicas": 3, "maxReplicas": 5, "metric": "KvCacheUsage", "mode": "HPA"}))
    pool, decode = next((p, r) for p, r in plan.role_plans() if r.role == "decode")
    assert decode.replicas == 3 and decode.autoscaling.target == KV_CACHE_TARGET  # the spec says 2: clamped
    assert "replicas" not in leader_worker_set(OWNER, plan, pool, decode)["spec"]
    prefill_pool, prefill = next((p, r) for p, r in plan.role_plans() if r.role == "prefill")
    assert leader_worker_set(OWNER, plan, prefill_pool, prefill)["spec"]["replicas"] == 1


def test_keda_and_hpa_children_target_the_roles_leader_worker_set() -> None:
    plan = _plan(_body(prefill={"maxReplicas": 3, "mode": "KEDA", "target": 20000},
                       decode={"minReplicas": 2, "maxReplicas": 4, "mode": "HPA"},
                       autoscaling={"prometheusUrl": "http://prometheus:9090", "scaleDownCooldownSeconds": 86400}))
    objs = render_serving(OWNER, plan)
    lws = {o["metadata"]["name"]: o for o in objs if o["kind"] == "LeaderWorkerSet"}
    (scaled,) = [o for o in objs if o["kind"] == "ScaledObject"]
    (hpa,) = [o for o in objs if o["kind"] == "HorizontalPodAutoscaler"]
    for obj in (scaled, hpa):
        ref = obj["spec"]["scaleTargetRef"]
        assert (ref["apiVersion"], ref["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
        assert ref["name"] in lws and obj["metadata"]["ownerReferences"][0]["uid"] == "u"
    assert objs.index(scaled) > objs.index(lws[scaled["spec"]["scaleTargetRef"]["name"]])
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["threshold"] == "20000"
    assert trigger["metadata"]["query"] == load_query(
        "PromptTokensPerSecond", selector(OWNER, "b200-prefill", "prefill"), 60)
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (1, 3)
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 4)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == ADAPTER_METRICS["RequestsInFlight"]
    assert metric["pods"]["target"]["averageValue"].endswith("m")
    down = hpa["spec"]["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] == 3600 and down["policies"][0]["periodSeconds"] == 1800  # API bounds


def test_the_role_selector_is_what_the_charts_pod_monitor_copies_from_pod_labels() -> None:
    pod_monitor = (ROOT / "charts/kimik3-operator/templates/podmonitor.yaml").read_text()
    for label, series_label in SERIES_LABELS.items():
        source = "__meta_kubernetes_pod_label_" + label.replace(".", "_").replace("/", "_")
        assert f"sourceLabels: [{source}]\n      targetLabel: {series_label}" in pod_monitor
    assert selector(OWNER, "gb300-decode", "decode") == (
        'namespace="inference",kimik3_deployment="k3",kimik3_pool="gb300-decode",kimik3_role="decode"')


def test_no_autoscaling_renders_no_scaler_and_keeps_replicas() -> None:
    objs = render_serving(OWNER, _plan(copy.deepcopy(PD)))
    assert not [o for o in objs if o["kind"] in ("ScaledObject", "HorizontalPodAutoscaler")]
    assert all("replicas" in o["spec"] for o in objs if o["kind"] == "LeaderWorkerSet")


@pytest.mark.parametrize(("auto", "spec", "message"), [
    ({"minReplicas": 4, "maxReplicas": 2, "mode": "KEDA"}, {}, "minReplicas must not exceed maxReplicas"),
    ({"maxReplicas": 2}, {}, "autoscaling mode SLO on a decode role needs spec.slo.itlMilliseconds"),
    ({"maxReplicas": 2, "mode": "SLO"}, {"slo": {"ttftMilliseconds": 900}}, "needs spec.slo.itlMilliseconds"),
    ({"maxReplicas": 2, "mode": "HPA"}, {"autoscaling": {"prefillDecodeRatio": {"min": 2, "max": 1}}},
     "prefillDecodeRatio: min must not exceed max"),
])
def test_nonsense_is_refused_with_its_reason(auto: dict[str, Any], spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        KimiK3Deployment.model_validate(_body(decode=auto, **spec))


def test_slo_mode_with_its_target_and_hpa_without_slo_are_accepted() -> None:
    KimiK3Deployment.model_validate(_body(decode={"maxReplicas": 2}, slo={"itlMilliseconds": 40}))
    KimiK3Deployment.model_validate(_body(decode={"maxReplicas": 2}, autoscaling={"mode": "HPA"}))


def test_a_target_the_perf_model_cannot_give_must_be_set() -> None:
    spec = KimiK3Deployment.model_validate(_body(decode={"maxReplicas": 2, "mode": "HPA"})).spec
    decode = next(r for p in spec.pools for name, r in p.roles() if name == "decode")
    with pytest.raises(PlanningError, match="set autoscaling.target") as caught:
        role_scaling(spec, "pool x role decode", "decode", decode, predicted={}, input_tokens=8192)
    assert caught.value.reason == "AutoscalingTargetUnknown"
    given = decode.model_copy(update={"autoscaling": decode.autoscaling.model_copy(update={"target": 12.0})})
    assert role_scaling(spec, "pool x role decode", "decode", given, predicted={}, input_tokens=8192).target == 12


def test_the_charts_adapter_rules_serve_every_pod_metric_an_hpa_role_names() -> None:
    """prometheus-adapter's naming: each series a rule's seriesQuery selects, renamed by its
    name.matches/as, becomes a pod metric."""
    import re

    import yaml
    rules = yaml.safe_load((ROOT / "charts/kimik3-operator/files/prometheus-adapter-rules.yaml").read_text())["rules"]
    served = set()
    for rule in rules:
        names = re.search(r'__name__=~?"([^"]+)"', rule["seriesQuery"]).group(1).split("|")
        assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        for series in names:
            if re.search(rule["name"]["matches"], series):
                served.add(re.sub(rule["name"]["matches"], rule["name"]["as"].replace("${1}", r"\1"), series))
    assert set(ADAPTER_METRICS.values()) <= served, set(ADAPTER_METRICS.values()) - served


def test_keda_without_prometheus_is_a_condition_of_the_operators_settings_not_a_refusal() -> None:
    body = _body(decode={"maxReplicas": 3, "mode": "KEDA"})
    with pytest.raises(PlanningError) as caught:
        _plan(body)
    assert caught.value.reason == "AutoscalingUnconfigured" and caught.value.depends_on_nodes
    assert "--prometheus-url" in caught.value.message
    assert admission_verdict(body) is None
    spec = KimiK3Deployment.model_validate(body).spec
    plan = plan_deployment(spec, {p.name: pool_facts(p.node_selector, all_pools()) for p in spec.pools},
                           prometheus_url="http://prometheus.monitoring:9090")
    assert plan.scaling.prometheus_url == "http://prometheus.monitoring:9090"
