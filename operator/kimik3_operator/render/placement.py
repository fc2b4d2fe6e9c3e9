"""Where a pod may run, as the user placed it: one rendering for every pod the operator makes
(serving pods per pool, router pods per deployment)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def placement(node_selector: Mapping[str, str], tolerations: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The pod spec's `nodeSelector` and `tolerations`, each left out when empty: a spec that sets
    neither renders the template it rendered before they existed (no rollout on upgrade)."""
    out: dict[str, Any] = {}
    if node_selector:
        out["nodeSelector"] = dict(node_selector)
    tolerations = [dict(t) for t in tolerations]
    if tolerations:
        out["tolerations"] = tolerations
    return out
