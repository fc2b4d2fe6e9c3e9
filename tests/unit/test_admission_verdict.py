"""The webhook's verdict: refuse what the spec alone makes impossible, admit what depends on nodes."""

from __future__ import annotations

import copy
from typing import Any

from kimik3_operator.planner.admission import admission_verdict
from tests.support.cases import base_deployment


def _body(**pool: Any) -> dict[str, Any]:
    body = copy.deepcopy(base_deployment())
    body["spec"]["pools"][0].update(pool)
    return body


def test_explicit_hardware_that_cannot_hold_the_model_is_refused_with_the_planners_reason() -> None:
    verdict = admission_verdict(_body(gpu={"product": "H100"},
                                      aggregated={"replicas": 1, "parallelism": {"tensor": 8}}))
    assert verdict is not None and verdict.startswith("InsufficientMemory: ")


def test_a_servable_explicit_spec_is_admitted() -> None:
    assert admission_verdict(_body(gpu={"product": "GB300"})) is None


def test_hardware_left_to_the_nodes_is_judged_later_not_refused() -> None:
    # TP8 on whatever the nodes are: only the nodes can say whether it fits.
    assert admission_verdict(_body(aggregated={"replicas": 1, "parallelism": {"tensor": 8}})) is None


def test_a_known_trap_is_refused_unless_accepted() -> None:
    body = _body(gpu={"product": "GB300"})
    body["spec"]["pools"] = [
        {"name": "d", "gpu": {"product": "GB300"}, "decode": {"replicas": 1, "parallelism": {"tensor": 8}}},
        {"name": "p", "gpu": {"product": "GB300"}, "prefill": {"replicas": 1, "parallelism": {"tensor": 8}}}]
    verdict = admission_verdict(body)
    assert verdict is not None and "vllm#52627" in verdict
    body["spec"]["experimental"] = {"acceptKnownIssues": ["vllm#52627"]}
    assert admission_verdict(body) is None


def test_a_body_the_models_refuse_is_invalid_spec() -> None:
    body = _body()
    body["spec"]["pools"][0]["aggregated"]["parallelism"] = {"tensor": 5}
    verdict = admission_verdict(body)
    assert verdict is not None and verdict.startswith("InvalidSpec: ")
