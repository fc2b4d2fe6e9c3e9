"""Where a kind of pod may run, in wire form: planner/scheduling.py decides it, render/placement.py
writes it into pod specs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..api.spec import Scheduling


@dataclass(frozen=True)
class Placement:
    """The scheduling fields of one kind of pod, in wire form (render/placement.py writes them)."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    node_affinity: Mapping[str, Any] | None = None
    priority_class_name: str | None = None
    scheduler_name: str | None = None


def placement(node_selector: Mapping[str, str], tolerations: Sequence[Mapping[str, Any]],
              scheduling: Scheduling | None, *required: Mapping[str, Any]) -> Placement:
    """A pod's placement: the selector, the owner's tolerations, those the planner `required`, then
    the user's `scheduling` (duplicates dropped, first kept)."""
    wanted = [*tolerations, *required, *(t.wire() for t in (scheduling.tolerations if scheduling else ()))]
    unique: list[Mapping[str, Any]] = []
    for t in wanted:
        if t not in unique:
            unique.append(t)
    affinity = scheduling.node_affinity if scheduling else None
    return Placement(
        node_selector=dict(node_selector), tolerations=tuple(unique),
        node_affinity={k: v for k, v in affinity.wire().items() if v} or None if affinity is not None else None,
        priority_class_name=scheduling.priority_class_name if scheduling else None,
        scheduler_name=scheduling.scheduler_name if scheduling else None)
