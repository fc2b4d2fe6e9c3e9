"""What the staging Jobs say, as status: a pure function of the Jobs and their pods.

The final record (with the resolved commit) is the container's termination message, written by
`stage --progress-file /dev/termination-log`; while a Job runs, its latest record sits in the Job's
progress annotation (the pod writes it through its own narrow Role). Failed attempts say why in
their termination message, `Reason: message` on the last line, or a Failed JSON record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..api.v1alpha1 import WeightsStatus
from ..contract.stager import PROGRESS_ANNOTATION
from ..planner import WeightsPlan
from ..render.names import Owner
from ..render.weights import job_name

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


@dataclass(frozen=True)
class WeightsState:
    sources: list[WeightsStatus]
    commits: dict[str, str]
    """Staged sources and the commit each serves."""

    @property
    def failed(self) -> list[WeightsStatus]:
        return [s for s in self.sources if s.phase == "Failed"]

    @property
    def all_staged(self) -> bool:
        return all(s.phase == "Staged" for s in self.sources)

    def summary(self) -> str:
        parts = []
        for s in self.sources:
            if s.phase == "Failed":
                parts.append(f"{s.name}: failed: {s.message}")
            elif s.phase == "Staged":
                parts.append(f"{s.name}: staged at {s.commit}")
            elif s.percent is not None:
                parts.append(f"{s.name}: {s.phase.lower() if s.phase else 'pending'} {s.percent:g}% "
                             f"({s.files_done or 0}/{s.files_total or 0} files)")
            else:
                parts.append(f"{s.name}: {(s.phase or 'Pending').lower()} (Job {s.job})")
        return "; ".join(parts)


def _record(text: str | None) -> dict[str, Any]:
    """The JSON progress record in `text` (the last JSON line), else {"message": last line}."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    for line in reversed(lines):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {"message": lines[-1]} if lines else {}


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return term  # type: ignore[no-any-return]
    return {}


def _condition(job: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return c  # type: ignore[no-any-return]
    return None


def _newest(pods: Sequence[Mapping[str, Any]], phase: str) -> Mapping[str, Any] | None:
    matching = [p for p in pods if (p.get("status") or {}).get("phase") == phase]
    return max(matching, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""), default=None)


def weights_state(owner: Owner, weights: WeightsPlan, jobs: Mapping[str, Mapping[str, Any]],
                  pods: Sequence[Mapping[str, Any]]) -> WeightsState:
    out: list[WeightsStatus] = []
    commits: dict[str, str] = {}
    for source in weights.sources:
        name = job_name(owner, source)
        job = jobs.get(name) or {}
        job_pods = [p for p in pods if (p["metadata"].get("labels") or {}).get(JOB_NAME_LABEL) == name]
        counts = job.get("status") or {}
        progress = _record(((job.get("metadata") or {}).get("annotations") or {}).get(PROGRESS_ANNOTATION))
        base = dict(name=source.name, uri=source.uri, revision=source.revision or None, job=name,
                    attempts=int(counts.get("succeeded") or 0) + int(counts.get("failed") or 0)
                    + int(counts.get("active") or 0))
        if _condition(job, "Complete"):
            done = _newest(job_pods, "Succeeded")
            record = _record(_terminated(done).get("message")) if done else {}
            record = record if record.get("commit") else progress
            commit = record.get("commit") or source.commit
            if commit:
                commits[source.name] = commit
                out.append(WeightsStatus(**base, phase="Staged", commit=commit, **_counts(record)))
            else:
                out.append(WeightsStatus(**base, phase="Failed", message=(
                    f"Job {name} completed without reporting a commit (its termination message and "
                    f"{PROGRESS_ANNOTATION} are empty); delete the Job to stage again")))
            continue
        failed_condition = _condition(job, "Failed")
        if failed_condition:
            last = _newest(job_pods, "Failed")
            record = _record(_terminated(last).get("message")) if last else {}
            why = record.get("reason") and f"{record['reason']}: {record.get('message', '')}" or record.get("message")
            out.append(WeightsStatus(**base, phase="Failed", commit=progress.get("commit") or None, message=(
                f"{why or failed_condition.get('message') or 'the staging Job failed'} "
                f"(Job {name} gave up after {base['attempts']} attempts; delete it to retry)")))
            continue
        running = bool(counts.get("active")) or bool(job_pods)
        out.append(WeightsStatus(**base, phase="Staging" if running else "Pending",
                                 commit=progress.get("commit") or None,
                                 message=progress.get("phase") or None, **_counts(progress)))
    return WeightsState(sources=out, commits=commits)


def _counts(record: Mapping[str, Any]) -> dict[str, Any]:
    def num(key: str) -> Any:
        value = record.get(key)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    percent = num("percent")
    return {"files_done": num("filesDone"), "files_total": num("filesTotal"), "bytes_done": num("bytesDone"),
            "bytes_total": num("bytesTotal"), "percent": round(float(percent), 1) if percent is not None else None}
