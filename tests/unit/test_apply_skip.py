"""When an apply may be skipped: the zero-writes-in-steady-state rule."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from kimik3_operator.k8s import unchanged_since_our_apply
from kimik3_operator.contract.names import ANNOTATION_HASH, FIELD_MANAGER

DESIRED = {"metadata": {"annotations": {ANNOTATION_HASH: "h1"}}}


def _live(hash_: str, *entries: tuple[str, str, str, str]) -> dict[str, Any]:
    return {"metadata": {"uid": "u", "annotations": {ANNOTATION_HASH: hash_}, "managedFields": [
        {"manager": m, "operation": op, "time": t, **({"subresource": sub} if sub else {})}
        for m, op, t, sub in entries]}}


def test_skip_when_hash_matches_and_nobody_wrote_since() -> None:
    live = _live("h1", (FIELD_MANAGER, "Apply", "2026-11-30T00:00:10Z", ""),
                 ("kube-controller-manager", "Update", "2026-11-30T00:00:20Z", "status"))
    assert unchanged_since_our_apply(DESIRED, live)


def test_apply_when_hash_differs() -> None:
    assert not unchanged_since_our_apply(DESIRED, _live("h0", (FIELD_MANAGER, "Apply", "2026-11-30T00:00:10Z", "")))


def test_apply_when_someone_edited_after_us() -> None:
    live = _live("h1", (FIELD_MANAGER, "Apply", "2026-11-30T00:00:10Z", ""),
                 ("kubectl-edit", "Update", "2026-11-30T00:01:00Z", ""))
    assert not unchanged_since_our_apply(DESIRED, live)


def test_skip_once_the_foreign_write_was_answered() -> None:
    live = _live("h1", (FIELD_MANAGER, "Apply", "2026-11-30T00:00:10Z", ""),
                 ("lws", "Update", "2026-11-30T00:01:00Z", ""))
    answered = datetime(2026, 11, 30, 0, 1, tzinfo=timezone.utc)
    assert unchanged_since_our_apply(DESIRED, live, answered)
    later = _live("h1", (FIELD_MANAGER, "Apply", "2026-11-30T00:00:10Z", ""),
                  ("kubectl-edit", "Update", "2026-11-30T00:02:00Z", ""))
    assert not unchanged_since_our_apply(DESIRED, later, answered)


def test_apply_when_we_never_applied() -> None:
    assert not unchanged_since_our_apply(DESIRED, _live("h1", ("kubectl", "Update", "2026-11-30T00:00:10Z", "")))
