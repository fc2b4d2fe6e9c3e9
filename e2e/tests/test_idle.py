"""Zero idle writes, measured in the audit log: an operator with the periodic reconcile at 3 s that
has converged a few deployments (aggregated GB300; prefill/decode on B200 and GB300; one whose
spec cannot be planned, so a Failed status exists) makes no create, update, patch or delete for
KIMIK3_IDLE_SECONDS (90 by default: 30 resync rounds of every deployment). No-op applies and
Events count as writes; Leases do not (leader election renews one). Reads are counted per minute
and printed: passes read the informers' stores, so the reads left are watches re-opened (and their
bookmarks), none per pass.

The test runs replicas of its own (leader and standby, as the chart runs them) with
KIMIK3_RESYNC_SECONDS=3, watching only the test's namespace (`kimik3 run --namespace`, the chart's
`watchNamespaces`): what other tests left behind elsewhere (namespaces still terminating, groups
still converging) is not theirs to reconcile, so the test runs anywhere in the suite. The session
replicas are stopped meanwhile, since their requests carry the same ServiceAccount and would be
counted too, and started again afterwards.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.children import check_children
from e2e.harness.kube import apply, condition, get_json, wait_for
from e2e.harness.pod_runner import PodRunner
from e2e.harness.replicas import Replicas
from kimik3_operator.api.reasons import INSUFFICIENT_MEMORY
from tests.support.cases import base_deployment

from .conftest import CHART_NAMESPACE, LEASE, OPERATOR_PODS, REPORT, SERVICE_ACCOUNT, free_port
from .test_skeleton import B200, GB300, pd_deployment

pytestmark = pytest.mark.e2e

USER = f"system:serviceaccount:{CHART_NAMESPACE}:{SERVICE_ACCOUNT}"
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
READS = {"get", "list", "watch"}
RESYNC_SECONDS = 3
IDLE_SECONDS = float(os.environ.get("KIMIK3_IDLE_SECONDS", "90"))


@pytest.fixture
def idle_operator(replicas: Replicas, namespace: str, tmp_path: Path) -> Iterator[Replicas]:
    replicas.stop_all()
    env = {**replicas.env, "KIMIK3_RESYNC_SECONDS": str(RESYNC_SECONDS), "KIMIK3_RETRY_SECONDS": "10"}
    own = Replicas(tmp_path, replicas.kubeconfig, LEASE, CHART_NAMESPACE, env, free_port,
                   extra_args={slot: ["--namespace", namespace] for slot in OPERATOR_PODS})
    try:
        own.start_all(OPERATOR_PODS)
        yield own
    finally:
        own.stop_all()
        replicas.start_all(OPERATOR_PODS)


def operator_requests(state: Path, since: datetime, until: datetime) -> list[dict[str, Any]]:
    """The operator's requests received in [since, until), one per audit ID (a watch is logged
    when its response starts and again when it ends). Rotated logs are read too."""
    found: dict[str, dict[str, Any]] = {}
    for log in sorted(state.glob("audit*.log")):
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if (event.get("user") or {}).get("username") != USER:
                continue
            received = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
            if since <= received < until:
                found[event["auditID"]] = {**event, "received": received}
    return sorted(found.values(), key=lambda e: e["received"])


def is_lease(event: dict[str, Any]) -> bool:
    ref = event.get("objectRef") or {}
    return ref.get("apiGroup") == "coordination.k8s.io" and ref.get("resource") == "leases"


def describe(event: dict[str, Any]) -> str:
    ref = event.get("objectRef") or {}
    what = "/".join(x for x in (ref.get("apiGroup"), ref.get("resource"), ref.get("subresource")) if x)
    return (f"{event['received']:%H:%M:%S} {event['verb']} {what} {ref.get('namespace', '')}/{ref.get('name', '')} "
            f"-> {(event.get('responseStatus') or {}).get('code')}")


def test_no_writes_while_idle(idle_operator: Replicas, namespace: str, cluster: dict[str, str],
                              pod_runner: PodRunner) -> None:
    """`pod_runner` plays the deployments' engines and routers, so that two of them become Ready:
    asked for here, not left to whichever test of the run started it first."""
    aggregated = base_deployment(name="agg", namespace=namespace)
    aggregated["spec"]["pools"] = [{"name": "gb300", "nodeSelector": GB300,
                                    "aggregated": {"replicas": 1, "parallelism": {"tensor": 8}}}]
    unplannable = base_deployment(name="too-small", namespace=namespace)  # 8 x B200: weights do not fit
    unplannable["spec"]["pools"] = [{"name": "b200", "nodeSelector": B200,
                                     "aggregated": {"replicas": 1, "parallelism": {"tensor": 8}}}]
    for body in (aggregated, pd_deployment(namespace, name="pd"), unplannable):
        apply(body)

    def converged() -> bool:
        crs = {cr["metadata"]["name"]: cr for cr in get_json("k3", "-n", namespace)["items"]}
        ready = {name: condition(cr, "Ready") or {} for name, cr in crs.items()}
        return (len(crs) == 3 and all(cr.get("status", {}).get("observedGeneration") == cr["metadata"]["generation"]
                                      for cr in crs.values())
                and ready["agg"].get("status") == ready["pd"].get("status") == "True"
                and ready["too-small"].get("reason") == INSUFFICIENT_MEMORY
                and crs["too-small"]["status"]["phase"] == "Failed"
                and not check_children(namespace))

    started = datetime.now(UTC)
    wait_for("three deployments converged (two Ready, one Failed)", converged, timeout=240)
    versions = {cr["metadata"]["name"]: cr["metadata"]["resourceVersion"]
                for cr in get_json("k3", "-n", namespace)["items"]}

    leader = idle_operator.leader()
    rounds_before = leader.metric("kimik3_operator_resyncs_total") or 0.0
    since = datetime.now(UTC)
    deadline = time.monotonic() + IDLE_SECONDS
    while time.monotonic() < deadline:
        assert idle_operator.alive(), idle_operator.tails()
        time.sleep(min(10.0, max(0.0, deadline - time.monotonic())))
    until = datetime.now(UTC)

    state = Path(cluster["KUBECONFIG"]).parent
    requests = operator_requests(state, since, until)
    writes = [e for e in requests if e["verb"] in WRITES and not is_lease(e)]
    reads = [e for e in requests if e["verb"] in READS]
    seconds = (until - since).total_seconds()
    per_minute = [sum(1 for e in reads if int((e["received"] - since).total_seconds() // 60) == m)
                  for m in range(max(1, int(seconds // 60)))]  # whole minutes only
    by_kind = Counter(f"{e['verb']} {(e.get('objectRef') or {}).get('resource')}" for e in reads)
    REPORT.append(f"idle {seconds:.0f} s with resync every {RESYNC_SECONDS} s: "
                  f"{len(writes)} writes by the operator (Leases excluded: "
                  f"{sum(1 for e in requests if e['verb'] in WRITES and is_lease(e))})")
    REPORT.append(f"  reads per minute: {per_minute} (mean {len(reads) / (seconds / 60):.0f})")
    REPORT.append(f"  reads by kind: {dict(sorted(by_kind.items()))}")

    assert writes == [], "writes while idle:\n" + "\n".join(map(describe, writes))
    # Not vacuous: the same parsing finds the operator's writes while it converged, and the
    # operator kept reconciling every deployment at the resync interval while idle.
    assert any(e["verb"] == "patch" for e in operator_requests(state, started, since))
    # Passes read the informers' stores, not the API server: the resync rounds (each a pass of every
    # deployment) are counted by the operator's own metric.
    rounds = (leader.metric("kimik3_operator_resyncs_total") or 0.0) - rounds_before
    assert rounds >= int(IDLE_SECONDS // RESYNC_SECONDS) - 1, (rounds, by_kind)
    # Reads do not grow with passes: no list or get per pass, only the informers' watches.
    assert all(e["verb"] == "watch" or not (e.get("objectRef") or {}).get("namespace") == namespace
               for e in reads), by_kind
    assert {cr["metadata"]["name"]: cr["metadata"]["resourceVersion"]
            for cr in get_json("k3", "-n", namespace)["items"]} == versions
