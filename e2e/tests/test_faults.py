"""Faults on the local real cluster, each followed by convergence with no orphaned or duplicated
children (children.check_children): kube-apiserver restarted (gracefully with a deployment in
place, and crashed while one is being created), children deleted and edited by hand, a
LeaderWorkerSet scaled through /scale, a fake GPU node deleted, nodes relabelled away from a pool.
The cluster is left as it was found: deleted nodes are created again from e2e/cluster/nodes,
labels are removed.

The module prints how many faults it injected, how many the operator survived, and how long each
took to converge again.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e.harness.children import check_children, live_children, planned
from e2e.harness.kube import CLUSTER_SH, ROOT, apply, condition, get_json, is_ready, kubectl, wait_for
from e2e.harness.replicas import Replicas
from kimik3_operator.api.reasons import ALL_REPLICAS_READY, INSUFFICIENT_CAPACITY, NO_MATCHING_NODES
from kimik3_operator.contract.kinds import LEADER_WORKER_SET
from kimik3_operator.k8s.lease import LeaseConfig
from kimik3_operator.planner import PlanningError
from kimik3_operator.render.names import LABEL_DEPLOYMENT, LABEL_POOL
from tests.support.cases import base_deployment

from .conftest import REPORT

pytestmark = pytest.mark.e2e

GB300 = {"nvidia.com/gpu.product": "NVIDIA-GB300"}
B200 = {"nvidia.com/gpu.product": "NVIDIA-B200"}
NODES_DIR = ROOT / "e2e" / "cluster" / "nodes"
DIFFBASE = "kopf.serving.kimik3.dev/last-handled-configuration"
FAULT_LABEL = "e2e.kimik3.dev/fault-pool"
# The longest API server outage a leader outlives for sure (the replicas run the default timings):
# its last renewal may have begun up to one retry period before the outage, and its first after the
# outage up to one retry period after it, and both count against the renew deadline.
RIDDEN_OUT = LeaseConfig.renew_deadline - 2 * LeaseConfig.retry_period


@dataclass
class Fault:
    what: str
    injected: float
    recovered_after: float | None = None


FAULTS: list[Fault] = []


def inject(what: str) -> Fault:
    FAULTS.append(fault := Fault(what, time.monotonic()))
    return fault


def recovered(*faults: Fault) -> None:
    for fault in faults:
        fault.recovered_after = time.monotonic() - fault.injected


@pytest.fixture(scope="module", autouse=True)
def fault_report() -> Iterator[None]:
    yield
    survived = [f for f in FAULTS if f.recovered_after is not None]
    REPORT.append(f"faults injected: {len(FAULTS)}, survived (converged again, no orphans or duplicates): "
                  f"{len(survived)}")
    REPORT.extend(f"  {f.what}: " + (f"converged {f.recovered_after:.1f} s later" if f.recovered_after is not None
                                     else "NOT recovered") for f in FAULTS)


@pytest.fixture
def namespace(namespace: str) -> Iterator[str]:
    """The test's namespace, emptied before the next test: deployments deleted and their pods gone,
    so later tests find the GPUs free (a namespace deletion alone leaves that to the background).
    The pods go by kube-controller-manager's garbage collector down the owner chain (deployment,
    LeaderWorkerSet, leader StatefulSet, leader pod, worker StatefulSet, worker pod); right after an
    API server restart that took it two minutes in one CI run (its discovery failed meanwhile)."""
    yield namespace
    kubectl("-n", namespace, "delete", "k3", "--all", "--wait=true", "--timeout=60s")
    wait_for(f"pods of {namespace} to be gone", lambda: not get_json("pods", "-n", namespace)["items"], timeout=300)


# ---- helpers ------------------------------------------------------------------------------------

def gb300_deployment(namespace: str, name: str, replicas: int = 1) -> dict[str, Any]:
    """TP8 on 4-GPU trays: a two-tray group, so a LeaderWorkerSet, a Service and a ComputeDomain."""
    body = base_deployment(name=name, namespace=namespace)
    body["spec"]["pools"] = [{"name": "gb300", "nodeSelector": GB300,
                              "aggregated": {"replicas": replicas, "parallelism": {"tensor": 8}}}]
    return body


def b200_deployment(namespace: str, name: str, selector: dict[str, str], replicas: int,
                    product: str | None = None) -> dict[str, Any]:
    """The planner's aggregated layout on HGX B200: TP8 x PP2, two nodes per replica."""
    body = base_deployment(name=name, namespace=namespace)
    pool: dict[str, Any] = {"name": "b200", "nodeSelector": selector, "aggregated": {"replicas": replicas}}
    if product:
        pool["gpu"] = {"product": product}
    body["spec"]["pools"] = [pool]
    return body


