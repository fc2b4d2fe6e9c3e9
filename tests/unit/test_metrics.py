"""The operator's own series: deployments by phase (a deployment counted once, gone ones dropped),
build info, and the per-deployment series the alerts read."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from kimik3_operator.metrics import PhaseBook


def _count(phase: str) -> float:
    return REGISTRY.get_sample_value("kimik3_operator_deployments", {"phase": phase}) or 0.0


def test_each_deployment_counts_once_in_its_latest_phase() -> None:
    book = PhaseBook()
    book.record(("a", "x"), "Progressing")
    book.record(("a", "y"), "Progressing")
    book.record(("a", "x"), "Ready")
    assert (_count("Ready"), _count("Progressing"), _count("Failed")) == (1, 1, 0)
    book.keep_only({("a", "x")})
    assert (_count("Ready"), _count("Progressing")) == (1, 0)


def _sample(metric: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(metric, labels)


def test_build_info_names_the_versions() -> None:
    import platform

    from kimik3_operator import __version__

    samples = [s for m in REGISTRY.collect() if m.name == "kimik3_operator_build_info" for s in m.samples]
    (sample,) = samples
    assert sample.value == 1
    assert sample.labels["version"] == __version__ and sample.labels["python"] == platform.python_version()
    assert sample.labels["kopf"].count(".") >= 1


def _status(phase: str, ready: int, conditions: list[tuple[str, str, str]],
            roles: tuple[str, ...] = ("prefill", "decode")) -> Any:
    from kimik3_operator.api import Condition, KimiK3DeploymentStatus, PoolStatus, RoleStatus

    return KimiK3DeploymentStatus(
        phase=phase,
        pools=[PoolStatus(name="p", roles=[RoleStatus(role=r, replicas=2, ready_replicas=ready) for r in roles])],
        conditions=[Condition(type=t, status=s, reason=r, last_transition_time="2026-01-01T00:00:00Z")
                    for t, s, r in conditions])


def test_each_deployment_exports_its_roles_phase_and_conditions_until_it_is_gone() -> None:
    from kimik3_operator.metrics import DeploymentSeries

    series = DeploymentSeries()
    # a namespace of its own: the gauges are the process's
    key = {"namespace": "metrics-test", "kimik3_deployment": "k3"}
    series.record("metrics-test", "k3", _status("Progressing", 1, [("Degraded", "False", "AsExpected")]))
    assert _sample("kimik3_deployment_ready_replicas", **key, kimik3_pool="p", kimik3_role="decode") == 1
    assert _sample("kimik3_deployment_replicas", **key, kimik3_pool="p", kimik3_role="decode") == 2
    assert _sample("kimik3_deployment_phase", **key, phase="Progressing") == 1
    assert _sample("kimik3_deployment_phase", **key, phase="Failed") == 0
    # what the alerts read: phase Failed, and Degraded because the weights failed
    series.record("metrics-test", "k3", _status("Failed", 0, [("Degraded", "True", "WeightsFailed")], ("decode",)))
    assert _sample("kimik3_deployment_phase", **key, phase="Failed") == 1
    assert _sample("kimik3_deployment_phase", **key, phase="Progressing") == 0
    assert _sample("kimik3_deployment_condition", **key, type="Degraded", status="True", reason="WeightsFailed") == 1
    # a role or a reason that went is no series any more, not a stale one
    assert _sample("kimik3_deployment_condition", **key, type="Degraded", status="False", reason="AsExpected") is None
    assert _sample("kimik3_deployment_ready_replicas", **key, kimik3_pool="p", kimik3_role="prefill") is None
    series.keep_only(set())
    assert _sample("kimik3_deployment_phase", **key, phase="Failed") is None
    assert _sample("kimik3_deployment_ready_replicas", **key, kimik3_pool="p", kimik3_role="decode") is None


def test_every_computed_status_is_exported_written_or_not() -> None:
    from kimik3_operator.planner import PlanningError
    from kimik3_operator.reconcile.status import compute_status
    from kimik3_operator.render.names import Owner

    compute_status(owner=Owner(name="k3", namespace="metrics-hook", uid="u"), generation=1, previous=None, plan=None,
                   error=PlanningError("InvalidSpec", "no"), workloads={}, now="2026-01-01T00:00:00Z")
    assert _sample("kimik3_deployment_phase", namespace="metrics-hook", kimik3_deployment="k3", phase="Failed") == 1
    assert _sample("kimik3_deployment_condition", namespace="metrics-hook", kimik3_deployment="k3", type="Ready",
                   status="False", reason="InvalidSpec") == 1


def test_a_rollout_and_a_cold_start_show_as_updated_replicas_staged_bytes_and_predicted_seconds() -> None:
    from kimik3_operator.api.status import WeightsStatus
    from kimik3_operator.metrics import DeploymentSeries

    series = DeploymentSeries()
    key = {"namespace": "metrics-cold", "kimik3_deployment": "k3"}
    base = _status("Progressing", 0, [])
    rolled = base.pools[0].roles[1].model_copy(update={"updated_replicas": 1})
    pool = base.pools[0].model_copy(update={"roles": [base.pools[0].roles[0], rolled]})
    status = base.model_copy(update={"pools": [pool], "weights": [
        WeightsStatus(name="model", phase="Staging", percent=42.5), WeightsStatus(name="draft", phase="Staging")]})
    series.record("metrics-cold", "k3", status)
    assert _sample("kimik3_deployment_updated_replicas", **key, kimik3_pool="p", kimik3_role="decode") == 1
    assert _sample("kimik3_deployment_weights_staged_ratio", **key, checkpoint="model") == 0.425
    # staging with no byte count yet: no series, not a made-up 0
    assert _sample("kimik3_deployment_weights_staged_ratio", **key, checkpoint="draft") is None
    series.record("metrics-cold", "k3", status.model_copy(update={"weights": [
        WeightsStatus(name="model", phase="Staged"), WeightsStatus(name="draft", phase="Staged")]}))
    assert _sample("kimik3_deployment_weights_staged_ratio", **key, checkpoint="draft") == 1
    series.keep_only(set())
    assert _sample("kimik3_deployment_weights_staged_ratio", **key, checkpoint="model") is None
