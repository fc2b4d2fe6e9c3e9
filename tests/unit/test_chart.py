"""The chart as `helm template` renders it, with the real helm: names through one fullname, the
disruption budget and node spread of the replicas, the roles aggregated into view/edit/admin, the
`helm test` hook, the operator's flags, and NOTES.txt. (test_chart_rbac.py holds the operator's
own grants to the registry; e2e/tests/test_chart.py installs the chart on a real API server.)"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from kimik3_operator.api import GROUP, PLURAL
from kimik3_operator.cli import parser
from tests.support.chart import CHART, helm_binary, rendered, triples

NAMESPACE = "kimik3-system"
HOOK = "helm.sh/hook"


def _kinds(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _one(docs: list[dict[str, Any]], kind: str, hook: bool = False) -> dict[str, Any]:
    (doc,) = [d for d in _kinds(docs, kind) if (HOOK in (d["metadata"].get("annotations") or {})) == hook]
    return doc


def _operator_args(docs: list[dict[str, Any]]) -> list[str]:
    (container,) = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def _helm(*args: str) -> subprocess.CompletedProcess[str]:
    helm = helm_binary()
    if helm is None:
        pytest.skip("helm is not built (e2e/cluster/build.sh helm)")
    return subprocess.run([helm, *args], capture_output=True, text=True, env={"KUBECONFIG": "/nonexistent"})


def test_lint_strict_passes() -> None:
    result = _helm("lint", str(CHART), "--strict")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("values", "fullname", "app_name"), [
    ((), "t-kimik3-operator", "kimik3-operator"),
    (("--set", "nameOverride=k3op"), "t-k3op", "k3op"),
    (("--set", "fullnameOverride=ops"), "ops", "kimik3-operator"),
])
def test_every_name_goes_through_the_fullname(values: tuple[str, ...], fullname: str, app_name: str) -> None:
    docs = rendered(*values)
    names = {d["metadata"]["name"] for d in docs if d["kind"] not in ("CustomResourceDefinition",)}
    assert names and all(n.startswith(fullname) for n in names), names
    deployment = _one(docs, "Deployment")
    assert deployment["metadata"]["name"] == fullname
    assert deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == app_name
    assert f"--lease-name={fullname}" in _operator_args(docs)
    assert _one(docs, "Pod", hook=True)["spec"]["containers"][0]["args"][2] == f"--deployment={fullname}"


def test_two_replicas_get_a_disruption_budget_and_spread_over_nodes() -> None:
    docs = rendered()
    pod_labels = _one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    budget = _one(docs, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    affinity = _one(docs, "Deployment")["spec"]["template"]["spec"]["affinity"]
    (term,) = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= pod_labels.items()


@pytest.mark.parametrize("values", [
    ("--set", "replicas=1"),
    ("--set", "podDisruptionBudget.enabled=false,spreadAcrossNodes=false"),
])
def test_one_replica_or_switched_off_has_no_budget_and_no_anti_affinity(values: tuple[str, ...]) -> None:
    docs = rendered(*values)
    assert not _kinds(docs, "PodDisruptionBudget")
    assert "affinity" not in _one(docs, "Deployment")["spec"]["template"]["spec"]


def test_own_affinity_and_topology_spread_replace_the_default() -> None:
    docs = rendered("--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                             ".nodeSelectorTerms[0].matchExpressions[0].key=pool",
                    "--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                             ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
                    "--set", "topologySpreadConstraints[0].maxSkew=1",
                    "--set", "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
                    "--set", "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway")
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    assert set(pod["affinity"]) == {"nodeAffinity"}
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"


def _aggregated(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"].rsplit("-", 1)[1]: d for d in _kinds(docs, "ClusterRole")
            if any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in d["metadata"]["labels"])}


def test_namespace_users_read_and_manage_deployments_through_the_default_roles() -> None:
    roles = _aggregated(rendered())
    assert set(roles) == {"view", "edit"}
    aggregates = {name: {k.rsplit("-", 1)[1] for k in role["metadata"]["labels"] if "/aggregate-to-" in k}
                  for name, role in roles.items()}
    assert aggregates == {"view": {"view", "edit", "admin"}, "edit": {"edit", "admin"}}
    assert triples(roles["view"]["rules"]) == {(GROUP, PLURAL, v) for v in ("get", "list", "watch")}
    assert triples(roles["edit"]["rules"]) == {(GROUP, PLURAL, v)
                                               for v in ("create", "update", "patch", "delete", "deletecollection")}
    assert not _aggregated(rendered("--set", "rbac.aggregateToDefaultRoles=false"))


def test_the_helm_test_pod_checks_the_install_with_the_least_rights() -> None:
    docs = rendered()
    pod = _one(docs, "Pod", hook=True)
    assert pod["metadata"]["annotations"][HOOK] == "test"
    (container,) = pod["spec"]["containers"]
    operator = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == operator["image"]
    assert container["args"] == ["check-install", f"--namespace={NAMESPACE}", "--deployment=t-kimik3-operator",
                                 "--webhook"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    # no Service, budget or NetworkPolicy of the operator selects it
    selector = _one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert not selector.items() <= pod["metadata"]["labels"].items()
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["serviceAccountName"] == _one(docs, "ServiceAccount", hook=True)["metadata"]["name"]
    role = _one(docs, "Role", hook=True)
    assert triples(role["rules"]) == {("apps", "deployments", "get"), (GROUP, PLURAL, "create")}
    assert [r.get("resourceNames") for r in role["rules"]] == [["t-kimik3-operator"], None]
    binding = _one(docs, "RoleBinding", hook=True)
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")
                and HOOK in (d["metadata"].get("annotations") or {})]
    # without the webhook there is nothing to dry-run: no create right
    docs = rendered("--set", "webhook.enabled=false")
    assert _one(docs, "Pod", hook=True)["spec"]["containers"][0]["args"][-1] == "--no-webhook"
    assert triples(_one(docs, "Role", hook=True)["rules"]) == {("apps", "deployments", "get")}


def test_the_operator_gets_its_settings_as_flags_that_kimik3_run_accepts() -> None:
    args = _operator_args(rendered("--set", "logFormat=json,logLevel=DEBUG,resyncSeconds=60,retrySeconds=5,workers=2"))
    parsed = parser().parse_args(args)
    settings = (parsed.log_format, parsed.log_level, parsed.resync_seconds, parsed.retry_seconds, parsed.workers)
    assert settings == ("json", "DEBUG", 60, 5, 2)
    assert parsed.tools_image == "ghcr.io/kimik3-operator/kimik3-operator:0.1.0"
    env = _one(rendered(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == ["POD_NAME", "POD_NAMESPACE"]


def test_notes_say_what_to_do_next() -> None:
    result = _helm("install", "t", str(CHART), "-n", NAMESPACE, "--dry-run=client")
    assert result.returncode == 0, result.stderr
    notes = result.stdout.partition("NOTES:\n")[2]
    for expected in ("helm test t -n kimik3-system", "kubectl get kimik3deployments -A", "status.endpoint",
                     ".status.conditions", "deployment/t-kimik3-operator"):
        assert expected in notes, expected


def test_an_image_digest_pins_the_operator_and_its_tools_everywhere_and_a_bad_one_is_refused() -> None:
    """image.digest: the operator, the staging Jobs' tools image (--tools-image) and the helm test
    pod pull repository@digest; the tag is not used. A digest that is not sha256 is refused by the
    values schema before anything renders."""
    digest = "sha256:" + "0123456789abcdef" * 4
    docs = rendered("--set", f"image.digest={digest}", "--set", "image.tag=9.9.9")
    pinned = f"ghcr.io/kimik3-operator/kimik3-operator@{digest}"
    images = [c["image"] for d in docs if d["kind"] in ("Deployment", "Pod")
              for c in (d["spec"]["template"]["spec"] if d["kind"] == "Deployment" else d["spec"])["containers"]]
    assert images and set(images) == {pinned}
    (operator,) = [d for d in docs if d["kind"] == "Deployment"]
    assert f"--tools-image={pinned}" in operator["spec"]["template"]["spec"]["containers"][0]["args"]
    helm = helm_binary()
    assert helm is not None
    bad = subprocess.run([helm, "template", "t", str(CHART), "--set", "image.digest=sha256:abc"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "image/digest" in bad.stderr


def test_router_images_reach_the_operator_as_its_defaults_and_a_malformed_one_is_refused() -> None:
    """routerImages (a release pins both by digest): `--router-image`/`--vllm-router-image` on the
    operator, absent when empty; a reference with neither tag nor digest is refused by the schema."""
    def args(*values: str) -> list[str]:
        (operator,) = [d for d in rendered(*values) if d["kind"] == "Deployment"]
        return [a for a in operator["spec"]["template"]["spec"]["containers"][0]["args"] if "router-image" in a]

    pinned = "127.0.0.1:5000/kimik3-operator/kimik3-router@sha256:" + "0123456789abcdef" * 4
    assert args() == []
    assert args("--set", f"routerImages.kimik3Router={pinned}",
                "--set", "routerImages.vllmRouter=mirror.example/vllm-router:0.1.17") == [
        f"--router-image={pinned}", "--vllm-router-image=mirror.example/vllm-router:0.1.17"]
    helm = helm_binary()
    assert helm is not None
    for bad_ref in ("mirror.example/kimik3-router", "Mirror/x:1", "x@sha256:abc"):
        bad = subprocess.run([helm, "template", "t", str(CHART), "--set", f"routerImages.kimik3Router={bad_ref}"],
                             capture_output=True, text=True)
        assert bad.returncode != 0 and "routerImages/kimik3Router" in bad.stderr, bad_ref
