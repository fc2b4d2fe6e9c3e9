"""The staging pod's progress reporter: throttled, final records always sent, failures never fatal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kimik3_operator.contract.stager import PROGRESS_FIELD_MANAGER, PROGRESS_KEY
from kimik3_operator.stager.progress_configmap import ConfigMapReporter


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


def test_patches_its_configmap_at_most_every_interval_and_always_the_final_record(tmp_path: Path) -> None:
    now = [0.0]
    session = Session()
    r = ConfigMapReporter("k3-weights-model-1-progress", env=_sa(tmp_path), interval=10, clock=lambda: now[0],
                              session=session)  # type: ignore[arg-type]
    r({"phase": "Downloading", "percent": 1.0})
    now[0] = 5
    r({"phase": "Downloading", "percent": 2.0})  # throttled
    r({"phase": "Complete", "percent": 100.0, "commit": "abc"})  # final: always sent
    assert len(session.calls) == 2 and session.trust_env is False
    call = session.calls[-1]
    assert call["url"] == "https://127.0.0.1:6443/api/v1/namespaces/team-a/configmaps/k3-weights-model-1-progress"
    assert call["params"] == {"fieldManager": PROGRESS_FIELD_MANAGER}
    assert call["headers"]["Authorization"] == "Bearer tok-1"
    assert call["headers"]["Content-Type"] == "application/merge-patch+json"
    body = json.loads(call["data"])
    assert set(body) == {"data"} and set(body["data"]) == {PROGRESS_KEY}  # nothing but the progress
    record = json.loads(body["data"][PROGRESS_KEY])
    assert record == {"phase": "Complete", "percent": 100.0, "commit": "abc"}


def test_a_refused_patch_is_not_fatal(tmp_path: Path) -> None:
    session = Session(status=403)
    r = ConfigMapReporter("j", env=_sa(tmp_path), session=session)  # type: ignore[arg-type]
    r({"phase": "Complete"})
    r({"phase": "Failed"})
    assert len(session.calls) == 2 and r._warned


def test_outside_a_cluster_it_does_nothing(tmp_path: Path) -> None:
    r = ConfigMapReporter("j", env={"KIMIK3_SERVICEACCOUNT_DIR": str(tmp_path)})
    r({"phase": "Complete"})
    assert not r.enabled