def status_problems(cr: dict[str, Any]) -> list[str]:
    """Why `cr`'s status is not the Ready status its plan on today's nodes implies."""
    st, ready = cr.get("status") or {}, condition(cr, "Ready") or {}
    try:
        plan = planned(cr)
    except PlanningError as exc:
        return [f"cannot be planned on today's nodes: {exc.reason}: {exc.message}"]
    replicas = sum(r.replicas for p in plan.pools for r in p.roles)
    want = {"phase": "Ready", "readySummary": f"{replicas}/{replicas}", "gpus": plan.gpus,
            "observedGeneration": cr["metadata"]["generation"]}
    problems = [f"status.{k} = {st.get(k)!r}, want {v!r}" for k, v in want.items() if st.get(k) != v]
    if (ready.get("status"), ready.get("reason")) != ("True", ALL_REPLICAS_READY):
        problems.append(f"Ready condition {ready}")
    return problems


def wait_converged(namespace: str, name: str, timeout: float = 180) -> dict[str, Any]:
    """Until `name` is Ready as planned and the namespace's children are exactly as rendered."""
    last: list[str] = []

    def probe() -> dict[str, Any] | None:
        nonlocal last
        cr = get_json("k3", name, "-n", namespace)
        last = status_problems(cr) + check_children(namespace)
        return None if last else cr

    try:
        return wait_for(f"{namespace}/{name} to converge", probe, timeout=timeout, interval=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nproblems: {json.dumps(last, indent=1)}") from None


def uids(namespace: str) -> dict[tuple[str, str], str]:
    return {(o["kind"], o["metadata"]["name"]): o["metadata"]["uid"] for o in live_children(namespace)}


def cluster_sh(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLUSTER_SH), *args], capture_output=True, text=True, timeout=timeout)


def restart_apiserver(crash: bool) -> float:
    """Restart kube-apiserver; the seconds it was away (from the stop until it answered healthy)."""
    started = time.monotonic()
    result = cluster_sh("restart", *(["--kill"] if crash else []), "kube-apiserver")
    away = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    # The other components reconnect on their own; later tests need them all healthy again.
    wait_for("every cluster component healthy", lambda: cluster_sh("status").returncode == 0, timeout=120)
    return away


def rode_out(group: Replicas, away: float, fault: Fault) -> None:
    """The operator rode the outage out. The leader renews its Lease every retry period and exits
    on purpose once it has gone the renew deadline without (k8s/lease.py): an outage shorter than
    RIDDEN_OUT ends no replica; a longer one may end the leader's process, on the Lease and for no
    other reason, and the kubelet starts it again while the standby takes over."""
    ended = group.restart_exited()
    if away < RIDDEN_OUT:
        assert not ended, f"the API server was away {away:.1f} s only:\n" + "\n".join(map(str, ended))
    else:
        assert all(gone.lease_lost for gone in ended), "\n".join(map(str, ended))
    fault.what += f" (away {away:.1f} s; " + (f"{len(ended)} replica(s) exited on the lost Lease, restarted)"
                                               if ended else "no replica exited)")
    group.leader()


def scale_after_restart(group: Replicas, namespace: str, name: str, replicas: int) -> None:
    """The operator's watches came back: a spec change made now is handled by kopf's update handler
    (its diff base records the new spec) and rolls out."""
    body = gb300_deployment(namespace, name, replicas)
    apply(body)
    cr = wait_converged(namespace, name)
    assert cr["status"]["pools"][0]["roles"][0]["replicas"] == replicas

    def handled() -> bool:
        base = json.loads(get_json("k3", name, "-n", namespace)["metadata"]["annotations"].get(DIFFBASE, "{}"))
        return base.get("spec", {}).get("pools", [{}])[0].get("aggregated", {}).get("replicas") == replicas

    wait_for("kopf's update handler to record the new spec", handled, timeout=60)


def gpu_pods_on(nodes: set[str], but_not: str) -> list[str]:
    """Pods of other namespaces holding GPUs on `nodes` (earlier tests' namespaces still going)."""
    pods = get_json("pods", "-A")["items"]
    return [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods
            if p["spec"].get("nodeName") in nodes and p["metadata"]["namespace"] != but_not
            and any("nvidia.com/gpu" in (c.get("resources") or {}).get("requests", {})
                    for c in p["spec"]["containers"])]


