"""Queues and gang admission with the real Kueue (v0.17.0, e2e/cluster/cluster.sh runs its
manager with the leaderworkerset integration): a role with `queueName` waits whole, its pods gated
and holding no GPU, until its LocalQueue's ClusterQueue has quota for the whole group; the
Admitted condition carries Kueue's reason; admission follows when quota frees."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.kube import apply, condition, delete_deployments, get_json, kubectl, wait_for
from kimik3_operator.api.reasons import ADMITTED
from kimik3_operator.contract.kueue import ADMISSION_GATE, QUEUE_LABEL

from .conftest import REPORT
from .test_skeleton import pd_deployment

pytestmark = pytest.mark.e2e

KUEUE = "kueue.x-k8s.io/v1beta2"
LOCAL_QUEUE = "gpus"


def _queued(namespace: str, name: str) -> dict[str, Any]:
    """A P/D deployment whose two decode groups (TP8 over two GB300 trays each; one decode
    replica beside one prefill is a known vLLM issue the planner refuses) wait in LOCAL_QUEUE."""
    body = pd_deployment(namespace, name=name)
    body["spec"]["pools"][0]["decode"]["replicas"] = 2
    body["spec"]["pools"][0]["decode"]["queueName"] = LOCAL_QUEUE
    return body


def _decode_pods(namespace: str, name: str) -> list[dict[str, Any]]:
    return get_json("pods", "-n", namespace, "-l",
                    f"serving.kimik3.dev/deployment={name},serving.kimik3.dev/role=decode")["items"]


def _admitted(namespace: str, name: str) -> dict[str, Any]:
    return condition(get_json("k3", name, "-n", namespace), "Admitted") or {}


def _verdict(namespace: str, name: str, note: Callable[[str], None],
             judged: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The deployment's Admitted condition once `judged` holds, noting each other state it passed
    through (Kueue's verdict lags the Workload's creation by a scheduling cycle)."""
    seen: set[tuple[str, str]] = set()

    def probe() -> dict[str, Any] | None:
        c = _admitted(namespace, name)
        if judged(c):
            return c
        if c and (key := (str(c.get("reason")), str(c.get("message")))) not in seen:
            seen.add(key)
            note(f"{name} on the way: Admitted={c.get('status')} {key[0]}: {key[1]}")
        return None

    return wait_for(f"{name}'s Admitted to carry Kueue's verdict", probe, timeout=90)


def _queued_replicas(cr: dict[str, Any]) -> int:
    return sum(r.get("queuedReplicas", 0) for p in (cr.get("status") or {}).get("pools", []) for r in p["roles"])


def _queue_objects(namespace: str, requests: set[str], gpus: int) -> list[dict[str, Any]]:
    """A flavor, a ClusterQueue covering every resource the decode pods request (GPUs: `gpus`,
    the rest plenty) and the LocalQueue the deployments name."""
    flavor, cluster_queue = f"e2e-{namespace}", f"e2e-{namespace}"
    quotas = [{"name": r, "nominalQuota": str(gpus) if r == "nvidia.com/gpu" else "1Pi"} for r in sorted(requests)]
    return [
        {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": flavor}},
        {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": cluster_queue},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                  "resourceGroups": [{"coveredResources": sorted(requests),
                                      "flavors": [{"name": flavor, "resources": quotas}]}]}},
        {"apiVersion": KUEUE, "kind": "LocalQueue", "metadata": {"name": LOCAL_QUEUE, "namespace": namespace},
         "spec": {"clusterQueue": cluster_queue}},
    ]


def _requests(lws: dict[str, Any]) -> set[str]:
    """The resources the LeaderWorkerSet's pods request: a ClusterQueue must cover each."""
    template = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]
    return {r for c in template.get("initContainers", []) + template["containers"]
            for r in (c.get("resources") or {}).get("requests") or {}}


