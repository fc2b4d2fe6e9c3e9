"""Weights on the real cluster: staging Jobs run (their real command, see stager.py) before anything
serves, report progress through their own narrow Role, and hand the resolved commit to status, the
compatibility hash and the serving pods' wait; a new revision stages beside what serves; a pvc://
checkpoint is verified in place; the token never leaves its Secret."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.kube import apply, condition, get_json, kubectl, wait_for
from e2e.harness.stager import Stager
from kimik3_operator.api.reasons import ALL_REPLICAS_READY, WEIGHTS_STAGING
from kimik3_operator.contract.stager import PROGRESS_FIELD_MANAGER, PROGRESS_KEY
from kimik3_operator.stager import marker_path
from tests.support.cases import base_deployment

pytestmark = pytest.mark.e2e

TOKEN = "hf_e2e_token_that_must_never_be_logged"
GB300 = {"nvidia.com/gpu.product": "NVIDIA-GB300"}


def _deployment(namespace: str) -> dict[str, Any]:
    body = base_deployment(name="k3w", namespace=namespace)
    # Delete: the cache claim is owned, so it is pruned once no checkpoint stages into it (test below).
    body["spec"]["model"] = {"uri": "hf://moonshotai/Kimi-K3", "authSecretRef": {"name": "hf-token"},
                             "cache": {"retentionPolicy": "Delete"}}
    body["spec"]["engine"] = {"speculative": {"method": "DSpark", "draftModelUri": "hf://moonshotai/Kimi-K3-DSpark"}}
    body["spec"]["pools"] = [{"name": "gb300", "nodeSelector": GB300,
                              "aggregated": {"replicas": 1, "parallelism": {"tensor": 8}}}]
    return body


def _cr(namespace: str) -> dict[str, Any]:
    return get_json("kimik3deployment", "k3w", "-n", namespace)


def _weights(cr: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {w["name"]: w for w in (cr.get("status") or {}).get("weights") or []}


def _jobs(namespace: str) -> dict[str, dict[str, Any]]:
    return {j["metadata"]["name"]: j for j in get_json("jobs", "-n", namespace, "--show-managed-fields")["items"]}


def _lws_wait_commits(namespace: str) -> dict[str, str]:
    (lws,) = get_json("leaderworkersets", "-n", namespace)["items"]
    template = lws["spec"]["leaderWorkerTemplate"]
    pod = (template.get("leaderTemplate") or template["workerTemplate"])["spec"]
    return {c["name"]: c["command"][4] for c in pod["initContainers"]}  # python3 -c SCRIPT DEST COMMIT TIMEOUT


def _ready(namespace: str) -> dict[str, Any] | None:
    cr = _cr(namespace)
    ready = condition(cr, "Ready")
    return cr if ready and ready["status"] == "True" else None


def test_weights_are_staged_before_anything_serves(operator: Path, stager: Stager, namespace: str) -> None:
    kubectl("-n", namespace, "create", "secret", "generic", "hf-token", f"--from-literal=token={TOKEN}")
    stager.held.add(namespace)
    apply(_deployment(namespace))

    # Held: the Jobs exist and run, nothing serves, status says why.
    jobs = wait_for("two staging Jobs", lambda: len(_jobs(namespace)) == 2 and _jobs(namespace), timeout=60)
    cr = wait_for(WEIGHTS_STAGING, lambda: (c := _cr(namespace)) and (r := condition(c, "Ready"))
                  and r["reason"] == WEIGHTS_STAGING and c, timeout=60)
    assert set(_weights(cr)) == {"model", "draft"}
    # The cache claim binds (the local cluster's default StorageClass provisions it).
    wait_for("the cache claim to bind", lambda: get_json("pvc", "k3w-model-cache", "-n", namespace)
             .get("status", {}).get("phase") == "Bound", timeout=60)
    assert get_json("leaderworkersets", "-n", namespace)["items"] == []
    assert cr["status"]["phase"] == "Progressing"

    stager.held.discard(namespace)
    cr = wait_for("Ready after staging", lambda: _ready(namespace), timeout=180)
    weights = _weights(cr)
    assert weights["model"]["commit"] == stager.commits["moonshotai/Kimi-K3"]
    assert weights["draft"]["commit"] == stager.commits["moonshotai/Kimi-K3-DSpark"]
    assert all(w["phase"] == "Staged" and w["filesDone"] == w["filesTotal"] > 0 for w in weights.values())
    assert _lws_wait_commits(namespace) == {"wait-model": weights["model"]["commit"],
                                            "wait-draft": weights["draft"]["commit"]}
    pods = get_json("pods", "-n", namespace, "-l", "serving.kimik3.dev/role")["items"]
    assert pods and {p["metadata"]["labels"]["serving.kimik3.dev/compat-hash"] for p in pods} == {
        cr["status"]["engine"]["compatibilityHash"]}

    # Progress came through the pods' own Role: each Job's ConfigMap holds it, written by the
    # stager, and nothing of the Job is the stager's.
    for name, job in _jobs(namespace).items():
        progress = get_json("configmap", f"{name}-progress", "-n", namespace, "--show-managed-fields")
        record = json.loads(progress["data"][PROGRESS_KEY])
        assert record["phase"] == "Complete" and record["commit"]
        assert any(m["manager"] == PROGRESS_FIELD_MANAGER for m in progress["metadata"]["managedFields"])
        assert not any(m["manager"] == PROGRESS_FIELD_MANAGER for m in job["metadata"]["managedFields"])
    runs = stager.runs_in(namespace)
    assert len(runs) == 2 and all(r.exit_code == 0 for r in runs), [(r.exit_code, r.stderr[-500:]) for r in runs]

    # The token is only ever a Secret reference.
    for kind in ("jobs", "configmaps", "leaderworkersets", "pods", "kimik3deployments"):
        assert TOKEN not in kubectl("-n", namespace, "get", kind, "-o", "json").stdout, kind
    assert all(TOKEN not in log.read_text() for log in operator.glob("*.log"))
    assert all(TOKEN not in r.stderr + r.message for r in runs)
    assert jobs  # the two Jobs existed before anything served

    # Events mark the transitions, once each: staging, then ready.
    events = get_json("events", "-n", namespace, "--field-selector", "involvedObject.name=k3w")["items"]
    reasons = [e["reason"] for e in sorted(events, key=lambda e: e["metadata"]["creationTimestamp"])]
    assert reasons.count(WEIGHTS_STAGING) == 1 and reasons.count(ALL_REPLICAS_READY) == 1, reasons
    assert all(e["source"]["component"] == "kimik3-operator" for e in events)
    _the_cli_plans_what_the_operator_planned(namespace, cr["status"]["engine"]["compatibilityHash"])


def _the_cli_plans_what_the_operator_planned(namespace: str, status_hash: str) -> None:
    """`kimik3 plan NAME -n NS` of a deployment whose checkpoints are staged gives status's hash (the
    staged commits enter it), and `--diff` says nothing would roll."""
    kimik3 = str(Path(sys.executable).with_name("kimik3"))
    named = subprocess.run([kimik3, "plan", "k3w", "-n", namespace, "-o", "json"], capture_output=True, text=True,
                           timeout=60)
    assert named.returncode in (0, 3), named.stderr
    assert json.loads(named.stdout)["compatibilityHash"] == status_hash
    diff = subprocess.run([kimik3, "plan", f"{namespace}/k3w", "--diff"], capture_output=True, text=True, timeout=60)
    assert diff.returncode == 0, diff.stderr
    lines = diff.stdout.splitlines()
    assert lines[0] == f"compatibility hash {status_hash}: unchanged", lines
    assert lines[1:] and all(line.endswith(": unchanged") for line in lines[1:]), lines


def test_a_new_revision_stages_beside_what_serves_then_rolls(operator: Path, stager: Stager, namespace: str,
                                                             tmp_path: Path) -> None:
    kubectl("-n", namespace, "create", "secret", "generic", "hf-token", f"--from-literal=token={TOKEN}")
    body = _deployment(namespace)
    apply(body)
    wait_for("Ready", lambda: _ready(namespace), timeout=180)
    before = _lws_wait_commits(namespace)
    old_jobs = set(_jobs(namespace))

    v2 = stager.hub.add_repo("moonshotai/Kimi-K3", {"config.json": b'{"model_type": "kimi_k3", "v": 2}',
                                                    "model-00001-of-00001.safetensors": b"\x02" * 20_000},
                             branch="v2")
    stager.held.add(namespace)
    body["spec"]["model"]["revision"] = "v2"
    apply(body)
    new_job = wait_for("the v2 Job", lambda: (set(_jobs(namespace)) - old_jobs) or None, timeout=60)
    assert _lws_wait_commits(namespace) == before  # still serving the staged revision
    ready = condition(_cr(namespace), "Ready")
    assert ready is not None and ready["status"] == "True"
    stager.held.discard(namespace)
    wait_for("the LWS to wait for v2", lambda: _lws_wait_commits(namespace).get("wait-model") == v2, timeout=120)
    assert len(new_job) == 1 and "-model-" in next(iter(new_job))
    old_model_job = {j for j in old_jobs if "-model-" in j}
    wait_for("the old revision's Job pruned", lambda: not old_model_job & set(_jobs(namespace)), timeout=60)

    # pvc://: the user's claim holds the checkpoint; it is verified in place, the cache claim goes.
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "k3-weights"},
             "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "2Ti"}}}}
    kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(claim))
    folder = stager.root / "claims" / namespace / "k3-weights" / "kimi-k3"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "kimi_k3"}')
    (folder / "model-00001-of-00001.safetensors").write_bytes(b"\x03" * 10_000)
    body["spec"]["model"] = {"uri": "pvc://k3-weights/kimi-k3"}
    body["spec"]["engine"] = {}  # no draft either: nothing left for the cache claim
    apply(body)

    def verified_in_place() -> dict[str, Any] | None:
        cr = _cr(namespace)
        model = _weights(cr).get("model") or {}
        return cr if model.get("uri") == "pvc://k3-weights/kimi-k3" and model.get("phase") == "Staged" else None

    cr = wait_for("the pvc:// checkpoint verified", verified_in_place, timeout=120)
    assert len(_weights(cr)["model"]["commit"]) == 64
    wait_for("the cache claim pruned", lambda: "k3w-model-cache" not in {
        p["metadata"]["name"] for p in get_json("pvc", "-n", namespace)["items"]}
        or None, timeout=60)
    assert marker_path(folder).is_file(), "the pvc:// stage wrote no completion marker"


def test_a_user_string_naming_a_variable_reaches_the_stager_as_written(operator: Path, stager: Stager,
                                                                       namespace: str) -> None:
    """The kubelet expands `$(VAR)` in a container's command: a revision `v$(HF_TOKEN)` rendered as it
    is would hand the stager the token (its redactor would then print *** where the name was)."""
    kubectl("-n", namespace, "create", "secret", "generic", "hf-token", f"--from-literal=token={TOKEN}")
    body = _deployment(namespace)
    body["spec"]["model"]["revision"] = "v$(HF_TOKEN)"
    body["spec"]["engine"] = {}
    apply(body)
    run = wait_for("the staging pod's first attempt", lambda: next(iter(stager.runs_in(namespace)), None),
                   timeout=120)
    assert run.exit_code != 0 and "v$(HF_TOKEN)" in run.message, (run.exit_code, run.message, run.stderr[-500:])
    assert TOKEN not in run.stderr + run.message
    (job,) = _jobs(namespace).values()
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--revision") + 1] == "v$$(HF_TOKEN)"


def _claim(namespace: str) -> dict[str, Any] | None:
    got = kubectl("get", "pvc", "k3w-model-cache", "-n", namespace, "-o", "json", check=False)
    return json.loads(got.stdout) if got.returncode == 0 else None


def test_the_cache_claim_outlives_its_deployment_unless_its_policy_says_delete(operator: Path, stager: Stager,
                                                                               namespace: str) -> None:
    """spec.model.cache.retentionPolicy: Retain (the default) keeps the claim when the deployment is
    deleted, and the deployment created again adopts it; Delete lets garbage collection take it."""
    kubectl("-n", namespace, "create", "secret", "generic", "hf-token", f"--from-literal=token={TOKEN}")
    body = _deployment(namespace)
    del body["spec"]["model"]["cache"]  # the default: Retain
    apply(body)
    claim = wait_for("the cache claim", lambda: _claim(namespace), timeout=60)
    assert not claim["metadata"].get("ownerReferences"), claim["metadata"]
    wait_for("Ready after staging", lambda: _ready(namespace), timeout=180)

    kubectl("delete", "kimik3deployment", "k3w", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_for("the staging Jobs garbage-collected", lambda: not _jobs(namespace), timeout=120)
    kept = _claim(namespace)
    assert kept is not None and kept["metadata"]["uid"] == claim["metadata"]["uid"]

    apply(body)  # the same name again: the claim is adopted, not replaced
    cr = wait_for("Ready again", lambda: _ready(namespace), timeout=180)
    adopted = _claim(namespace)
    assert adopted is not None and adopted["metadata"]["uid"] == claim["metadata"]["uid"]
    assert not adopted["metadata"].get("ownerReferences")

    body["spec"]["model"]["cache"] = {"retentionPolicy": "Delete"}
    apply(body)
    owned = wait_for("the claim owned by the deployment", lambda: (c := _claim(namespace))
                     and [r["uid"] for r in c["metadata"].get("ownerReferences") or []] == [cr["metadata"]["uid"]]
                     and c, timeout=60)
    assert owned["metadata"]["uid"] == claim["metadata"]["uid"]
    kubectl("delete", "kimik3deployment", "k3w", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_for("the claim garbage-collected with it", lambda: _claim(namespace) is None, timeout=120)
