"""Replica counts from workload and SLOs, and the predictions each role carries."""

from __future__ import annotations

from typing import Any

import pytest

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.api.reasons import SLO_UNATTAINABLE
from kimik3_operator.kimi_k3 import PUBLISHED
from kimik3_operator.planner import PlanningError, plan_deployment, pool_facts
from kimik3_operator.planner.perf import CALIBRATION
from tests.support.cases import base_deployment
from tests.support.nodes import b200_nodes, gb300_rack

NODES = gb300_rack() + b200_nodes()


def _plan(spec_extra: dict[str, Any], pools: list[dict[str, Any]]):
    body = base_deployment()
    body["spec"]["pools"] = pools
    body["spec"].update(spec_extra)
    spec = KimiK3Deployment.model_validate(body).spec
    return plan_deployment(spec, {p.name: pool_facts(p.node_selector, NODES) for p in spec.pools})


def _roles(plan) -> dict[str, Any]:
    return {r.role: r for _, r in plan.role_plans()}


GB300 = {"nvidia.com/gpu.product": "NVIDIA-GB300"}
PD = [{"name": "gb300", "nodeSelector": GB300, "prefill": {}, "decode": {}}]


def test_calibration_reproduces_the_published_tp8_points() -> None:
    assert abs(CALIBRATION.standard_residual_tok_s) < 1e-9
    low, high = PUBLISHED.acceptance_range
    assert low <= CALIBRATION.implied_acceptance <= high


def test_without_workload_the_default_is_one_prefill_two_decode() -> None:
    roles = _roles(_plan({}, PD))
    assert (roles["prefill"].replicas, roles["decode"].replicas) == (1, 2)
    assert roles["decode"].replicas_source == "default"


def test_replicas_grow_with_request_rate() -> None:
    low = _roles(_plan({"workload": {"requestsPerSecond": 1}}, PD))
    high = _roles(_plan({"workload": {"requestsPerSecond": 40}}, PD))
    assert high["prefill"].replicas > low["prefill"].replicas
    assert high["decode"].replicas > low["decode"].replicas
    assert high["decode"].replicas_source == "workload"


def test_rate_matching_covers_the_rate() -> None:
    plan = _plan({"workload": {"requestsPerSecond": 25, "inputTokens": 8192, "outputTokens": 1024},
                  "slo": {"itlMilliseconds": 50}}, PD)
    roles = _roles(plan)
    assert roles["prefill"].replicas * roles["prefill"].predicted["prefillRequestsPerSecond"] * 0.9 >= 25
    assert roles["decode"].replicas * roles["decode"].predicted["decodeRequestsPerSecond"] * 0.92 >= 25
    assert roles["decode"].predicted["decodeStepMsAtSlo"] <= 50


def test_explicit_roles_count_toward_the_rate() -> None:
    pools = [{"name": "a", "nodeSelector": GB300, "prefill": {}, "decode": {"replicas": 40}}]
    roles = _roles(_plan({"workload": {"requestsPerSecond": 5}}, pools))
    assert roles["decode"].replicas == 40 and roles["decode"].replicas_source == "spec"


def test_tighter_itl_means_smaller_batches_and_more_decode_replicas() -> None:
    loose = _roles(_plan({"workload": {"requestsPerSecond": 20}, "slo": {"itlMilliseconds": 60}}, PD))
    tight = _roles(_plan({"workload": {"requestsPerSecond": 20}, "slo": {"itlMilliseconds": 15}}, PD))
    assert tight["decode"].predicted["decodeBatchAtSlo"] < loose["decode"].predicted["decodeBatchAtSlo"]
    assert tight["decode"].replicas > loose["decode"].replicas


@pytest.mark.parametrize(("slo", "needle"), [
    ({"ttftMilliseconds": 10}, "exceeds the 10 ms target"),
    ({"itlMilliseconds": 2}, "over the 2 ms inter-token target"),
])
def test_unattainable_slo_is_an_error(slo: dict[str, int], needle: str) -> None:
    with pytest.raises(PlanningError) as info:
        _plan({"workload": {"requestsPerSecond": 1}, "slo": slo}, PD)
    assert info.value.reason == SLO_UNATTAINABLE and needle in info.value.message


