"""When an apply may be skipped: the zero-writes-in-steady-state rule."""

from __future__ import annotations

from typing import Any

from kimik3_operator.contract.names import ANNOTATION_HASH, FIELD_MANAGER
from kimik3_operator.k8s import unchanged_since_our_apply
from kimik3_operator.k8s.cluster import HARMLESS_WRITES, Cluster, writes_digest

DESIRED = {"metadata": {"annotations": {ANNOTATION_HASH: "h1"}}}


def _live(hash_: str, *entries: tuple[str, str, str, str]) -> dict[str, Any]:
    return {"metadata": {"uid": "u", "annotations": {ANNOTATION_HASH: hash_}, "managedFields": [
        {"manager": m, "operation": op, "time": t, **({"subresource": sub} if sub else {})}
        for m, op, t, sub in entries]}}


def _fields(*paths: str) -> dict[str, Any]:
    """A managedFields fieldsV1 set of top-level `spec` fields."""
    return {"f:spec": {f"f:{p}": {} for p in paths}}


def _entry(manager: str, operation: str, time: str, fields: dict[str, Any], sub: str = "") -> dict[str, Any]:
    return {"manager": manager, "operation": operation, "time": time, "fieldsType": "FieldsV1",
            "fieldsV1": fields, **({"subresource": sub} if sub else {})}


def _object(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"uid": "u", "annotations": {ANNOTATION_HASH: "h1"}, "managedFields": list(entries)}}


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


def test_a_write_beside_our_fields_costs_no_apply_once_we_applied() -> None:
    """An apply removes only fields its own manager owned: applying again over a write that left
    ours alone (a controller's annotation, a claim's volumeName) would change nothing."""
    applied = _object(_entry(FIELD_MANAGER, "Apply", "2026-11-30T00:00:10Z", _fields("replicas")))
    beside = _object(_entry(FIELD_MANAGER, "Apply", "2026-11-30T00:00:10Z", _fields("replicas")),
                     _entry("lws", "Update", "2026-11-30T00:01:00Z", _fields("x")),
                     _entry("kubectl-edit", "Update", "2026-11-30T00:02:00Z", _fields("y")))
    assert unchanged_since_our_apply(DESIRED, beside, writes_digest(applied))
    # ... but one that took a field of ours out of our entry is drift.
    taken = _object(_entry(FIELD_MANAGER, "Apply", "2026-11-30T00:00:10Z", {}),
                    _entry("kubectl-edit", "Update", "2026-11-30T00:02:00Z", _fields("replicas")))
    assert not unchanged_since_our_apply(DESIRED, taken, writes_digest(applied))
    # A process without the record of its apply sees only times: newer foreign writes are drift.
    assert not unchanged_since_our_apply(DESIRED, beside)


SECOND = "2026-11-30T00:00:10Z"


def test_a_hand_edit_in_the_second_of_our_apply_is_repaired() -> None:
    """managedFields times have one-second resolution: the edit's entry carries our apply's time."""
    applied = _object(_entry(FIELD_MANAGER, "Apply", SECOND, _fields("replicas", "template")))
    edited = _object(_entry(FIELD_MANAGER, "Apply", SECOND, _fields("template")),
                     _entry("kubectl-edit", "Update", SECOND, _fields("replicas")))
    assert not unchanged_since_our_apply(DESIRED, edited, writes_digest(applied))
    # ... and so is a second edit, in that same second, by the editor our apply answered before.
    answered = _object(_entry(FIELD_MANAGER, "Apply", SECOND, _fields("replicas", "template")),
                       _entry("kubectl-edit", "Update", SECOND, _fields("paused")))
    again = _object(_entry(FIELD_MANAGER, "Apply", SECOND, _fields("template")),
                    _entry("kubectl-edit", "Update", SECOND, _fields("paused", "replicas")))
    assert not unchanged_since_our_apply(DESIRED, again, writes_digest(answered))


def test_status_and_progress_writes_after_our_apply_cost_no_apply() -> None:
    applied = _object(_entry(FIELD_MANAGER, "Apply", SECOND, _fields("replicas")))
    later = _object(_entry(FIELD_MANAGER, "Apply", SECOND, _fields("replicas")),
                    _entry("lws", "Update", SECOND, {"f:status": {}}, sub="status"),
                    *(_entry(m, "Update", SECOND, fields) for m, fields in HARMLESS_WRITES.items()))
    assert unchanged_since_our_apply(DESIRED, later, writes_digest(applied))
    assert unchanged_since_our_apply(DESIRED, later)


