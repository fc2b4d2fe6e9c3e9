"""The Helm chart with the real helm on the real API server: lint, the installed objects, and an
upgrade that changes the CRD (and back)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from e2e.harness.kube import ROOT, get_json, kubectl, wait_for

from .conftest import CHART, CHART_NAMESPACE, CRD, RELEASE, SERVICE_ACCOUNT, WEBHOOK_VALUES, helm

pytestmark = pytest.mark.e2e


def test_lint_strict(cluster: dict[str, str]) -> None:
    helm("lint", str(CHART), "--strict")


def test_values_schema_rejects_unknown_and_unpinned_values(cluster: dict[str, str]) -> None:
    # more than one replica without leader election would have two operators acting at once
    for bad in ("replicas=9", "image.tag=latest", "unknownKey=1", "logLevel=LOUD", "leaderElection.enabled=false"):
        result = subprocess.run(["helm", "template", "t", str(CHART), "--set", bad], capture_output=True, text=True)
        assert result.returncode != 0 and "values don't meet the specifications" in result.stderr, (bad, result.stderr)


def test_installed_objects(chart: str) -> None:
    deploy = get_json("deployment", SERVICE_ACCOUNT, "-n", CHART_NAMESPACE)
    pod = deploy["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {p["name"] for p in c["ports"]} == {"metrics", "probes"}
    # two replicas taking turns on the release's Lease, named by the downward API
    assert deploy["spec"]["replicas"] == 2
    assert {"--leader-elect", f"--lease-name={SERVICE_ACCOUNT}"} <= set(c["args"])
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c["env"]}
    assert (env["POD_NAME"], env["POD_NAMESPACE"]) == ("metadata.name", "metadata.namespace")
    assert deploy["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    role_binding = get_json("rolebinding", SERVICE_ACCOUNT, "-n", CHART_NAMESPACE)
    assert role_binding["roleRef"]["kind"] == "Role"
    assert role_binding["subjects"] == [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT,
                                         "namespace": CHART_NAMESPACE}]
    role = get_json("clusterrole", SERVICE_ACCOUNT)
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
    binding = get_json("clusterrolebinding", SERVICE_ACCOUNT)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": CHART_NAMESPACE}]
    crd = get_json(CRD)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def _printer_columns() -> list[str]:
    return [c["name"] for c in get_json(CRD)["spec"]["versions"][0]["additionalPrinterColumns"]]


def test_upgrade_changes_the_crd(chart: str, tmp_path: Path) -> None:
    # An "older" chart whose CRD lacks the Endpoint column: upgrading to it and back to the
    # current chart must change the installed CRD both ways, with no manual step.
    old = tmp_path / "kimik3-operator"
    shutil.copytree(CHART, old)
    template = old / "templates" / "crds" / "kimik3deployments.yaml"
    text = template.read_text()
    column = "    - name: Endpoint\n      type: string\n      jsonPath: .status.endpoint\n"
    assert column in text
    template.write_text(text.replace(column, ""))
    meta = yaml.safe_load((old / "Chart.yaml").read_text())
    (old / "Chart.yaml").write_text(yaml.safe_dump({**meta, "version": "0.0.9"}))
    helm("upgrade", RELEASE, str(old), "-n", CHART_NAMESPACE)
    assert "Endpoint" not in _printer_columns()
    helm("upgrade", RELEASE, str(CHART), "-n", CHART_NAMESPACE)
    assert "Endpoint" in _printer_columns()
    history = helm("history", RELEASE, "-n", CHART_NAMESPACE, "-o", "json").stdout
    assert len(yaml.safe_load(history)) >= 3


def test_optional_monitoring_and_priority_render(cluster: dict[str, str]) -> None:
    flags = ("metrics.serviceMonitor.enabled=true,metrics.podMonitor.enabled=true,"
             "metrics.prometheusRule.enabled=true,metrics.grafanaDashboard.enabled=true,priorityClass.create=true")
    docs = [d for d in yaml.safe_load_all(helm("template", "t", str(CHART), "-n", CHART_NAMESPACE,
                                               "--set", flags).stdout) if d]
    kinds = {d["kind"]: d for d in docs}
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule", "PriorityClass", "ConfigMap"} <= set(kinds)
    boards = {key: json.loads(text) for key, text in kinds["ConfigMap"]["data"].items()}  # valid JSON
    assert set(boards) == {"serving.json", "operator.json"}
    pod_monitor = kinds["PodMonitor"]["spec"]
    assert pod_monitor["selector"]["matchLabels"]["app.kubernetes.io/managed-by"] == "kimik3-operator"
    exprs = [r["expr"] for g in kinds["PrometheusRule"]["spec"]["groups"] for r in g["rules"]]
    assert any("kimik3_operator_reconcile_errors_total" in e for e in exprs)
    # what the API server knows without the prometheus-operator CRDs must pass a server dry run
    core = [d for d in docs if d["kind"] in ("PriorityClass", "ConfigMap")]
    result = subprocess.run(["kubectl", "apply", "--dry-run=server", "-n", CHART_NAMESPACE, "-f", "-"],
                            input=yaml.safe_dump_all(core), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_install_manifest_is_rendered_from_the_chart(chart: str) -> None:
    fresh = subprocess.run([str(CHART.parents[1] / "scripts" / "render-install.sh"), "--stdout"],
                           capture_output=True, text=True, check=True).stdout
    committed = (CHART.parents[1] / "manifests" / "install.yaml").read_text()
    assert committed == fresh, "manifests/install.yaml is stale: run scripts/render-install.sh"
    # The release installed here points its webhook at the host (webhook.url): applying the file's
    # in-cluster Service over it would ask for both, so the webhook configuration is checked as a
    # fresh object of its own name, and everything else as an apply over the release.
    docs = [d for d in yaml.safe_load_all(committed) if d]
    hooks = [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
    assert hooks and all("service" in w["clientConfig"] for h in hooks for w in h["webhooks"])
    for hook in hooks:
        hook["metadata"]["name"] += "-install-check"
    for verb, objs in (("apply", [d for d in docs if d not in hooks]), ("create", hooks)):
        result = subprocess.run(["kubectl", verb, "--dry-run=server", "-f", "-"], input=yaml.safe_dump_all(objs),
                                capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def test_the_helm_test_check_passes_as_its_own_service_account(operator: Path, tmp_path: Path) -> None:
    """`helm test`'s pod never runs here (kwok runs no containers and completes only Job pods a
    test annotates), so this plays it: the hook's ServiceAccount, Role and RoleBinding as the chart
    renders them for this release, and the pod's command run on the host with that identity."""
    rendered = helm("template", RELEASE, str(CHART), "-n", CHART_NAMESPACE, *WEBHOOK_VALUES,
                    "--show-only", "templates/tests/check-install.yaml").stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    grants = [d for d in docs if d["kind"] != "Pod"]
    kubectl("apply", "-f", "-", input=yaml.safe_dump_all(grants))
    try:
        account = pod["spec"]["serviceAccountName"]
        kubeconfig = subprocess.run([str(ROOT / "scripts" / "sa-kubeconfig.sh"), CHART_NAMESPACE, account,
                                     str(tmp_path / "kubeconfig"), "10m"],
                                    capture_output=True, text=True, check=True, timeout=60).stdout.strip()
        (container,) = pod["spec"]["containers"]
        kimik3 = Path(sys.executable).with_name("kimik3")
        result = subprocess.run([str(kimik3), *container["args"]], capture_output=True, text=True, timeout=120,
                                env={**os.environ, "KUBECONFIG": kubeconfig})
        assert result.returncode == 0, result.stdout + result.stderr
        lines = result.stdout.splitlines()
        assert [line.split(":")[0] for line in lines] == ["ok  CRD served", "ok  webhook answers", "ok  operator ready"]
        assert "InsufficientMemory" in lines[1]
        # the dry run stored nothing
        assert kubectl("get", "k3", "kimik3-install-check", "-n", CHART_NAMESPACE, check=False).returncode != 0
    finally:
        kubectl("delete", "-f", "-", "--ignore-not-found", input=yaml.safe_dump_all(grants), check=False)


