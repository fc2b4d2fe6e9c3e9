"""Staging Jobs, the cache claim and the serving pods' view of the weights: credentials only where
needed and never in arguments, one folder and one Job per (source, revision), least privilege."""

from __future__ import annotations

import json
from typing import Any

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.planner import plan_deployment, pool_facts, with_staged
from kimik3_operator.render import Owner, render_serving, render_weights
from tests.support.cases import base_deployment
from tests.support.nodes import all_pools

OWNER = Owner(name="k3", namespace="ns", uid="u-1")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _plan(model: dict[str, Any], engine: dict[str, Any] | None = None) -> Any:
    body = base_deployment(name="k3", namespace="ns")
    body["spec"]["model"] = model
    if engine:
        body["spec"]["engine"] = engine
    spec = KimiK3Deployment.model_validate(body).spec
    return plan_deployment(spec, {p.name: pool_facts(p.node_selector, all_pools()) for p in spec.pools})


def _kinds(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


DSPARK = {"speculative": {"method": "DSpark", "draftModelUri": "hf://moonshotai/Kimi-K3-DSpark"}}


def test_hub_sources_stage_into_the_cache_claim_with_the_token_as_a_secret_reference() -> None:
    plan = _plan({"uri": "hf://moonshotai/Kimi-K3", "revision": "main", "authSecretRef": {"name": "hf"},
                  "endpoint": "https://hf-mirror.example", "cache": {"size": "3Ti", "storageClassName": "fast"}},
                 DSPARK)
    objs = render_weights(OWNER, plan, "img:1")
    (claim,) = _kinds(objs, "PersistentVolumeClaim")
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "3Ti"}},
                             "storageClassName": "fast"}
    jobs = _kinds(objs, "Job")
    assert [j["metadata"]["labels"]["serving.kimik3.dev/weights-source"] for j in jobs] == ["model", "draft"]
    for job in jobs:
        pod = job["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert c["image"] == "img:1" and pod["restartPolicy"] == "Never"
        assert pod["serviceAccountName"] == "k3-weights"
        env = {e["name"]: e for e in c["env"]}
        assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
        assert env["HF_ENDPOINT"]["value"] == "https://hf-mirror.example"
        assert not any("hf" == a or "token" in a.lower() for a in c["command"])
        assert c["command"][c["command"].index("--report-configmap") + 1] == f"{job['metadata']['name']}-progress"
        assert c["command"][c["command"].index("--progress-file") + 1] == "/dev/termination-log"
        assert c["securityContext"]["readOnlyRootFilesystem"] and pod["securityContext"]["runAsNonRoot"]
    # Two identities, each with its own Role: the stager's and the router's (rendered with the
    # weights, since it never changes and a router may run while a new revision stages).
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        assert sorted(o["metadata"]["name"] for o in _kinds(objs, kind)) == ["k3-router", "k3-weights"]
    roles = {o["metadata"]["name"]: o for o in _kinds(objs, "Role")}
    role = roles["k3-weights"]  # its progress, nothing of its Job
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["patch"],
                              "resourceNames": [f"{j['metadata']['name']}-progress" for j in jobs]}]
    assert [m["metadata"]["name"] for m in _kinds(objs, "ConfigMap")] == role["rules"][0]["resourceNames"]
    assert all("data" not in m for m in _kinds(objs, "ConfigMap"))  # the staging pod's to fill
    # The router's: list and watch pods, nothing else (no get, no secrets, no writes).
    assert roles["k3-router"]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    bindings = {o["metadata"]["name"]: o for o in _kinds(objs, "RoleBinding")}
    for name in ("k3-weights", "k3-router"):
        assert bindings[name]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
        assert bindings[name]["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": "ns"}]
    # The router's token is mounted only where a pod asks for it (the router pod does).
    (router_sa,) = [a for a in _kinds(objs, "ServiceAccount") if a["metadata"]["name"] == "k3-router"]
    assert router_sa["automountServiceAccountToken"] is False


def test_a_new_revision_is_a_new_job_and_a_new_folder() -> None:
    def job_and_folder(revision: str) -> tuple[str, str]:
        (job,) = _kinds(render_weights(OWNER, _plan({"uri": "hf://moonshotai/Kimi-K3", "revision": revision})), "Job")
        cmd = job["spec"]["template"]["spec"]["containers"][0]["command"]
        return job["metadata"]["name"], cmd[cmd.index("--dest") + 1]
    main, v2 = job_and_folder("main"), job_and_folder("v2")
    assert main[0] != v2[0] and main[1] != v2[1]
    assert job_and_folder("main") == main