def b200_nodes() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((NODES_DIR / "b200-hgx.yaml").read_text()) if d and d["kind"] == "Node"]


def wait_b200_free(namespace: str) -> None:
    names = {n["metadata"]["name"] for n in b200_nodes()}
    wait_for("B200 nodes free of other tests' pods", lambda: not gpu_pods_on(names, namespace), timeout=120)


def node_ready(name: str) -> bool:
    node = get_json("nodes")["items"]
    found = [n for n in node if n["metadata"]["name"] == name]
    if not found:
        return False
    conds = found[0].get("status", {}).get("conditions") or []
    taints = found[0].get("spec", {}).get("taints") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds) and not any(
        t["key"].startswith("node.kubernetes.io/") for t in taints)


def pods_of(namespace: str) -> dict[str, tuple[str, str]]:
    """The serving pods (the engines; not the routers, which may sit on any node)."""
    return {p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"].get("nodeName") or "")
            for p in get_json("pods", "-n", namespace, "-l", "serving.kimik3.dev/role")["items"]}


# ---- kube-apiserver restarted -------------------------------------------------------------------

def test_apiserver_restart_with_a_deployment(replicas: Replicas, namespace: str) -> None:
    apply(gb300_deployment(namespace, "k3"))
    wait_converged(namespace, "k3")
    before = uids(namespace)

    fault = inject("kube-apiserver restarted (TERM) with a deployment in place")
    rode_out(replicas, restart_apiserver(crash=False), fault)
    scale_after_restart(replicas, namespace, "k3", replicas=2)
    recovered(fault)
    assert uids(namespace) == before, "children were re-created, not kept"


def test_apiserver_crash_while_a_deployment_is_created(replicas: Replicas, namespace: str) -> None:
    apply(gb300_deployment(namespace, "k3"))
    fault = inject("kube-apiserver crashed (SIGKILL) while a deployment was being created")
    rode_out(replicas, restart_apiserver(crash=True), fault)
    wait_converged(namespace, "k3")
    scale_after_restart(replicas, namespace, "k3", replicas=2)
    recovered(fault)


# ---- children deleted or edited by hand ---------------------------------------------------------

@pytest.mark.parametrize(("resource", "name"), [
    ("leaderworkerset", "k3-gb300-aggregated"),
    ("service", "k3-gb300-aggregated-leader"),
    ("computedomain", "k3-gb300-aggregated-cd"),
    ("deployment", "k3-router"),
])
def test_child_deleted_by_hand_is_restored(replicas: Replicas, namespace: str,
                                           resource: str, name: str) -> None:
    apply(gb300_deployment(namespace, "k3"))
    cr = wait_converged(namespace, "k3")
    old = get_json(resource, name, "-n", namespace)["metadata"]["uid"]

    fault = inject(f"{resource} deleted by hand")
    kubectl("-n", namespace, "delete", resource, name, "--wait=true", "--timeout=60s")
    wait_converged(namespace, "k3")
    recovered(fault)
    new = get_json(resource, name, "-n", namespace)["metadata"]
    assert new["uid"] != old, "the same object: the deletion never happened"
    (ref,) = new["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == ("KimiK3Deployment", "k3",
                                                                        cr["metadata"]["uid"], True)
    assert replicas.alive()


def test_children_edited_by_hand_are_restored(replicas: Replicas, namespace: str) -> None:
    apply(gb300_deployment(namespace, "k3"))
    wait_converged(namespace, "k3")
    before = uids(namespace)

    faults = [inject("LeaderWorkerSet replicas edited by hand (1 -> 3)"),
              inject("Service port renumbered by hand (8000 -> 9999)")]
    kubectl("-n", namespace, "patch", "leaderworkerset", "k3-gb300-aggregated", "--type=merge",
            "-p", '{"spec":{"replicas":3}}')
    kubectl("-n", namespace, "patch", "service", "k3-gb300-aggregated-leader", "--type=json",
            "-p", '[{"op":"replace","path":"/spec/ports/0/port","value":9999}]')
    wait_converged(namespace, "k3")
    recovered(*faults)
    assert uids(namespace) == before, "restored by re-creating, not by taking the fields back"
    svc = get_json("service", "k3-gb300-aggregated-leader", "-n", namespace, "--show-managed-fields")
    assert [p["port"] for p in svc["spec"]["ports"]] == [8000]
    # Only apply entries of ours remain: a later apply can still remove a field we stop sending.
    managers = {(e["manager"], e["operation"]) for e in svc["metadata"]["managedFields"]}
    assert managers == {("kimik3-operator", "Apply")}, managers
    assert replicas.alive()


