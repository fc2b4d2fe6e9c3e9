"""Attack: a compromised staging pod uses the one write it has.

Its ServiceAccount may patch its progress ConfigMap and nothing else (not its Job: parallelism,
suspend, owner references, finalizers, the Job's status), and whatever it writes there, or into its
termination message, the operator reads as untrusted: a forged record never stages a source, never
names the commit serving pods wait for, and reaches status only as bounded, typed progress. The
commit comes from the termination message of a pod the Job itself owns, of the form the source's
scheme resolves to, and equal to a pinned revision.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.contract.kinds import CONFIG_MAP
from kimik3_operator.contract.stager import MAX_MESSAGE, PROGRESS_FIELD_MANAGER, PROGRESS_KEY
from kimik3_operator.k8s.cluster import unchanged_since_our_apply, writes_digest
from kimik3_operator.planner import plan_deployment, pool_facts
from kimik3_operator.planner.weights import weights_plan
from kimik3_operator.reconcile.weights_status import untrusted_record, weights_state
from kimik3_operator.render import Owner, render_weights
from kimik3_operator.render.weights import job_name, progress_name
from tests.support.cases import base_deployment
from tests.support.nodes import all_pools

OWNER = Owner(name="k3", namespace="ns", uid="u-1")
HUB = "4f1c" * 10
SETTINGS = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=50),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                    max_leaves=20)
RECORD_KEYS = ("phase", "commit", "percent", "filesDone", "filesTotal", "bytesDone", "bytesTotal", "message",
               "reason", "fastPath", "uri")
FORGED = st.dictionaries(st.sampled_from(RECORD_KEYS) | st.text(max_size=12), JSON, max_size=12)


def _plan(model: dict[str, Any]) -> Any:
    body = base_deployment(name="k3", namespace="ns")
    body["spec"]["model"] = model
    return weights_plan(KimiK3Deployment.model_validate(body).spec)


HF = _plan({"uri": "hf://moonshotai/Kimi-K3"})
PINNED = _plan({"uri": "hf://moonshotai/Kimi-K3", "revision": HUB})
S3 = _plan({"uri": "s3://models/kimi-k3"})


def _job(plan: Any, status: dict[str, Any], uid: str = "job-uid") -> dict[str, dict[str, Any]]:
    name = job_name(OWNER, plan.sources[0])
    return {name: {"metadata": {"name": name, "uid": uid}, "status": status}}


COMPLETE = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
RUNNING = {"active": 1}


def _progress(plan: Any, text: str) -> dict[str, dict[str, Any]]:
    name = progress_name(OWNER, plan.sources[0])
    return {name: {"metadata": {"name": name}, "data": {PROGRESS_KEY: text}}}


def _pod(plan: Any, message: str, owner_uid: str | None = "job-uid", phase: str = "Succeeded") -> dict[str, Any]:
    name = job_name(OWNER, plan.sources[0])
    refs = [{"kind": "Job", "name": name, "uid": owner_uid, "controller": True}] if owner_uid else []
    return {"metadata": {"name": f"{name}-abcde", "creationTimestamp": "2026-11-30T00:00:00Z",
                         "labels": {"batch.kubernetes.io/job-name": name}, "ownerReferences": refs},
            "status": {"phase": phase, "containerStatuses": [{"state": {"terminated": {"message": message}}}]}}


def test_the_staging_pod_may_patch_its_progress_configmaps_and_nothing_else() -> None:
    body = base_deployment(name="k3", namespace="ns")
    body["spec"]["engine"] = {"speculative": {"method": "DSpark", "draftModelUri": "hf://moonshotai/Kimi-K3-DSpark"}}
    spec = KimiK3Deployment.model_validate(body).spec
    objs = render_weights(OWNER, plan_deployment(spec, {p.name: pool_facts(p.node_selector, all_pools())
                                                        for p in spec.pools}))
    roles = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Role"}
    assert sorted(roles) == ["k3-router", "k3-weights"]  # the stager's, and the router's of its own
    role = roles["k3-weights"]
    progress = [o["metadata"]["name"] for o in objs if o["kind"] == CONFIG_MAP.kind]
    assert len(progress) == 2  # the model's and the draft's
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["patch"],
                              "resourceNames": progress}]
    # The staging pod's ServiceAccount is bound to its Role alone: the router's (list/watch pods)
    # is bound to the router's ServiceAccount only.
    (sa,) = {o["spec"]["template"]["spec"]["serviceAccountName"] for o in objs if o["kind"] == "Job"}
    bound = [o["roleRef"]["name"] for o in objs if o["kind"] == "RoleBinding"
             if any(s["kind"] == "ServiceAccount" and s["name"] == sa for s in o["subjects"])]
    assert sa == "k3-weights" and bound == ["k3-weights"]
    for cm in (o for o in objs if o["kind"] == CONFIG_MAP.kind):
        assert set(cm) == {"apiVersion", "kind", "metadata"}  # nothing of ours for the pod to overwrite


@SETTINGS
@given(forged=FORGED, status=st.sampled_from((RUNNING, {}, {"failed": 2, "active": 1})))
def test_a_forged_progress_record_shows_only_typed_bounded_progress_and_stages_nothing(
        forged: dict[str, Any], status: dict[str, Any]) -> None:
    state = weights_state(OWNER, HF, _job(HF, status), [], _progress(HF, json.dumps(forged)))
    (s,) = state.sources
    assert s.phase in ("Staging", "Pending") and state.commits == {} and not state.all_staged
    assert s.commit is None or (isinstance(s.commit, str) and len(s.commit) in (40, 64))
    for value in (s.files_done, s.files_total, s.bytes_done, s.bytes_total):
        assert value is None or (type(value) is int and 0 <= value < 1 << 63)
    assert s.percent is None or 0 <= s.percent <= 100
    assert s.message is None or s.message in ("Pending", "Resolving", "Listing", "Downloading", "Verifying",
                                              "Complete", "Failed")


@SETTINGS
@given(forged=FORGED)
def test_a_forged_commit_in_the_progress_configmap_never_becomes_the_served_commit(forged: dict[str, Any]) -> None:
    """The Job completed, but its pod's termination message names no commit: the ConfigMap's
    `Complete` record with a well-formed commit does not fill in."""
    forged = {**forged, "phase": "Complete", "commit": "e" * 40}
    state = weights_state(OWNER, HF, _job(HF, COMPLETE), [_pod(HF, "")], _progress(HF, json.dumps(forged)))
    assert state.commits == {} and state.failed


def test_a_termination_message_from_a_pod_the_job_does_not_own_is_not_the_jobs_word() -> None:
    """Anyone who can create a pod may label it with the Job's name."""
    record = json.dumps({"phase": "Complete", "commit": "e" * 40})
    for pod in (_pod(HF, record, owner_uid=None), _pod(HF, record, owner_uid="another-job")):
        state = weights_state(OWNER, HF, _job(HF, COMPLETE), [pod])
        assert state.commits == {} and state.failed
    assert weights_state(OWNER, HF, _job(HF, COMPLETE), [_pod(HF, record)]).commits == {"model": "e" * 40}