def test_serving_pods_mount_read_only_and_wait_for_the_staged_commit() -> None:
    plan = with_staged(_plan({"uri": "hf://moonshotai/Kimi-K3", "authSecretRef": {"name": "hf"}}), {"model": COMMIT})
    unstaged = _plan({"uri": "hf://moonshotai/Kimi-K3", "authSecretRef": {"name": "hf"}})
    assert plan.compat_hash != unstaged.compat_hash  # the weights enter the P/D compatibility hash
    (lws,) = _kinds(render_serving(OWNER, plan), "LeaderWorkerSet")
    pod = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    (wait,) = pod["initContainers"]
    assert wait["image"] == pod["containers"][0]["image"]  # the serving image, not the operator's
    assert wait["command"][:2] == ["python3", "-c"] and wait["command"][3:5] == ["/models/kimi-k3", COMMIT]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "k3-model-cache", "readOnly": True}} \
        in pod["volumes"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/models/kimi-k3")
    assert mount["readOnly"] and mount["subPath"].startswith("model-")
    assert "HF_TOKEN" not in json.dumps(pod)


def test_a_commit_revision_is_known_before_staging() -> None:
    plan = _plan({"uri": "hf://moonshotai/Kimi-K3", "revision": COMMIT})
    assert plan.weights.staged and plan.weights.sources[0].commit == COMMIT


def test_pvc_sources_are_verified_in_place_on_the_users_claim() -> None:
    plan = _plan({"uri": "pvc://k3-weights/checkpoints/kimi-k3"})
    objs = render_weights(OWNER, plan)
    # nothing to stage into: no cache claim, only the compile cache's own (render/compile_cache.py)
    assert [c["metadata"]["name"] for c in _kinds(objs, "PersistentVolumeClaim")] == ["k3-compile-cache"]
    (job,) = _kinds(objs, "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["volumes"][0]["persistentVolumeClaim"] == {"claimName": "k3-weights"}
    cmd = pod["containers"][0]["command"]
    assert cmd[cmd.index("--dest") + 1] == "/cache/checkpoints/kimi-k3" and "--revision" not in cmd
    (lws,) = _kinds(render_serving(OWNER, with_staged(plan, {"model": "f" * 64})), "LeaderWorkerSet")
    mount = next(m for m in lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
                 ["volumeMounts"] if m["mountPath"] == "/models/kimi-k3")
    assert mount == {"name": "weights-k3-weights", "mountPath": "/models/kimi-k3",
                     "subPath": "checkpoints/kimi-k3", "readOnly": True}


def test_s3_credentials_are_the_secrets_aws_keys_and_the_endpoint_comes_from_the_spec() -> None:
    plan = _plan({"uri": "s3://models/kimi-k3", "authSecretRef": {"name": "s3-creds"},
                  "endpoint": "http://127.0.0.1:9000", "allowInsecureEndpoint": True})
    (job,) = _kinds(render_weights(OWNER, plan), "Job")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert "envFrom" not in c  # never the whole Secret
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert refs == {k: {"name": "s3-creds", "key": k, "optional": True}
                    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION")}
    assert {"name": "AWS_ENDPOINT_URL_S3", "value": "http://127.0.0.1:9000"} in c["env"]
    assert not any(e["name"] == "AWS_ENDPOINT_URL" for e in c["env"])  # it would redirect STS too
    assert not any(e["name"].startswith("HF_") for e in c["env"])


def test_an_operator_upgrade_changes_no_serving_template() -> None:
    """What an operator release changes (its version, its image) must not reach a pod template, or
    upgrading the operator would restart every serving replica."""
    from kimik3_operator.render import render_children

    plan = with_staged(_plan({"uri": "hf://moonshotai/Kimi-K3"}, DSPARK), {"model": COMMIT, "draft": COMMIT})
    before = render_children(OWNER, plan, "ghcr.io/kimik3-operator/kimik3-operator:0.1.0")
    after = render_children(OWNER, plan, "ghcr.io/kimik3-operator/kimik3-operator:9.9.9")
    serving = {"Service", "ComputeDomain", "LeaderWorkerSet"}
    assert [o for o in before if o["kind"] in serving] == [o for o in after if o["kind"] in serving]
    assert "kimik3-operator:" not in json.dumps([o for o in after if o["kind"] in serving])


def test_the_inline_wait_agrees_with_the_stagers_marker(tmp_path: Any) -> None:
    import subprocess
    import sys

    from kimik3_operator.render.weights import WAIT_SCRIPT
    from kimik3_operator.stager import marker_path, stage

    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"\0" * 1000)
    result = stage("pvc://claim/src", "", src, env={}).commit  # pvc:// verifies the files in place
    assert marker_path(src).is_file()

    def wait(dest_path: Any, want: str) -> int:
        return subprocess.run([sys.executable, "-c", WAIT_SCRIPT, str(dest_path), want, "0"],
                              capture_output=True, text=True).returncode

    assert wait(src, result) == 0
    assert wait(src, "0" * 64) == 1
    (src / "model.safetensors").write_bytes(b"\0" * 10)  # truncated after staging
    assert wait(src, result) == 1
    assert wait(tmp_path, result) == 1  # nothing staged there