def test_scaled_through_the_scale_subresource_is_restored(replicas: Replicas, namespace: str) -> None:
    """`kubectl scale` sets spec.replicas through /scale, as an HPA does, and for a custom resource
    the API server records next to nothing of that write in managedFields. The role is not
    autoscaled: the operator takes the planned count back, and no status it writes after the
    scale says Ready while the LeaderWorkerSet asks for or runs more than the planned group."""
    apply(gb300_deployment(namespace, "k3"))
    cr = wait_converged(namespace, "k3")
    before = uids(namespace)
    ready_since = (condition(cr, "Ready") or {})["lastTransitionTime"]
    time.sleep(1.1)  # condition times have one-second resolution: a later transition must differ
    lws = "k3-gb300-aggregated"
    samples: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def ready_again(cr: dict[str, Any]) -> bool:
        """Ready by a transition after the scale (not the Ready shown before it)."""
        ready = condition(cr, "Ready") or {}
        return ready.get("status") == "True" and ready.get("lastTransitionTime") != ready_since

    def sample() -> dict[str, Any] | None:
        """The deployment, then its LeaderWorkerSet; the deployment once it is Ready again as planned."""
        cr = get_json("k3", "k3", "-n", namespace)
        samples.append((cr, get_json("leaderworkerset", lws, "-n", namespace)))
        return cr if ready_again(cr) and not status_problems(cr) else None

    fault = inject("LeaderWorkerSet scaled through /scale (1 -> 3)")
    kubectl("-n", namespace, "scale", "leaderworkerset", lws, "--replicas=3")
    # Ready again only through a transition: the operator reported the role not ready in between.
    wait_for("the deployment to turn Ready again after the scale", sample, timeout=180, interval=0.2)
    wait_converged(namespace, "k3")
    recovered(fault)
    # Each Ready written after the scale was computed from a LeaderWorkerSet back at the planned
    # group: read after it, the LeaderWorkerSet neither asks for nor counts more.
    for cr, live in samples:
        counts = live.get("status") or {}
        running = max(counts.get("replicas", 0), counts.get("readyReplicas", 0))
        if ready_again(cr):
            assert live["spec"]["replicas"] == 1 and running <= 1, (cr["status"]["readySummary"], live["spec"], counts)
    assert uids(namespace) == before, "restored by taking spec.replicas back, not by re-creating"
    live = get_json("leaderworkerset", lws, "-n", namespace, "--show-managed-fields")
    assert live["spec"]["replicas"] == 1
    (ours,) = [e for e in live["metadata"]["managedFields"]
               if (e["manager"], e["operation"]) == ("kimik3-operator", "Apply")]
    assert "f:replicas" in ours["fieldsV1"]["f:spec"], ours  # the count is the operator's again
    assert not [e for e in live["metadata"]["managedFields"] if e.get("subresource") == "scale"]

    def leaders() -> list[str]:
        pods = get_json("pods", "-n", namespace, "-l",
                        f"leaderworkerset.sigs.k8s.io/name={lws},leaderworkerset.sigs.k8s.io/worker-index=0")["items"]
        return [p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")]

    wait_for("the groups beyond the plan to be gone", lambda: len(leaders()) == 1, timeout=60)
    wait_converged(namespace, "k3")
    assert replicas.alive()


def test_edit_in_the_second_of_the_operators_apply_is_restored(replicas: Replicas, namespace: str,
                                                               custom_objects: client.CustomObjectsApi) -> None:
    """managedFields times have one-second resolution: an edit made in the second the operator
    applied carries that apply's time, and must not pass for older. The operator's apply is its
    repair of a first edit; a second edit follows at once, until one lands in that same second."""
    apply(gb300_deployment(namespace, "k3"))
    wait_converged(namespace, "k3")
    lws = (LEADER_WORKER_SET.group, LEADER_WORKER_SET.version, namespace, LEADER_WORKER_SET.plural,
           "k3-gb300-aggregated")
    pool = custom_objects.get_namespaced_custom_object(*lws)["metadata"]["labels"][LABEL_POOL]

    def edit() -> dict[str, Any]:
        """The pool label changed by hand (a field the operator owns, and no rollout); the LWS
        watch starts a pass at once."""
        return custom_objects.patch_namespaced_custom_object(  # type: ignore[no-any-return]
            *lws, {"metadata": {"labels": {LABEL_POOL: "edited-by-hand"}}}, field_manager="e2e-hand-edit",
            _content_type="application/merge-patch+json")

    def restored() -> bool:
        return custom_objects.get_namespaced_custom_object(*lws)["metadata"]["labels"][LABEL_POOL] == pool

    def same_second(obj: dict[str, Any]) -> bool:
        times = {e["operation"]: e["time"] for e in obj["metadata"]["managedFields"]
                 if e["manager"] in ("kimik3-operator", "e2e-hand-edit") and not e.get("subresource")}
        return times.get("Apply") == times.get("Update")

    fault = inject("LeaderWorkerSet label edited by hand in the second of the operator's apply")
    for _ in range(10):
        edit()
        wait_for("the operator to take the edit back", restored, timeout=60, interval=0.02)
        hit = same_second(edit())
        wait_for("the operator to take back the edit " + ("made in the second of its apply" if hit else "after it"),
                 restored, timeout=60)
        if hit:
            break
    else:
        pytest.fail("no edit in 10 landed in the second of the operator's apply")
    recovered(fault)
    wait_converged(namespace, "k3")
    assert replicas.alive()


# ---- nodes --------------------------------------------------------------------------------------

def test_node_deleted_replans_with_the_numbers(replicas: Replicas, namespace: str) -> None:
    wait_b200_free(namespace)
    apply(b200_deployment(namespace, "k3", B200, replicas=2))  # 2 x 2 nodes: all four B200 nodes
    wait_converged(namespace, "k3")
    before = uids(namespace)
    # A node that holds one of ours and nothing else (the chart's idle pod may sit on one).
    others = {p["spec"].get("nodeName") for p in get_json("pods", "-A")["items"]
              if p["metadata"]["namespace"] != namespace}
    victim = sorted(n for _, n in pods_of(namespace).values() if n not in others)[0]
    doc = next(d for d in b200_nodes() if d["metadata"]["name"] == victim)
    try:
        fault = inject(f"node {victim} deleted (kubectl delete node)")
        kubectl("delete", "node", victim, "--wait=true", "--timeout=60s")

        def short() -> dict[str, Any] | None:
            ready = condition(get_json("k3", "k3", "-n", namespace), "Ready") or {}
            return ready if ready.get("reason") == INSUFFICIENT_CAPACITY else None

        # Pod GC removes the pods bound to the gone node (after ~40 s); LWS re-creates them Pending.
        ready = wait_for("Ready=False InsufficientCapacity", short, timeout=240)
        assert ready["status"] == "False"
        assert ("pool b200 role aggregated: 1 of 2 replicas do not fit now; each needs 2 node(s) with "
                "8 free GPUs in the pool; nodes left with 8 free GPUs (pool: 1)") in ready["message"], ready
        assert replicas.alive()
        assert uids(namespace) == before
        # The router's engine list follows the group LWS recreates (new pod IPs): give it a pass.
        wait_for("the children to be as rendered", lambda: not check_children(namespace), timeout=60)
    finally:
        if kubectl("get", "node", victim, check=False).returncode != 0:
            kubectl("create", "-f", "-", input=yaml.safe_dump(doc))
        wait_for(f"node {victim} Ready again", lambda: node_ready(victim), timeout=120)
    wait_converged(namespace, "k3", timeout=180)
    recovered(fault)


def test_nodes_relabelled_away_keep_what_serves(replicas: Replicas, namespace: str) -> None:
    """Without gpu.product the pool cannot be planned at all without nodes; with it, it could be
    planned ahead of its nodes. Either way the running children stay and the status says why."""
    wait_b200_free(namespace)
    names = [n["metadata"]["name"] for n in b200_nodes()]
    groups = {"auto": names[:2], "explicit": names[2:4]}
    try:
        for value, nodes in groups.items():
            kubectl("label", "node", *nodes, f"{FAULT_LABEL}={value}", "--overwrite")
        apply(b200_deployment(namespace, "auto", {FAULT_LABEL: "auto"}, replicas=1))
        apply(b200_deployment(namespace, "explicit", {FAULT_LABEL: "explicit"}, replicas=1, product="B200"))
        for name in groups:
            wait_converged(namespace, name)
        children, pods = uids(namespace), pods_of(namespace)
        generations = {o["metadata"]["name"]: o["metadata"]["generation"]
                       for o in get_json("leaderworkersets", "-n", namespace)["items"]}

        fault = inject("4 nodes relabelled so two pools' selectors match nothing")
        kubectl("label", "node", *names[:4], f"{FAULT_LABEL}-")
        for name, nodes in groups.items():
            def stranded(name: str = name) -> dict[str, Any] | None:
                ready = condition(get_json("k3", name, "-n", namespace), "Ready") or {}
                return ready if ready.get("reason") == NO_MATCHING_NODES else None

            ready = wait_for(f"{name}: Ready=False NoMatchingNodes", stranded, timeout=60)
            assert ready["status"] == "False"
            assert (f"pool b200: no schedulable GPU node matches nodeSelector {{'{FAULT_LABEL}': '{name}'}} any "
                    f"more; its pods still run on {', '.join(nodes)}") in ready["message"], ready
        replicas.leader().wait_resyncs(2)  # two more passes: still nothing may change
        assert uids(namespace) == children and pods_of(namespace) == pods
        assert {o["metadata"]["name"]: o["metadata"]["generation"]
                for o in get_json("leaderworkersets", "-n", namespace)["items"]} == generations
        assert not check_children(namespace), check_children(namespace)

        for value, nodes in groups.items():
            kubectl("label", "node", *nodes, f"{FAULT_LABEL}={value}")
        for name in groups:
            wait_converged(namespace, name, timeout=60)
        recovered(fault)
        assert uids(namespace) == children and pods_of(namespace) == pods, "serving pods were replaced"
        assert replicas.alive()
    finally:
        kubectl("label", "node", *names, f"{FAULT_LABEL}-")


# ---- nodes drained ------------------------------------------------------------------------------

# The engines' /dev/shm is an emptyDir. Only the test's own pods are evicted: other pods that
# need no GPU (the chart's, kwok places them anywhere) may share the node, and are not the subject.
DRAIN = ("--ignore-daemonsets", "--delete-emptydir-data", f"--pod-selector={LABEL_DEPLOYMENT}=k3")

def test_node_drain_takes_one_group_at_a_time(replicas: Replicas, namespace: str) -> None:
    """`kubectl drain` evicts through the role's PodDisruptionBudget (render/disruption.py): the
    first drain takes one group, whose pod LeaderWorkerSet cannot place again while the node is
    cordoned and the pool is full; a drain of a node of the other group is refused until the first
    group serves again, and then goes through."""
    wait_b200_free(namespace)
    apply(b200_deployment(namespace, "k3", B200, replicas=2))  # 2 x 2 nodes: all four B200 nodes
    wait_converged(namespace, "k3")

    def allowed() -> int | None:
        return (get_json("pdb", "k3-b200-aggregated", "-n", namespace).get("status") or {}).get("disruptionsAllowed")

    def group(index: str) -> list[dict[str, Any]]:
        return get_json("pods", "-n", namespace, "-l", f"leaderworkerset.sigs.k8s.io/group-index={index}")["items"]

    wait_for("the role's budget to allow one disruption", lambda: allowed() == 1, timeout=60)
    group_of = {p["metadata"]["name"]: (p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"],
                                        p["spec"]["nodeName"])
                for p in get_json("pods", "-n", namespace, "-l", "serving.kimik3.dev/role")["items"]}
    first, second = (min(node for index, node in group_of.values() if index == want) for want in ("0", "1"))
    drained: list[str] = []
    try:
        fault = inject(f"node {first} drained (kubectl drain), then {second} while the first group is down")
        drained.append(first)
        kubectl("drain", first, *DRAIN, "--timeout=60s", timeout=120)

        def group_down() -> bool:
            return not all(map(is_ready, group("0"))) and allowed() == 0

        wait_for("group 0 down and the budget spent", group_down, timeout=60)
        drained.append(second)
        refused = kubectl("drain", second, *DRAIN, "--timeout=10s", check=False, timeout=60)
        assert refused.returncode != 0, refused.stdout
        assert "disruption budget" in refused.stderr, refused.stderr
        serving = group("1")
        assert len(serving) == 2 and all(is_ready(p) and "deletionTimestamp" not in p["metadata"] for p in serving)

        # The first node back: its group is placed and Ready again, and the refused drain goes through.
        kubectl("uncordon", first)
        drained.remove(first)
        wait_for("the budget to allow one disruption again", lambda: allowed() == 1, timeout=120)
        kubectl("drain", second, *DRAIN, "--timeout=60s", timeout=120)
        assert replicas.alive()
    finally:
        for node in drained:
            kubectl("uncordon", node, check=False)
    wait_converged(namespace, "k3", timeout=180)
    recovered(fault)
