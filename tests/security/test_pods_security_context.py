"""Attack: a process in one of the operator's pods reaches further than its job needs.

Every pod the operator renders is held to Pod Security Standards, checked here the way the
admission controller's levels read (k8s.io/pod-security-admission policy checks, the parts a pod
template can break): staging and router pods are "restricted"; serving pods are "baseline" (vLLM
runs as root, render/workloads.py `pod_security` says why), except IPC_LOCK on the pods that do
RDMA, and nothing else; no serving pod carries a ServiceAccount token, and the router pod's is
its own ServiceAccount's, which may only list and watch pods in its namespace (its discovery).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kimik3_operator.planner.facts import RDMA_RESOURCE_PREFIXES
from tests.golden.scenarios import SCENARIOS
from tests.golden.test_golden import rendered_objects

BASELINE_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                                "projected", "secret"})
RDMA_ONLY = frozenset({"IPC_LOCK"})
"""What RDMA pods add beyond baseline: memory registration pins buffers (images/README.md)."""


def pods(kind: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(scenario/object, pod spec) of every pod template of `kind` in the golden scenarios."""
    for scenario in SCENARIOS:
        for child in rendered_objects(scenario):
            if child["kind"] != kind:
                continue
            spec = child["spec"]
            templates = ([spec["template"]] if "template" in spec else
                         [spec["leaderWorkerTemplate"][t] for t in ("leaderTemplate", "workerTemplate")
                          if t in spec["leaderWorkerTemplate"]])
            for template in templates:
                yield f"{scenario}/{child['metadata']['name']}", template["spec"]


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def baseline_violations(pod: dict[str, Any], allowed_extra: frozenset[str] = frozenset()) -> list[str]:
    out = [f"host namespace {k}" for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)]
    out += [f"hostPath volume {v['name']}" for v in pod.get("volumes", []) if "hostPath" in v]
    if (pod.get("securityContext") or {}).get("seccompProfile", {}).get("type") == "Unconfined":
        out.append("seccomp Unconfined")
    for c in containers(pod):
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{c['name']}: privileged")
        added = set((sc.get("capabilities") or {}).get("add") or [])
        out += [f"{c['name']}: adds {cap}" for cap in sorted(added - BASELINE_CAPABILITIES - allowed_extra)]
        out += [f"{c['name']}: hostPort" for p in c.get("ports", []) if p.get("hostPort")]
        if sc.get("seccompProfile", {}).get("type") == "Unconfined":
            out.append(f"{c['name']}: seccomp Unconfined")
    return out


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    out = baseline_violations(pod)
    pod_sc = pod.get("securityContext") or {}
    out += [f"volume {v['name']}" for v in pod.get("volumes", []) if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    for c in containers(pod):
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c['name']}: allowPrivilegeEscalation")
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            out.append(f"{c['name']}: capabilities not dropped")
        if set((sc.get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{c['name']}: adds capabilities")
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            out.append(f"{c['name']}: may run as root")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            out.append(f"{c['name']}: runAsUser 0")
        profile = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if profile not in ("RuntimeDefault", "Localhost"):
            out.append(f"{c['name']}: seccomp {profile}")
    return out


@pytest.mark.parametrize("kind", ["Job", "Deployment"])
def test_staging_and_router_pods_are_restricted(kind: str) -> None:
    found = list(pods(kind))
    assert found
    for where, pod in found:
        assert restricted_violations(pod) == [], where


def test_staging_pods_get_a_token_for_their_progress_and_router_pods_one_that_only_lists_and_watches_pods() -> None:
    assert all(pod["serviceAccountName"].endswith("-weights") for _, pod in pods("Job"))
    routers = 0
    for scenario in SCENARIOS:
        objs = rendered_objects(scenario)
        by = {(o["kind"], o["metadata"]["name"]): o for o in objs}
        for deployment in (o for o in objs if o["kind"] == "Deployment"):
            routers += 1
            where = f"{scenario}/{deployment['metadata']['name']}"
            pod = deployment["spec"]["template"]["spec"]
            name = pod["serviceAccountName"]
            assert name == f"{SCENARIOS[scenario]['metadata']['name']}-router", where  # not the stager's
            assert pod["automountServiceAccountToken"] is True, where  # the pod asks; the account mounts none
            account = by[("ServiceAccount", name)]
            assert account["automountServiceAccountToken"] is False, where
            # Every binding of that account: one, to its own Role, in its namespace.
            namespace = deployment["metadata"]["namespace"]
            bindings = [o for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")
                        and any(s == {"kind": "ServiceAccount", "name": name, "namespace": namespace}
                                for s in o["subjects"])]
            assert [(b["kind"], b["roleRef"]) for b in bindings] == [
                ("RoleBinding", {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name})], where
            role = by[("Role", name)]
            assert role["metadata"]["namespace"] == namespace, where
            assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}], where
    assert routers, "no golden scenario renders a router"


def test_serving_pods_are_baseline_but_ipc_lock_on_rdma_and_have_no_api_access() -> None:
    rdma = 0
    for where, pod in pods("LeaderWorkerSet"):
        assert baseline_violations(pod, RDMA_ONLY) == [], where
        assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False, where
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        (vllm,) = pod["containers"]
        assert vllm["securityContext"]["allowPrivilegeEscalation"] is False, where
        added = set(vllm["securityContext"].get("capabilities", {}).get("add", []))
        assert added <= RDMA_ONLY, where
        if added:  # only where traffic leaves the node over the NICs
            rdma += 1
            assert any(r.startswith(RDMA_RESOURCE_PREFIXES) for r in vllm["resources"]["limits"]), where
        for wait in pod["initContainers"]:
            assert restricted_violations({**pod, "initContainers": [wait], "containers": []}) == [], where
    assert rdma, "no golden scenario does RDMA: the IPC_LOCK rule is not exercised"