def test_kueue_admits_whole_groups_and_a_second_deployment_waits_whole(operator: Path, namespace: str) -> None:
    """First a LocalQueue that does not exist (Kueue's Inadmissible, pods gated); then quota for
    two decode groups: the first deployment is admitted and scheduled, the second waits whole (every
    pod gated, none on a node, Kueue's Pending and its quota message in Admitted, queuedReplicas
    2), and is admitted once the first goes."""
    t0 = time.monotonic()
    timeline: list[str] = []

    def note(what: str) -> None:
        timeline.append(f"{time.monotonic() - t0:6.1f} s  {what}")

    objects: list[dict[str, Any]] = []
    try:
        apply(_queued(namespace, "k3-q1"))
        lws = wait_for("k3-q1's decode LeaderWorkerSet", lambda: next(
            (o for o in get_json("leaderworkersets", "-n", namespace)["items"]
             if o["metadata"]["name"] == "k3-q1-gb300-decode"), None), timeout=120)
        assert lws["metadata"]["labels"][QUEUE_LABEL] == LOCAL_QUEUE
        assert QUEUE_LABEL not in {k for o in get_json("leaderworkersets", "-n", namespace)["items"]
                                   if o["metadata"]["name"] != "k3-q1-gb300-decode"
                                   for k in o["metadata"].get("labels") or {}}  # prefill is not queued
        # Kueue first creates the Workload, then judges it: "no quota reserved yet" comes before its verdict.
        missing = _verdict(namespace, "k3-q1", note, lambda c: c.get("reason") == "Inadmissible")
        note(f"k3-q1 created, no LocalQueue yet: Admitted=False {missing['reason']}: {missing['message']}")
        assert missing["status"] == "False" and f"LocalQueue {LOCAL_QUEUE} doesn't exist" in missing["message"]
        pods = wait_for("k3-q1's decode pods, gated", lambda: (p if len(p := _decode_pods(namespace, "k3-q1")) == 4
                                                               else None), timeout=60)
        assert all({"name": ADMISSION_GATE} in p["spec"].get("schedulingGates", []) and not p["spec"].get("nodeName")
                   for p in pods), pods

        objects = _queue_objects(namespace, _requests(lws), gpus=2 * 8)  # two groups of TP8
        for obj in objects:
            apply(obj)
        first = wait_for("k3-q1 Admitted", lambda: (c if (c := _admitted(namespace, "k3-q1")).get("status") == "True"
                                                    else None), timeout=90)
        note(f"quota for two groups: k3-q1 Admitted=True {first['reason']}: {first['message']}")
        assert first["reason"] == ADMITTED
        wait_for("k3-q1's decode pods on nodes", lambda: all(
            p["spec"].get("nodeName") and not p["spec"].get("schedulingGates")
            for p in _decode_pods(namespace, "k3-q1")), timeout=60)
        note("k3-q1's decode groups scheduled")

        apply(_queued(namespace, "k3-q2"))
        waiting = _verdict(namespace, "k3-q2", note, lambda c: "nvidia.com/gpu" in c.get("message", ""))
        note(f"k3-q2 created: Admitted=False {waiting['reason']}: {waiting['message']}")
        assert waiting["status"] == "False" and waiting["reason"] == "Pending", waiting
        cr = wait_for("k3-q2 reports its queued replica", lambda: (
            cr if _queued_replicas(cr := get_json("k3", "k3-q2", "-n", namespace)) == 2 else None), timeout=60)
        q2_pods = wait_for("k3-q2's decode pods", lambda: (p if len(p := _decode_pods(namespace, "k3-q2")) == 4
                                                           else None), timeout=60)
        # Whole: no pod of the group is on a node (none holds a GPU), every one is gated.
        assert all(not p["spec"].get("nodeName") and {"name": ADMISSION_GATE} in p["spec"].get("schedulingGates", [])
                   for p in q2_pods), q2_pods
        assert condition(cr, "Ready")["status"] == "False"

        kubectl("-n", namespace, "delete", "k3", "k3-q1", "--wait=true", "--timeout=120s")
        note("k3-q1 deleted")
        admitted = wait_for("k3-q2 Admitted once quota frees", lambda: (
            c if (c := _admitted(namespace, "k3-q2")).get("status") == "True" else None), timeout=120)
        note(f"k3-q2 Admitted=True {admitted['reason']}: {admitted['message']}")
        wait_for("k3-q2's decode pods on nodes", lambda: len(p := _decode_pods(namespace, "k3-q2")) == 4 and all(
            x["spec"].get("nodeName") and not x["spec"].get("schedulingGates") for x in p), timeout=60)
        note("k3-q2's decode groups scheduled")
        cr = get_json("k3", "k3-q2", "-n", namespace)
        assert _queued_replicas(cr) == 0
    finally:
        REPORT.append("Kueue timeline: " + "; ".join(timeline))
        delete_deployments(namespace)
        for obj in reversed(objects):
            kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"],
                    *(["-n", namespace] if obj["kind"] == "LocalQueue" else []), "--ignore-not-found", check=False)