def test_a_harmless_managers_write_beyond_its_fields_is_drift() -> None:
    """A client picks its field manager's name: a staging pod that writes labels or owner
    references under the progress manager's name is not harmless. With the record of our apply,
    what tells is whether it took a field of ours (the labels); without it, the write itself."""
    applied = _object(_entry(FIELD_MANAGER, "Apply", SECOND, {"f:metadata": {"f:labels": {}}}))
    for manager, fields in HARMLESS_WRITES.items():
        later = _object(_entry(FIELD_MANAGER, "Apply", SECOND, {"f:metadata": {}}),
                        _entry(manager, "Update", "2026-11-30T00:01:00Z",
                               {**fields, "f:metadata": {"f:labels": {}, "f:ownerReferences": {}}}))
        assert not unchanged_since_our_apply(DESIRED, later, writes_digest(applied)), manager
        assert not unchanged_since_our_apply(DESIRED, later), manager


SCALABLE = {**DESIRED, "spec": {"replicas": 2}}


def _scalable(replicas: int, *entries: dict[str, Any]) -> dict[str, Any]:
    return {**_object(*entries), "spec": {"replicas": replicas}}


def test_a_write_through_scale_is_drift() -> None:
    """A built-in kind's /scale records its writer under `subresource: scale`, with a time."""
    applied = _scalable(2, _entry(FIELD_MANAGER, "Apply", SECOND, _fields("replicas", "template")))
    scaled = _scalable(3, _entry(FIELD_MANAGER, "Apply", SECOND, _fields("template")),
                       _entry("kubectl-scale", "Update", "2026-11-30T00:01:00Z", _fields("replicas"), sub="scale"))
    assert not unchanged_since_our_apply(SCALABLE, scaled, writes_digest(applied))
    assert not unchanged_since_our_apply(SCALABLE, scaled)
    # Were the count somehow ours again, the entry alone still tells (a process that did not apply).
    assert not unchanged_since_our_apply(SCALABLE, {**scaled, "spec": {"replicas": 2}})


def test_a_scaled_custom_resource_is_drift_though_its_managed_fields_hardly_show_it() -> None:
    """A custom resource's /scale leaves no entry or time of the writer's, only spec.replicas out
    of ours: a process without the record of its apply sees nothing newer than that apply."""
    applied = _scalable(2, _entry(FIELD_MANAGER, "Apply", SECOND, _fields("replicas", "template")),
                        _entry("lws", "Update", SECOND, {"f:status": {}}, sub="status"))
    assert unchanged_since_our_apply(SCALABLE, applied)
    scaled = _scalable(3, _entry(FIELD_MANAGER, "Apply", SECOND, _fields("template")),
                       _entry("lws", "Update", "2026-11-30T00:01:00Z", {"f:status": {}}, sub="status"))
    assert not unchanged_since_our_apply(SCALABLE, scaled)
    assert not unchanged_since_our_apply(SCALABLE, scaled, writes_digest(applied))


def test_without_a_record_a_write_in_our_second_is_taken_as_older() -> None:
    """What a process that never applied the object can tell (it started, or took over): times only."""
    live = _object(_entry(FIELD_MANAGER, "Apply", SECOND, _fields("replicas")),
                   _entry("lws", "Update", SECOND, _fields("x")))
    assert unchanged_since_our_apply(DESIRED, live)


def test_apply_when_we_never_applied() -> None:
    assert not unchanged_since_our_apply(DESIRED, _live("h1", ("kubectl", "Update", "2026-11-30T00:00:10Z", "")))


class _Returned(dict[str, Any]):
    def to_dict(self) -> dict[str, Any]:
        return dict(self)


class _ApplyingClient:
    """The dynamic client's part that Cluster.apply uses: every apply returns `result`."""

    def __init__(self, result: dict[str, Any]) -> None:
        self.resources, self.result, self.applies = self, result, 0

    def get(self, **_: Any) -> object:
        return object()

    def server_side_apply(self, *_: Any, **__: Any) -> _Returned:
        self.applies += 1
        return _Returned(self.result)


def test_the_cluster_repairs_a_hand_edit_made_in_the_second_of_its_apply() -> None:
    applied = _object(_entry(FIELD_MANAGER, "Apply", SECOND, _fields("replicas", "template")))
    edited = _object(_entry(FIELD_MANAGER, "Apply", SECOND, _fields("template")),
                     _entry("kubectl-edit", "Update", SECOND, _fields("replicas")))
    desired = {"apiVersion": "v1", "kind": "Service", **DESIRED,
               "metadata": {**DESIRED["metadata"], "name": "s", "namespace": "n"}}
    cluster = Cluster.__new__(Cluster)  # no API server: the client is the fake
    cluster._dyn, cluster._applied, cluster.cache = _ApplyingClient(applied), {}, None  # type: ignore[assignment]
    assert cluster.apply(desired, None).written
    assert not cluster.apply(desired, applied).written
    assert cluster.apply(desired, edited).written
    assert cluster._dyn.applies == 2  # type: ignore[attr-defined]
