"""What a converged deployment looks like, checked against the live cluster: the children the
operator renders from the deployment and today's nodes exist exactly once each, hold what was
rendered, and are owned by the live deployment; nothing else in the namespace claims to be ours.

The expected children come from the operator's own planner and renderer fed with the live Node
objects (and the live leader pods, which the routers list), so the check follows the operator's
rules instead of restating them.
"""

from __future__ import annotations

import json
from typing import Any

from kimik3_operator.api import KIND, KimiK3Deployment
from kimik3_operator.api.reasons import NO_MATCHING_NODES
from kimik3_operator.contract.kinds import CHILD_KINDS, PERSISTENT_VOLUME_CLAIM
from kimik3_operator.planner import Plan, PlanningError, plan_deployment, pool_facts, with_staged
from kimik3_operator.reconcile.pairing import revision_pairs
from kimik3_operator.render import Owner, render_children
from kimik3_operator.render.names import LABEL_DEPLOYMENT, MANAGED_BY, deployment_label

from .kube import condition, get_json, kubectl

CHILD_RESOURCES = tuple(k.resource for k in CHILD_KINDS)
Key = tuple[str, str]


def _ours(obj: dict[str, Any]) -> bool:
    meta = obj["metadata"]
    labels = meta.get("labels") or {}
    refs = meta.get("ownerReferences") or []
    if any(ref.get("controller") and ref.get("kind") != KIND for ref in refs):
        return False  # another controller's, with our labels copied (KEDA's HPA of our ScaledObject)
    return (labels.get("app.kubernetes.io/managed-by") == MANAGED_BY or LABEL_DEPLOYMENT in labels
            or any(ref.get("kind") == KIND for ref in refs))


def live_children(namespace: str) -> list[dict[str, Any]]:
    """Every object of a child kind in `namespace` that carries our labels or an owner reference
    to a KimiK3Deployment (LWS's own headless Services are LWS's, not ours). A kind the cluster
    does not serve (KEDA not installed) has none."""
    out = []
    for resource in CHILD_RESOURCES:
        got = kubectl("get", resource, "-n", namespace, "-o", "json", check=False)
        if got.returncode and "the server doesn't have a resource type" in got.stderr:
            continue
        got.check_returncode()
        out += [o for o in json.loads(got.stdout)["items"] if _ours(o)]
    return out


def planned(cr: dict[str, Any]) -> Plan:
    """The operator's plan for `cr` on the nodes present now, with the commits its staging Jobs
    reported (status.weights), as the operator renders what serves."""
    model = KimiK3Deployment.model_validate(cr)
    nodes = get_json("nodes")["items"]
    plan = plan_deployment(model.spec, {p.name: pool_facts(p.node_selector, nodes) for p in model.spec.pools})
    staged = {w["name"]: w["commit"] for w in (cr.get("status") or {}).get("weights") or []
              if w.get("phase") == "Staged" and w.get("commit")}
    return with_staged(plan, staged)


def rendered_children(cr: dict[str, Any]) -> list[dict[str, Any]]:
    """What the operator should have applied for `cr` on the nodes present now, a P/D router for
    each revision of the leader pods present now that has a routable pair."""
    meta = cr["metadata"]
    owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
    plan = planned(cr)
    pods = get_json("pods", "-n", meta["namespace"], "-l", f"{LABEL_DEPLOYMENT}={deployment_label(owner)}")["items"]
    return render_children(owner, plan, routers=revision_pairs(plan, pods))


def contains(live: Any, want: Any, path: str = "") -> list[str]:
    """Where `live` differs from `want`: every key of `want` must be in `live` with a value that
    contains `want`'s; lists must have the same length (an extra port added by hand is a
    difference). Scalars compare as text, since quantities may come back as strings."""
    if isinstance(want, dict):
        if not isinstance(live, dict):
            return [f"{path}: {live!r} is not a map"]
        return [d for k, v in want.items() for d in contains(live.get(k), v, f"{path}.{k}")]
    if isinstance(want, list):
        if not isinstance(live, list) or len(live) != len(want):
            return [f"{path}: {live!r} != {want!r}"]
        return [d for i, (lv, wv) in enumerate(zip(live, want, strict=True)) for d in contains(lv, wv, f"{path}[{i}]")]
    return [] if str(live) == str(want) else [f"{path}: {live!r} != {want!r}"]


def retained(obj: dict[str, Any]) -> bool:
    """A model cache claim kept by spec.model.cache.retentionPolicy Retain (the default): rendered
    without an owner reference, so it outlives its deployment by design and is no orphan."""
    return obj["kind"] == PERSISTENT_VOLUME_CLAIM.kind and not obj["metadata"].get("ownerReferences")


def check_children(namespace: str) -> list[str]:
    """Problems with the namespace's children; empty when every KimiK3Deployment in it has exactly
    the children it should, holding what was rendered, and nothing of ours is orphaned."""
    crs = {cr["metadata"]["uid"]: cr for cr in get_json("k3", "-n", namespace)["items"]}
    live = live_children(namespace)
    problems = []
    by_key: dict[Key, dict[str, Any]] = {(o["kind"], o["metadata"]["name"]): o for o in live}
    for obj in live:
        refs = [r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")]
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if retained(obj):
            continue  # owned by no one on purpose; checked against the rendering below like the others
        if len(refs) != 1 or refs[0].get("kind") != KIND or refs[0].get("uid") not in crs:
            problems.append(f"{name}: orphaned (controller refs {refs}, live deployments {sorted(crs)})")
        elif refs[0]["name"] != crs[refs[0]["uid"]]["metadata"]["name"]:
            problems.append(f"{name}: owner name {refs[0]['name']} does not match uid {refs[0]['uid']}")
    # A deployment that cannot be planned (or reports NoMatchingNodes) keeps its children as they
    # were, on purpose: there is nothing to re-render them from, so only ownership is checked.
    frozen = {uid for uid, cr in crs.items() if (condition(cr, "Ready") or {}).get("reason") == NO_MATCHING_NODES}
    wanted: dict[Key, dict[str, Any]] = {}
    for uid, cr in crs.items():
        if uid in frozen:
            continue
        try:
            wanted.update({(o["kind"], o["metadata"]["name"]): o for o in rendered_children(cr)})
        except PlanningError:
            frozen.add(uid)
    for key, obj in wanted.items():
        if key not in by_key:
            problems.append(f"{key[0]}/{key[1]}: missing")
            continue
        found = by_key[key]
        diff = contains(found["metadata"], {k: obj["metadata"][k] for k in ("labels", "annotations")},
                        ".metadata") + contains(found.get("spec"), obj.get("spec"), ".spec")
        problems += [f"{key[0]}/{key[1]}{d}" for d in diff]
    for key, obj in sorted(by_key.items()):
        owners = {r.get("uid") for r in obj["metadata"].get("ownerReferences") or []}
        if key not in wanted and owners & (set(crs) - frozen):
            problems.append(f"{key[0]}/{key[1]}: not rendered by the operator (a duplicate or a leftover)")
    return problems
