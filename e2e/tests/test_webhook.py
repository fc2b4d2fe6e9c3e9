"""The validating webhook on the real API server (served by the host operator on loopback, with the
certificate it keeps itself): what the spec alone makes impossible is refused at `kubectl apply`
with the planner's reason and nothing is stored; what depends on the nodes is admitted and
answered by a status condition."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.harness.kube import condition, get_json, kubectl, wait_for
from kimik3_operator.api.reasons import INSUFFICIENT_MEMORY, NO_MATCHING_NODES
from tests.support.cases import base_deployment

from .conftest import CHART_NAMESPACE, WEBHOOK_CERT_SECRET, WEBHOOK_CONFIGURATION

pytestmark = pytest.mark.e2e


def _body(namespace: str, name: str, product: str, tensor: int = 8) -> dict[str, Any]:
    body = base_deployment(name=name, namespace=namespace)
    body["spec"]["pools"][0].update(gpu={"product": product},
                                    aggregated={"replicas": 1, "parallelism": {"tensor": tensor}})
    if product == "Auto":
        body["spec"]["pools"][0]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    return body


def _apply(body: dict[str, Any]) -> tuple[int, str]:
    result = kubectl("apply", "-f", "-", input=yaml.safe_dump(body), check=False)
    return result.returncode, result.stderr


def test_impossible_explicit_hardware_is_refused_at_apply(operator: Path, namespace: str) -> None:
    code, err = _apply(_body(namespace, "k3-h100", "H100"))
    assert code != 0 and "denied the request: InsufficientMemory: pool gb300 role aggregated" in err, err
    assert kubectl("get", "kimik3deployment", "k3-h100", "-n", namespace, check=False).returncode != 0


def test_node_dependent_problems_are_conditions_not_refusals(operator: Path, namespace: str) -> None:
    code, err = _apply(_body(namespace, "k3-auto", "Auto"))
    assert code == 0, err
    cr = wait_for("a Ready condition", lambda: (c := get_json("kimik3deployment", "k3-auto", "-n", namespace))
                  and condition(c, "Ready") and c, timeout=60)
    ready = condition(cr, "Ready")
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", NO_MATCHING_NODES)


def test_an_update_to_an_impossible_spec_is_refused_and_the_stored_spec_kept(operator: Path, namespace: str) -> None:
    good = _body(namespace, "k3-edit", "GB300")
    assert _apply(good)[0] == 0
    before = get_json("kimik3deployment", "k3-edit", "-n", namespace)
    code, err = _apply(_body(namespace, "k3-edit", "GB300", tensor=4))
    assert code != 0 and INSUFFICIENT_MEMORY in err, err
    after = get_json("kimik3deployment", "k3-edit", "-n", namespace)
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert after["spec"] == before["spec"]


def test_a_known_trap_is_refused_until_accepted(operator: Path, namespace: str) -> None:
    body = base_deployment(name="k3-trap", namespace=namespace)
    body["spec"]["pools"] = [
        {"name": "d", "gpu": {"product": "GB300"}, "decode": {"replicas": 1, "parallelism": {"tensor": 8}}},
        {"name": "p", "gpu": {"product": "GB300"}, "prefill": {"replicas": 1, "parallelism": {"tensor": 8}}}]
    code, err = _apply(body)
    assert code != 0 and "vllm#52627" in err, err
    body["spec"]["experimental"] = {"acceptKnownIssues": ["vllm#52627"]}
    code, err = _apply(body)
    assert code == 0, err
    stored = json.loads(kubectl("get", "kimik3deployment", "k3-trap", "-n", namespace, "-o", "json").stdout)
    assert stored["spec"]["experimental"]["acceptKnownIssues"] == ["vllm#52627"]


def _secret_material() -> dict[str, str]:
    return get_json("secret", WEBHOOK_CERT_SECRET, "-n", CHART_NAMESPACE)["data"]  # type: ignore[no-any-return]


def _ca_bundle() -> str | None:
    config = get_json("validatingwebhookconfiguration", WEBHOOK_CONFIGURATION)
    return config["webhooks"][0]["clientConfig"].get("caBundle")  # type: ignore[no-any-return]


def test_the_operator_keeps_the_certificate_and_the_ca_bundle(operator: Path, namespace: str) -> None:
    """The chart renders no key material: the operator made the CA and certificate into its Secret
    (owned by the webhook configuration, so an uninstall removes it), set the caBundle, sets it
    back when it is changed, and renews a certificate that does not fit under the same CA, with
    no restart (the server reloads the files)."""
    secret = get_json("secret", WEBHOOK_CERT_SECRET, "-n", CHART_NAMESPACE)
    assert [o["kind"] for o in secret["metadata"]["ownerReferences"]] == ["ValidatingWebhookConfiguration"]
    data = secret["data"]
    assert _ca_bundle() == data["ca.crt"]
    kubectl("patch", "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION, "--type=json", "-p",
            json.dumps([{"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": "QUJD"}]))
    wait_for("the caBundle set back", lambda: _ca_bundle() == data["ca.crt"], timeout=30)
    # a certificate of no use (its own key for the CA's): renewed, the CA kept
    kubectl("patch", "secret", WEBHOOK_CERT_SECRET, "-n", CHART_NAMESPACE, "--type=merge", "-p",
            json.dumps({"data": {"tls.crt": data["ca.crt"], "tls.key": data["ca.key"]}}))

    def renewal() -> dict[str, str] | None:
        material = _secret_material()
        return material if material["tls.crt"] not in (data["tls.crt"], data["ca.crt"]) else None

    renewed = wait_for("the certificate renewed", renewal, timeout=30)
    assert (renewed["ca.crt"], renewed["ca.key"]) == (data["ca.crt"], data["ca.key"])
    assert _ca_bundle() == data["ca.crt"]
    time.sleep(6)  # the server's reload period (Limits.reload_seconds) and then some
    code, err = _apply(_body(namespace, "k3-after-renewal", "H100"))
    assert code != 0 and "denied the request: InsufficientMemory" in err, err