def test_a_commit_of_the_wrong_form_or_not_the_pinned_one_is_refused() -> None:
    cases = [(HF, "e" * 64, "not the form of an hf:// commit"), (S3, "e" * 40, "not the form of an s3:// commit"),
             (HF, "main", "not the form"), (HF, "../../x", "not the form"),
             (PINNED, "e" * 40, f"but the revision pins {HUB}")]
    for plan, commit, why in cases:
        record = json.dumps({"phase": "Complete", "commit": commit})
        state = weights_state(OWNER, plan, _job(plan, COMPLETE), [_pod(plan, record)])
        assert state.commits == {}, (plan.sources[0].uri, commit)
        (failed,) = state.failed
        assert failed.message and (why in failed.message or "without reporting a commit" in failed.message), \
            failed.message


@SETTINGS
@given(forged=FORGED, junk=st.text(max_size=200))
def test_a_failed_attempts_words_reach_status_bounded_and_without_control_characters(
        forged: dict[str, Any], junk: str) -> None:
    status = {"failed": 3, "conditions": [{"type": "Failed", "status": "True", "message": "BackoffLimitExceeded"}]}
    for message in (json.dumps(forged), junk * 30, json.dumps({"reason": "X" * 500, "message": junk * 30})):
        state = weights_state(OWNER, HF, _job(HF, status), [_pod(HF, message, phase="Failed")])
        (s,) = state.failed
        assert s.message is not None and len(s.message) <= MAX_MESSAGE + 200
        assert not any(ord(c) < 32 and c not in "\t\n" for c in s.message)


