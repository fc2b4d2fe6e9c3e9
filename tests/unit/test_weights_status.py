"""Status from the staging Jobs: progress mid-run, the commit at the end, a precise reason on failure."""

from __future__ import annotations

import json
from typing import Any

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.api.status import WeightsStatus
from kimik3_operator.contract.stager import PROGRESS_KEY
from kimik3_operator.planner.weights import weights_plan
from kimik3_operator.reconcile.weights_status import weights_state
from kimik3_operator.render import Owner
from kimik3_operator.render.weights import job_name, progress_name
from tests.support.cases import base_deployment

OWNER = Owner(name="k3", namespace="ns", uid="u")
PLAN = weights_plan(KimiK3Deployment.model_validate(base_deployment("k3", "ns")).spec)
JOB = job_name(OWNER, PLAN.sources[0])
JOB_UID = "job-uid-1"


def _job(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {JOB: {"metadata": {"name": JOB, "uid": JOB_UID}, "status": status}}


def _progress(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    name = progress_name(OWNER, PLAN.sources[0])
    return {name: {"metadata": {"name": name}, "data": {PROGRESS_KEY: json.dumps(record)}}}


def _pod(phase: str, message: str, created: str = "2026-11-30T00:00:00Z") -> dict[str, Any]:
    return {"metadata": {"name": f"{JOB}-{created}", "creationTimestamp": created,
                         "labels": {"batch.kubernetes.io/job-name": JOB},
                         "ownerReferences": [{"kind": "Job", "name": JOB, "uid": JOB_UID, "controller": True}]},
            "status": {"phase": phase, "containerStatuses": [{"state": {"terminated": {"message": message}}}]}}


def test_mid_run_progress_comes_from_the_progress_configmap() -> None:
    state = weights_state(OWNER, PLAN, _job({"active": 1, "failed": 1}), [], _progress({
        "phase": "Downloading", "percent": 37.04, "filesDone": 40, "filesTotal": 120,
        "bytesDone": 577, "bytesTotal": 1560, "commit": "a" * 40}))
    (s,) = state.sources
    assert (s.phase, s.percent, s.files_done, s.bytes_total, s.attempts, s.commit) == \
        ("Staging", 37.0, 40, 1560, 2, "a" * 40)
    assert not state.all_staged and state.commits == {}
    assert "model: staging 37% (40/120 files)" in state.summary()


def test_the_commit_comes_from_the_succeeded_pods_termination_message() -> None:
    record = {"phase": "Complete", "commit": "b" * 40, "filesDone": 120, "filesTotal": 120, "percent": 100.0}
    state = weights_state(OWNER, PLAN, _job({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}),
                          [_pod("Failed", "RevisionNotFound: x", "2026-11-30T00:00:00Z"),
                           _pod("Succeeded", json.dumps(record), "2026-11-30T00:05:00Z")])
    assert state.all_staged and state.commits == {"model": "b" * 40}
    assert state.sources[0].files_done == 120


def test_a_job_that_gave_up_says_why_in_the_words_of_its_last_attempt() -> None:
    failed = {"phase": "Failed", "reason": "RevisionNotFound", "message": "no revision v9 in moonshotai/Kimi-K3"}
    state = weights_state(OWNER, PLAN, _job({"failed": 3, "conditions": [
        {"type": "Failed", "status": "True", "message": "Job has reached the specified backoff limit"}]}),
        [_pod("Failed", json.dumps(failed))])
    (s,) = state.failed
    assert s.message is not None and s.message.startswith("RevisionNotFound: no revision v9 in moonshotai/Kimi-K3")
    assert "gave up after 3 attempts" in s.message


def test_a_complete_job_without_a_commit_is_a_failure_not_a_guess() -> None:
    state = weights_state(OWNER, PLAN, _job({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}),
                          [_pod("Succeeded", "")])
    assert not state.all_staged and state.failed and "without reporting a commit" in (state.failed[0].message or "")


def test_a_staged_commit_stands_once_the_jobs_pods_are_gone() -> None:
    """The terminated-pod garbage collector may delete a completed Job's pod: the commit the
    operator recorded for that Job stays (and only one of the right form)."""
    complete = _job({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})
    before = [WeightsStatus(name="model", job=JOB, phase="Staged", commit="b" * 40)]
    assert weights_state(OWNER, PLAN, complete, [], previous=before).commits == {"model": "b" * 40}
    other_job = [WeightsStatus(name="model", job="another", phase="Staged", commit="b" * 40)]
    bad_form = [WeightsStatus(name="model", job=JOB, phase="Staged", commit="b" * 64)]
    for previous in (other_job, bad_form):
        assert weights_state(OWNER, PLAN, complete, [], previous=previous).failed
