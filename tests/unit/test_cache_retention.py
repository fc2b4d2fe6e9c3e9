"""spec.model.cache.retentionPolicy, as StatefulSet's persistentVolumeClaimRetentionPolicy: the 1.6 TB
cache claim is kept by default (no owner reference: neither garbage collection nor the prune takes
it, and a deployment re-created under the name adopts it), or goes with the deployment (Delete)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kimik3_operator.planner import plan_deployment, pool_facts
from kimik3_operator.reconcile.reconciler import Pass, reconcile
from kimik3_operator.render import render_weights
from kimik3_operator.render.names import Owner
from tests.support.cases import base_deployment
from tests.support.memory_cluster import MemoryCluster
from tests.support.nodes import gb300_rack

CLAIM = ("PersistentVolumeClaim", "k3-model-cache")


def _body(policy: str | None) -> dict[str, Any]:
    body = base_deployment(name="k3", namespace="ns")
    if policy:
        body["spec"]["model"]["cache"] = {"retentionPolicy": policy}
    return body


def _claim(body: dict[str, Any]) -> dict[str, Any]:
    from kimik3_operator.api import KimiK3Deployment

    spec = KimiK3Deployment.model_validate(body).spec
    plan = plan_deployment(spec, {p.name: pool_facts(p.node_selector, gb300_rack()) for p in spec.pools})
    (claim,) = [o for o in render_weights(Owner("k3", "ns", "uid-1"), plan, "img:1")
                if o["kind"] == "PersistentVolumeClaim"]
    return claim


def test_the_claim_is_retained_by_default_and_owned_only_with_delete() -> None:
    assert "ownerReferences" not in _claim(_body(None))["metadata"]
    assert "ownerReferences" not in _claim(_body("Retain"))["metadata"]
    (ref,) = _claim(_body("Delete"))["metadata"]["ownerReferences"]
    assert ref["uid"] == "uid-1" and ref["kind"] == "KimiK3Deployment"
    assert _claim(_body("Retain"))["metadata"]["labels"] == _claim(_body("Delete"))["metadata"]["labels"]


@pytest.mark.parametrize(("policy", "pruned"), [(None, False), ("Delete", True)])
def test_a_claim_no_checkpoint_needs_is_pruned_only_with_delete(policy: str | None, pruned: bool) -> None:
    cluster = MemoryCluster(_body(policy), gb300_rack())
    reconcile(Pass(cluster, "ns", "k3"))
    assert CLAIM in cluster.objects
    cluster.deployment["spec"]["model"] = {"uri": "pvc://weights/kimi-k3",
                                           **({"cache": {"retentionPolicy": policy}} if policy else {})}
    reconcile(Pass(cluster, "ns", "k3"))
    assert (CLAIM not in cluster.objects) is pruned
    assert ("delete PersistentVolumeClaim/k3-model-cache" in cluster.writes) is pruned


def test_a_deployment_recreated_under_the_name_adopts_the_retained_claim() -> None:
    cluster = MemoryCluster(_body(None), gb300_rack())
    reconcile(Pass(cluster, "ns", "k3"))
    claim = copy.deepcopy(cluster.objects[CLAIM])
    # deleted and created again: a new uid; garbage collection took every owned child but the claim
    cluster.objects = {CLAIM: claim}
    cluster.deployment["metadata"]["uid"] = "uid-2"
    reconcile(Pass(cluster, "ns", "k3"))
    adopted = cluster.objects[CLAIM]
    assert adopted["metadata"]["uid"] == claim["metadata"]["uid"] and "ownerReferences" not in adopted["metadata"]
    assert not [w for w in cluster.writes if w.startswith("delete")]


def test_switching_the_policy_sets_or_drops_the_owner_reference() -> None:
    cluster = MemoryCluster(_body("Delete"), gb300_rack())
    reconcile(Pass(cluster, "ns", "k3"))
    assert cluster.objects[CLAIM]["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    cluster.deployment["spec"]["model"]["cache"] = {"retentionPolicy": "Retain"}
    reconcile(Pass(cluster, "ns", "k3"))  # server-side apply drops the reference the last apply set
    assert "ownerReferences" not in cluster.objects[CLAIM]["metadata"]
