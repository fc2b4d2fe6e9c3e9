"""The chart's webhook certificate, each way, with the real helm: by default the operator keeps it
(no key material rendered, so `helm template` is the same every time: no GitOps drift), with
cert-manager an Issuer and Certificate whose CA cert-manager injects, and for an operator outside
the cluster the caBundle given."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from tests.support.chart import CHART, helm_binary, triples

NAMESPACE = "kimik3-system"
SERVICE = "t-kimik3-operator-webhook"


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    binary = helm_binary()
    if binary is None:
        pytest.skip("helm is not built (e2e/cluster/build.sh helm)")
    return subprocess.run([binary, *args], capture_output=True, text=True, check=check, timeout=120)


def render(*values: str) -> str:
    return helm("template", "t", str(CHART), "-n", NAMESPACE, *values).stdout


def docs(*values: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(render(*values)) if d}


def container(rendered: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [d for (kind, _), d in rendered.items() if kind == "Deployment"]
    (operator,) = deployment["spec"]["template"]["spec"]["containers"]
    return operator  # type: ignore[no-any-return]


def test_helm_template_renders_the_same_twice_and_no_key_material() -> None:
    first, second = render(), render()
    assert first == second, "the default chart changes on every render: GitOps tools would see drift"
    rendered = docs()
    assert not [key for key in rendered if key[0] in ("Secret", "Certificate", "Issuer")]
    (config,) = [d for (kind, _), d in rendered.items() if kind == "ValidatingWebhookConfiguration"]
    assert "caBundle" not in config["webhooks"][0]["clientConfig"], "the operator sets it"
    assert config["webhooks"][0]["clientConfig"]["service"]["name"] == SERVICE


def test_by_default_the_operator_keeps_the_certificate_with_the_rights_for_it_alone() -> None:
    rendered = docs()
    args = container(rendered)["args"]
    assert [a for a in args if a.startswith("--webhook")] == [
        "--webhook-port=9443", "--webhook-cert-secret=t-kimik3-operator-webhook-cert",
        "--webhook-configuration=t-kimik3-operator", f"--webhook-cert-host={SERVICE}",
        f"--webhook-cert-host={SERVICE}.{NAMESPACE}", f"--webhook-cert-host={SERVICE}.{NAMESPACE}.svc"]
    assert "volumeMounts" not in container(rendered) or all(
        m["name"] != "webhook-tls" for m in container(rendered)["volumeMounts"])
    role, cluster_role = rendered["Role", "t-kimik3-operator-webhook-cert"], \
        rendered["ClusterRole", "t-kimik3-operator-webhook-cert"]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["t-kimik3-operator-webhook-cert"],
         "verbs": ["get", "update"]}]
    assert cluster_role["rules"] == [
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations"],
         "resourceNames": ["t-kimik3-operator"], "verbs": ["get", "patch"]}]
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        binding = rendered[kind, "t-kimik3-operator-webhook-cert"]
        assert binding["roleRef"]["name"] == "t-kimik3-operator-webhook-cert"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "t-kimik3-operator",
                                        "namespace": NAMESPACE}]


def test_cert_manager_issues_the_certificate_and_injects_its_ca() -> None:
    rendered = docs("--set", "webhook.certManager.enabled=true")
    assert not [key for key in rendered if key[1].endswith("-webhook-cert")], "no rights for a cert of our own"
    issuer, certificate = rendered["Issuer", f"{SERVICE}-selfsigned"], rendered["Certificate", SERVICE]
    assert issuer["spec"] == {"selfSigned": {}}
    assert certificate["spec"]["secretName"] == "t-kimik3-operator-webhook-tls"
    assert certificate["spec"]["issuerRef"] == {"kind": "Issuer", "name": f"{SERVICE}-selfsigned"}
    assert set(certificate["spec"]["dnsNames"]) == {SERVICE, f"{SERVICE}.{NAMESPACE}", f"{SERVICE}.{NAMESPACE}.svc"}
    config = rendered["ValidatingWebhookConfiguration", "t-kimik3-operator"]
    assert config["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": f"{NAMESPACE}/{SERVICE}"}
    operator = container(rendered)
    assert {"--webhook-cert=/etc/kimik3/webhook/tls.crt", "--webhook-key=/etc/kimik3/webhook/tls.key"} <= set(
        operator["args"])
    assert {"name": "webhook-tls", "mountPath": "/etc/kimik3/webhook", "readOnly": True} in operator["volumeMounts"]
    assert render("--set", "webhook.certManager.enabled=true") == render("--set", "webhook.certManager.enabled=true")


def test_cert_manager_with_an_issuer_of_ones_own() -> None:
    rendered = docs("--set", "webhook.certManager.enabled=true",
                    "--set", "webhook.certManager.issuerRef.kind=ClusterIssuer",
                    "--set", "webhook.certManager.issuerRef.name=corp-ca")
    assert not [key for key in rendered if key[0] == "Issuer"]
    assert rendered["Certificate", SERVICE]["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "corp-ca"}


def test_an_operator_outside_the_cluster_with_its_own_ca_gets_it_as_the_ca_bundle() -> None:
    rendered = docs("--set", "webhook.url=https://127.0.0.1:9443/validate", "--set", "webhook.caBundle=QUJD")
    config = rendered["ValidatingWebhookConfiguration", "t-kimik3-operator"]
    assert config["webhooks"][0]["clientConfig"] == {"url": "https://127.0.0.1:9443/validate", "caBundle": "QUJD"}
    assert not [key for key in rendered if key[1].endswith(("-webhook-cert", "-webhook"))]
    assert not [a for a in container(rendered)["args"] if a.startswith("--webhook")]


def test_an_operator_outside_the_cluster_without_a_ca_keeps_its_own_certificate() -> None:
    rendered = docs("--set", "webhook.url=https://127.0.0.1:9443/validate")
    (webhook,) = rendered["ValidatingWebhookConfiguration", "t-kimik3-operator"]["webhooks"]
    assert "caBundle" not in webhook["clientConfig"]
    assert triples(rendered["ClusterRole", "t-kimik3-operator-webhook-cert"]["rules"]) == {
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "get"),
        ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "patch")}


@pytest.mark.parametrize("values", [
    ("webhook.certManager.enabled=true", "webhook.url=https://example.com/validate"),
    ("webhook.caBundle=QUJD",),
])
def test_contradictory_webhook_values_are_refused(values: tuple[str, ...]) -> None:
    result = helm("template", "t", str(CHART), *(a for v in values for a in ("--set", v)), check=False)
    assert result.returncode != 0 and "webhook." in result.stderr, result.stderr


@pytest.mark.parametrize("values", [(), ("--set", "webhook.certManager.enabled=true")])
def test_lint_strict_in_both_modes(values: tuple[str, ...]) -> None:
    helm("lint", str(CHART), "--strict", *values)
