"""The informer's store rules without a server (e2e/tests/test_informer.py runs it against the real
API server): a relist tells exactly what changed, our own writes are not undone by older events,
the index follows relabelled objects, and nodes and pods are kept without their managedFields."""

from __future__ import annotations

from typing import Any

from kimik3_operator.k8s.cache import deployment_mark
from kimik3_operator.k8s.informer import Informer, Watched


def _obj(name: str, version: int, deployment: str = "k3", **extra: Any) -> dict[str, Any]:
    return {"kind": "ConfigMap", "metadata": {
        "name": name, "namespace": "ns", "resourceVersion": str(version),
        "labels": {"serving.kimik3.dev/deployment": deployment}, "managedFields": [{"manager": "x"}]}, **extra}


def _informer(keep_managed_fields: bool = True) -> tuple[Informer, list[tuple[str, str]]]:
    heard: list[tuple[str, str]] = []
    informer = Informer(None, Watched("v1", "ConfigMap", keep_managed_fields=keep_managed_fields),  # type: ignore[arg-type]
                        listener=lambda kind, obj: heard.append((kind, obj["metadata"]["name"])),
                        index=deployment_mark)
    return informer, heard


def test_a_relist_tells_what_appeared_changed_and_vanished_and_nothing_else() -> None:
    informer, heard = _informer()
    informer._replace({("ns", n): _obj(n, 1) for n in ("kept", "changed", "gone")}, tell=False)
    assert heard == []
    informer._replace({("ns", "kept"): _obj("kept", 1), ("ns", "changed"): _obj("changed", 5),
                       ("ns", "new"): _obj("new", 6)}, tell=True)
    assert sorted(heard) == [("ADDED", "new"), ("DELETED", "gone"), ("MODIFIED", "changed")]
    assert sorted(o["metadata"]["name"] for o in informer.indexed(("ns", "k3"))) == ["changed", "kept", "new"]


def test_our_write_is_not_undone_by_an_older_event_but_a_newer_one_wins() -> None:
    informer, _ = _informer()
    informer._replace({("ns", "a"): _obj("a", 10)}, tell=False)
    informer.note(_obj("a", 12, data={"v": "ours"}))
    informer.note(_obj("a", 11, data={"v": "older"}))  # e.g. an apply's result that raced a newer one
    assert informer.get(("ns", "a"))["data"] == {"v": "ours"}  # type: ignore[index]
    informer.note(_obj("a", 13, data={"v": "newer"}))
    assert informer.get(("ns", "a"))["data"] == {"v": "newer"}  # type: ignore[index]
    informer.note(_obj("b", 1))  # unknown until now: taken
    assert informer.get(("ns", "b")) is not None
    informer.forget(_obj("b", 1))
    assert informer.get(("ns", "b")) is None


def test_the_index_follows_an_object_whose_label_changed() -> None:
    informer, _ = _informer()
    informer._replace({("ns", "a"): _obj("a", 1, deployment="one")}, tell=False)
    informer.note(_obj("a", 2, deployment="two"))
    assert informer.indexed(("ns", "one")) == []
    assert [o["metadata"]["name"] for o in informer.indexed(("ns", "two"))] == ["a"]


def test_managed_fields_are_dropped_unless_kept() -> None:
    trimmed, _ = _informer(keep_managed_fields=False)
    kept, _ = _informer(keep_managed_fields=True)
    for informer in (trimmed, kept):
        informer.note(_obj("a", 1))
    assert "managedFields" not in trimmed.get(("ns", "a"))["metadata"]  # type: ignore[index]
    assert kept.get(("ns", "a"))["metadata"]["managedFields"] == [{"manager": "x"}]  # type: ignore[index]