def test_namespace_users_get_deployments_through_view_and_edit(chart: str, namespace: str) -> None:
    """The chart's aggregated ClusterRoles reach Kubernetes' default roles (the controller manager
    aggregates them): view reads KimiK3Deployments, edit also writes them, neither their status."""
    for user, role in (("e2e-viewer", "view"), ("e2e-editor", "edit")):
        kubectl("-n", namespace, "create", "rolebinding", user, f"--clusterrole={role}", f"--user={user}")

    def can(user: str, verb: str, *subresource: str) -> bool:
        got = kubectl("auth", "can-i", verb, "kimik3deployments.serving.kimik3.dev", *subresource, "-n", namespace,
                      f"--as={user}", check=False)
        return got.stdout.strip() == "yes"

    wait_for("view and edit to aggregate the chart's roles",
             lambda: can("e2e-viewer", "list") and can("e2e-editor", "create"), timeout=60)
    assert can("e2e-viewer", "watch") and not can("e2e-viewer", "create") and not can("e2e-viewer", "delete")
    assert can("e2e-editor", "patch") and can("e2e-editor", "delete")
    assert not can("e2e-editor", "patch", "--subresource=status")


def test_the_installed_replicas_have_a_disruption_budget(chart: str) -> None:
    budget = get_json("poddisruptionbudget", SERVICE_ACCOUNT, "-n", CHART_NAMESPACE)
    assert budget["spec"]["minAvailable"] == 1
    selector = budget["spec"]["selector"]["matchLabels"]
    deploy = get_json("deployment", SERVICE_ACCOUNT, "-n", CHART_NAMESPACE)
    assert selector.items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    assert "podAntiAffinity" in deploy["spec"]["template"]["spec"]["affinity"]
