"""The webhook's AdmissionReview answers (the HTTPS path is exercised by e2e/tests/test_webhook.py)."""

from __future__ import annotations

from typing import Any

from kimik3_operator.webhook import review_response
from tests.support.cases import base_deployment


def _review(obj: Any, operation: str = "CREATE") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": operation, "object": obj}}


def test_refusal_carries_the_planners_reason_and_echoes_the_uid() -> None:
    body = base_deployment()
    body["spec"]["pools"][0].update(gpu={"product": "H100"})
    answer = review_response(_review(body))
    assert answer["kind"] == "AdmissionReview" and answer["response"]["uid"] == "u-1"
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["message"].startswith("InsufficientMemory: ")


def test_admits_servable_specs_and_deletes() -> None:
    assert review_response(_review(base_deployment()))["response"]["allowed"] is True
    assert review_response(_review(None, "DELETE"))["response"]["allowed"] is True