def test_an_oversized_record_is_dropped_whole() -> None:
    record = {"phase": "Downloading", "percent": 50.0, "filler": "x" * 5000}
    assert untrusted_record(json.dumps(record)) == {}
    assert untrusted_record(json.dumps({"phase": "Downloading", "percent": 50.0})) == {
        "phase": "Downloading", "percent": 50.0}


def _entry(manager: str, fields: dict[str, Any], time: str) -> dict[str, Any]:
    return {"manager": manager, "operation": "Update" if manager == PROGRESS_FIELD_MANAGER else "Apply",
            "time": time, "fieldsType": "FieldsV1", "fieldsV1": fields}


def test_the_staging_pods_write_that_takes_a_field_of_ours_is_drift_the_operator_repairs() -> None:
    """Its progress costs no apply. A write under the progress manager's name that changes a label
    or owner reference we set takes that field out of our entry: drift, and the next pass applies
    the ConfigMap again, which takes it back. What it adds beside our fields (a finalizer, another
    label or key) no apply of ours can remove (server-side apply removes only fields its own
    manager owned), so once we applied it costs none; a process without the record of its apply
    (just started, or taking over) judges by times and applies once."""
    desired = {"metadata": {"annotations": {"serving.kimik3.dev/desired-hash": "h"}}}
    fields = {"f:metadata": {"f:labels": {"f:app": {}}, "f:ownerReferences": {"k:{\"uid\":\"u-1\"}": {}}}}
    ours = _entry("kimik3-operator", fields, "2026-11-30T00:00:00Z")

    def live(*entries: dict[str, Any], own: dict[str, Any] | None = None) -> dict[str, Any]:
        mine = ours if own is None else _entry("kimik3-operator", own, ours["time"])
        return {"metadata": {"uid": "cm", "annotations": {"serving.kimik3.dev/desired-hash": "h"},
                             "managedFields": [mine, *entries]}}
    applied = writes_digest(live())
    progress = _entry(PROGRESS_FIELD_MANAGER, {"f:data": {".": {}, f"f:{PROGRESS_KEY}": {}}}, "2026-11-30T00:01:00Z")
    assert unchanged_since_our_apply(desired, live(progress), applied)
    assert unchanged_since_our_apply(desired, live(progress))
    for taken, left in (({"f:metadata": {"f:labels": {"f:app": {}}}}, {"f:metadata": {"f:ownerReferences": {
                            "k:{\"uid\":\"u-1\"}": {}}}}),
                        ({"f:metadata": {"f:ownerReferences": {"k:{\"uid\":\"u-1\"}": {}}}},
                         {"f:metadata": {"f:labels": {"f:app": {}}}})):
        forged = _entry(PROGRESS_FIELD_MANAGER, {**progress["fieldsV1"], **taken}, "2026-11-30T00:01:00Z")
        assert not unchanged_since_our_apply(desired, live(forged, own=left), applied), taken
        assert not unchanged_since_our_apply(desired, live(forged, own=left)), taken
    for extra in ({"f:metadata": {"f:finalizers": {}}}, {"f:metadata": {"f:labels": {"f:x": {}}}},
                  {"f:data": {"f:other": {}}}, {"f:binaryData": {}}):
        beside = _entry(PROGRESS_FIELD_MANAGER, {**progress["fieldsV1"], **extra}, "2026-11-30T00:01:00Z")
        assert unchanged_since_our_apply(desired, live(beside), applied), extra
        assert not unchanged_since_our_apply(desired, live(beside)), extra