def test_speculative_predictions_at_both_published_acceptances() -> None:
    spec = {"engine": {"speculative": {"method": "DSpark", "draftModelUri": "hf://x/y"}}}
    decode = _roles(_plan(spec, PD))["decode"]
    low = decode.predicted["speculativeTokensPerSecondBatch1AtLowAcceptance"]
    high = decode.predicted["speculativeTokensPerSecondBatch1AtHighAcceptance"]
    assert decode.predicted["speculativeAcceptanceLow"] == 2.61
    assert decode.predicted["speculativeAcceptanceHigh"] == 4.73
    assert decode.predicted["decodeTokensPerSecondBatch1"] < low < high


@pytest.mark.parametrize("k", [1, 4, 7])
def test_the_point_prediction_uses_the_workloads_acceptance_else_the_calibrated_one(k: int) -> None:
    spec = {"engine": {"speculative": {"method": "DSpark", "draftModelUri": "hf://x/y", "numSpeculativeTokens": k}}}
    calibrated = _roles(_plan(spec, PD))["decode"].predicted
    assert calibrated["speculativeAcceptance"] == pytest.approx(min(CALIBRATION.implied_acceptance, 1 + k))
    measured = {}
    for accept in (1.0, (1 + k + 1) / 2, 1.0 + k):
        p = _roles(_plan({**spec, "workload": {"acceptanceLength": accept}}, PD))["decode"].predicted
        assert p["speculativeAcceptance"] == accept
        measured[accept] = p
    ordered = [measured[a] for a in sorted(measured)]
    for key in ("speculativeTokensPerSecondBatch1", "decodeRequestsPerSecond"):
        assert [p[key] for p in ordered] == sorted(p[key] for p in ordered) and ordered[0][key] < ordered[-1][key]
    for p in ordered:  # a verify step emits its acceptance length: ITL is the step over it
        assert p["decodeItlMsAtSlo"] == pytest.approx(p["decodeStepMsAtSlo"] / p["speculativeAcceptance"])


def test_a_higher_acceptance_fits_more_sequences_under_the_itl_target() -> None:
    spec = {"engine": {"speculative": {"method": "DSpark", "draftModelUri": "hf://x/y"}},
            "slo": {"itlMilliseconds": 20}}
    low = _roles(_plan({**spec, "workload": {"acceptanceLength": 2}}, PD))["decode"].predicted
    high = _roles(_plan({**spec, "workload": {"acceptanceLength": 6}}, PD))["decode"].predicted
    assert low["decodeBatchAtSlo"] < high["decodeBatchAtSlo"]
    assert low["decodeItlMsAtSlo"] <= 20 and high["decodeItlMsAtSlo"] <= 20


@pytest.mark.parametrize("seqs", [None, 3, 40])
def test_the_credited_batch_is_one_the_engine_admits(seqs: int | None) -> None:
    """A decode replica is credited with no more sequences than its DP ranks' max-num-seqs: the
    spec's, else the CUDA-graph bound of 1024 tokens over 1 + k on Blackwell."""
    pools = [{**PD[0], "decode": {"engine": {"maxNumSeqs": seqs}} if seqs else {}}]
    spec = {"engine": {"speculative": {"method": "DSpark", "draftModelUri": "hf://x/y"}}}
    decode = _roles(_plan(spec, pools))["decode"]
    assert decode.shape is not None and decode.shape.max_num_seqs == (seqs or decode.shape.max_num_seqs) <= 1024 // 8
    assert decode.predicted["decodeBatchAtSlo"] <= decode.layout.data * decode.shape.max_num_seqs
    if seqs:  # below the KV-bound batch of 101: the engine's limit is the one credited
        assert decode.predicted["decodeBatchAtSlo"] == decode.layout.data * seqs


def test_an_acceptance_beyond_the_drafts_is_refused() -> None:
    spec = {"engine": {"speculative": {"method": "MTP", "numSpeculativeTokens": 2}},
            "workload": {"acceptanceLength": 3.5}}
    with pytest.raises(PlanningError) as info:
        _plan(spec, PD)
    assert info.value.reason == "InvalidSpec" and "exceeds 1 + numSpeculativeTokens (3)" in info.value.message


def test_rate_matching_never_lands_on_one_prefill_one_decode() -> None:
    roles = _roles(_plan({"workload": {"requestsPerSecond": 0.1}}, PD))
    assert (roles["prefill"].replicas, roles["decode"].replicas) == (1, 2)
