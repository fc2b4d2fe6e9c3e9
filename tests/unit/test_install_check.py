"""`kimik3 check-install` (the chart's `helm test`): each check passes on what a healthy install
answers and fails, with a line saying why, on what a broken one answers."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS
from typing import Any

from kubernetes.client.exceptions import ApiException

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.k8s.install_check import crd_served, operator_ready, refused_body, webhook_answers
from kimik3_operator.planner.admission import admission_verdict


def _error(status: int, message: str) -> ApiException:
    exc = ApiException(status=status, reason="x")
    exc.body = json.dumps({"message": message})
    return exc


class Custom:
    def __init__(self, resources: list[str] | None = None, refusal: ApiException | None = None) -> None:
        self.resources, self.refusal = resources, refusal
        self.created: list[tuple[Any, ...]] = []

    def get_api_resources(self, group: str, version: str) -> Any:
        if self.resources is None:
            raise _error(404, "the server could not find the requested resource")
        return NS(resources=[NS(name=r) for r in self.resources])

    def create_namespaced_custom_object(self, *args: Any, dry_run: str) -> None:
        self.created.append((*args, dry_run))
        if self.refusal:
            raise self.refusal


class Apps:
    def __init__(self, ready: int, available: str) -> None:
        self.status = NS(ready_replicas=ready, conditions=[NS(type="Available", status=available)])

    def read_namespaced_deployment(self, name: str, namespace: str) -> Any:
        return NS(status=self.status)


def test_the_probe_passes_the_schema_and_only_the_webhook_refuses_it() -> None:
    body = refused_body("ns")
    KimiK3Deployment.model_validate(body)  # pydantic mirrors the CRD's schema and CEL rules
    verdict = admission_verdict(body)
    assert verdict is not None and verdict.startswith("InsufficientMemory: ")


def test_crd_served_reads_discovery() -> None:
    assert crd_served(Custom(["kimik3deployments", "kimik3deployments/status"])).ok
    assert not crd_served(Custom(["other"])).ok
    check = crd_served(Custom(None))
    assert not check.ok and "not served" in check.line()


def test_webhook_answers_only_when_it_refuses_with_the_planners_reason() -> None:
    refused = Custom(refusal=_error(422, 'admission webhook "validate.serving.kimik3.dev" denied the request: '
                                         "InsufficientMemory: pool h100 role aggregated ..."))
    assert webhook_answers(refused, "ns").ok
    assert refused.created[0][-1] == "All"  # a dry run: nothing stored
    admitted = webhook_answers(Custom(), "ns")
    assert not admitted.ok and "no replica answered" in admitted.detail
    assert not webhook_answers(Custom(refusal=_error(403, "forbidden")), "ns").ok


def test_operator_ready_needs_a_ready_replica_and_available() -> None:
    assert operator_ready(Apps(1, "True"), "ns", "op").ok
    assert not operator_ready(Apps(0, "False"), "ns", "op").ok
    line = operator_ready(Apps(2, "True"), "ns", "op").line()
    assert line.startswith("ok  operator ready: deployment ns/op: 2 ready")
