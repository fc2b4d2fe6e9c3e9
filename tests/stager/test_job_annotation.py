"""The staging pod's progress reporter: throttled, final records always sent, failures never fatal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kimik3_operator.contract.stager import PROGRESS_ANNOTATION, PROGRESS_FIELD_MANAGER
from kimik3_operator.stager.job_annotation import JobAnnotationReporter


class Session:
    def __init__(self, status: int = 200) -> None:
        self.calls: list[dict[str, Any]] = []
        self.status = status
        self.trust_env = True

    def patch(self, url: str, **kw: Any) -> Any:
        self.calls.append({"url": url, **kw})
        return type("R", (), {"status_code": self.status, "text": "denied"})()


def _sa(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "token").write_text("tok-1\n")
    (tmp_path / "namespace").write_text("team-a")
    return {"KIMIK3_SERVICEACCOUNT_DIR": str(tmp_path), "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": "6443"}


def test_patches_its_job_at_most_every_interval_and_always_the_final_record(tmp_path: Path) -> None:
    now = [0.0]
    session = Session()
    r = JobAnnotationReporter("k3-weights-model-1", env=_sa(tmp_path), interval=10, clock=lambda: now[0],
                              session=session)  # type: ignore[arg-type]
    r({"phase": "Downloading", "percent": 1.0})
    now[0] = 5
    r({"phase": "Downloading", "percent": 2.0})  # throttled
    r({"phase": "Complete", "percent": 100.0, "commit": "abc"})  # final: always sent
    assert len(session.calls) == 2 and session.trust_env is False
    call = session.calls[-1]
    assert call["url"] == "https://127.0.0.1:6443/apis/batch/v1/namespaces/team-a/jobs/k3-weights-model-1"
    assert call["params"] == {"fieldManager": PROGRESS_FIELD_MANAGER}
    assert call["headers"]["Authorization"] == "Bearer tok-1"
    assert call["headers"]["Content-Type"] == "application/merge-patch+json"
    record = json.loads(json.loads(call["data"])["metadata"]["annotations"][PROGRESS_ANNOTATION])
    assert record == {"phase": "Complete", "percent": 100.0, "commit": "abc"}


def test_a_refused_patch_is_not_fatal(tmp_path: Path) -> None:
    session = Session(status=403)
    r = JobAnnotationReporter("j", env=_sa(tmp_path), session=session)  # type: ignore[arg-type]
    r({"phase": "Complete"})
    r({"phase": "Failed"})
    assert len(session.calls) == 2 and r._warned


def test_outside_a_cluster_it_does_nothing(tmp_path: Path) -> None:
    r = JobAnnotationReporter("j", env={"KIMIK3_SERVICEACCOUNT_DIR": str(tmp_path)})
    r({"phase": "Complete"})
    assert not r.enabled
