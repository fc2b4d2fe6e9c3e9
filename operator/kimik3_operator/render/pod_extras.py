"""spec.pods merged into every pod template a child carries (the child-kind registry's
`pod_templates` paths: a LeaderWorkerSet's leader and worker, the router Deployment's, a staging
Job's), so a new kind with pods is one row there, not a change in each renderer.

The operator's labels win over a user's (admission refuses the reserved keys, api/spec.py Pods:
this is the backstop); pull secrets come after any the renderer set."""

from __future__ import annotations

import copy
from typing import Any

from ..contract.kinds import BY_KIND
from ..planner.pods import PodsPlan


def dressed(child: dict[str, Any], pods: PodsPlan | None) -> dict[str, Any]:
    """`child` with `pods` merged into each of its pod templates; `child` itself when there is none."""
    paths = BY_KIND[child["kind"]].pod_templates
    if pods is None or not paths:
        return child
    out = copy.deepcopy(child)
    for path in paths:
        template = _at(out, path)
        if template is None:
            continue
        meta = template.setdefault("metadata", {})
        meta["labels"] = {**pods.labels, **(meta.get("labels") or {})}
        if pods.annotations:
            meta["annotations"] = {**pods.annotations, **(meta.get("annotations") or {})}
        if pods.image_pull_secrets:
            spec = template.setdefault("spec", {})
            have = [s["name"] for s in spec.get("imagePullSecrets") or []]
            spec["imagePullSecrets"] = [{"name": n} for n in [*have, *(n for n in pods.image_pull_secrets
                                                                          if n not in have)]]
    return out


def _at(obj: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    for key in path:
        nxt = obj.get(key)
        if not isinstance(nxt, dict):
            return None
        obj = nxt
    return obj
