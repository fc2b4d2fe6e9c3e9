"""What the staging Jobs say, as status: a pure function of the Jobs, their pods and their progress.

The final record (with the resolved commit) is the container's termination message, written by
`stage --progress-file /dev/termination-log`; while a Job runs, its latest record sits in its
progress ConfigMap (the pod writes it through its own narrow Role). Failed attempts say why in
their termination message, `Reason: message` on the last line, or a Failed JSON record.

Everything read here was written by the staging pod, and a compromised pod writes what it likes:
each record is read through `untrusted_record` (bounded, only the contract's keys, each of its type
and range), the progress ConfigMap never decides anything (it only shows progress), and the commit
that serving pods wait for is the one the termination message of a pod of the Job itself reports
(owned by that Job's uid), of the form the source's scheme resolves to, and equal to the revision
when that pins a commit. Once that pod is gone, the commit the operator's own status recorded for
the Job stands (checked the same way); nothing the staging pod can write fills in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..api.status import WeightsStatus
from ..contract.stager import (
    CONTENT_COMMIT,
    COUNTERS,
    HUB_COMMIT,
    MAX_MESSAGE,
    MAX_RECORD_BYTES,
    PHASES,
    PROGRESS_KEY,
    REASON,
)
from ..planner import WeightsPlan, WeightsSource
from ..render.names import Owner
from ..render.weights import job_name, progress_name

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
MAX_COUNT = (1 << 63) - 1
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


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


def _text(value: Any) -> str | None:
    """A record's free text, cut and without control characters, or None when it is not text."""
    if not isinstance(value, str):
        return None
    return _CONTROL.sub(" ", value[:MAX_MESSAGE]).strip() or None


def untrusted_record(text: Any) -> dict[str, Any]:
    """The progress record in `text` (the last JSON object line of at most MAX_RECORD_BYTES),
    reduced to what the contract says a record holds; else {"message": its last line}.

    Any other key, a value of the wrong type or out of range, a phase or reason that is not one,
    is left out: a record is the staging pod's word, and the pod may be compromised."""
    if not isinstance(text, str) or len(text.strip().encode(errors="replace")) > MAX_RECORD_BYTES:
        return {}  # larger than any record the stager writes
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return _known(value)
    message = _text(lines[-1]) if lines else None
    return {"message": message} if message else {}


def _known(raw: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if raw.get("phase") in PHASES:
        out["phase"] = raw["phase"]
    if isinstance(raw.get("reason"), str) and REASON.match(raw["reason"]):
        out["reason"] = raw["reason"]
    if (message := _text(raw.get("message"))) is not None:
        out["message"] = message
    commit = raw.get("commit")
    if isinstance(commit, str) and (HUB_COMMIT.match(commit) or CONTENT_COMMIT.match(commit)):
        out["commit"] = commit
    for key in COUNTERS:
        value = raw.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
            out[key] = value
    percent = raw.get("percent")
    if isinstance(percent, (int, float)) and not isinstance(percent, bool) and 0 <= percent <= 100:
        out["percent"] = round(float(percent), 1)
    return out


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


def _pods_of(job: Mapping[str, Any], name: str, pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods the Job controller made for this Job: its name label, and its uid as their
    controlling owner (a pod someone else labelled so does not speak for the Job)."""
    uid = (job.get("metadata") or {}).get("uid")
    return [p for p in pods if uid and (p["metadata"].get("labels") or {}).get(JOB_NAME_LABEL) == name
            and any(ref.get("kind") == "Job" and ref.get("uid") == uid and ref.get("controller")
                    for ref in p["metadata"].get("ownerReferences") or [])]


def _commit_problem(source: WeightsSource, commit: str) -> str | None:
    """Why `commit` cannot be what `source` staged, or None."""
    form = HUB_COMMIT if source.scheme == "hf" else CONTENT_COMMIT
    if not form.match(commit):
        return f"reported commit {commit!r}, which is not the form of an {source.scheme}:// commit"
    if source.commit and commit != source.commit:
        return f"reported commit {commit}, but the revision pins {source.commit}"
    return None


def weights_state(owner: Owner, weights: WeightsPlan, jobs: Mapping[str, Mapping[str, Any]],
                  pods: Sequence[Mapping[str, Any]], progress: Mapping[str, Mapping[str, Any]] | None = None,
                  previous: Sequence[WeightsStatus] = ()) -> WeightsState:
    """`jobs` and `progress` (the progress ConfigMaps) by name; `pods` the staging pods; `previous`
    the status this operator wrote last, whose commit of a Job stands once that Job's pods are gone
    (deleted by the terminated-pod garbage collector, or with their node)."""
    out: list[WeightsStatus] = []
    commits: dict[str, str] = {}
    staged_before = {s.job: s.commit for s in previous if s.phase == "Staged" and s.job and s.commit}
    for source in weights.sources:
        name = job_name(owner, source)
        job = jobs.get(name) or {}
        job_pods = _pods_of(job, name, pods)
        counts = job.get("status") or {}
        report = ((progress or {}).get(progress_name(owner, source)) or {}).get("data") or {}
        mid_run = untrusted_record(report.get(PROGRESS_KEY))
        base = dict(name=source.name, uri=source.uri, revision=source.revision or None, job=name,
                    attempts=int(counts.get("succeeded") or 0) + int(counts.get("failed") or 0)
                    + int(counts.get("active") or 0))
        if _condition(job, "Complete"):
            done = _newest(job_pods, "Succeeded")
            record = untrusted_record(_terminated(done).get("message")) if done else {}
            commit: str | None = record.get("commit") or source.commit or (None if done else staged_before.get(name))
            problem = _commit_problem(source, commit) if commit else (
                "completed without reporting a commit (its pod's termination message has none)")
            if commit and problem is None:
                commits[source.name] = commit
                out.append(WeightsStatus(**base, phase="Staged", commit=commit, **_counts(record)))
            else:
                out.append(WeightsStatus(**base, phase="Failed", message=(
                    f"Job {name} {problem}; delete the Job to stage again")))
            continue
        failed_condition = _condition(job, "Failed")
        if failed_condition:
            last = _newest(job_pods, "Failed")
            record = untrusted_record(_terminated(last).get("message")) if last else {}
            why = record.get("reason") and f"{record['reason']}: {record.get('message', '')}" or record.get("message")
            out.append(WeightsStatus(**base, phase="Failed", commit=mid_run.get("commit"), message=(
                f"{why or _text(failed_condition.get('message')) or 'the staging Job failed'} "
                f"(Job {name} gave up after {base['attempts']} attempts; delete it to retry)")))
            continue
        running = bool(counts.get("active")) or bool(job_pods)
        out.append(WeightsStatus(**base, phase="Staging" if running else "Pending", commit=mid_run.get("commit"),
                                 message=mid_run.get("phase"), **_counts(mid_run)))
    return WeightsState(sources=out, commits=commits)


def _counts(record: Mapping[str, Any]) -> dict[str, Any]:
    return {"files_done": record.get("filesDone"), "files_total": record.get("filesTotal"),
            "bytes_done": record.get("bytesDone"), "bytes_total": record.get("bytesTotal"),
            "percent": record.get("percent")}
