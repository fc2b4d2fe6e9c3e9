"""Invariants every accepted-and-planned spec's children must hold, shared by the pure fuzz and
the vLLM contract fuzz."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.api.owned_flags import flag_name, owned_flag
from kimik3_operator.api.vllm_env import KNOWN_VLLM_ENV
from kimik3_operator.contract.stager import S3_SECRET_KEYS
from kimik3_operator.planner import Plan
from kimik3_operator.render import Owner, render_children
from kimik3_operator.render.kubelet import literals
from kimik3_operator.render.names import LABEL_POOL, LABEL_ROLE, labels

SECRET_REF_PATH = ("valueFrom", "secretKeyRef", "name")


def leaves(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from leaves(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from leaves(v, (*path, i))
    else:
        yield path, obj


def containers(child: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(template, container) of a LeaderWorkerSet's worker and leader templates."""
    group = child["spec"]["leaderWorkerTemplate"]
    out = []
    for template in ("leaderTemplate", "workerTemplate"):
        if template in group:
            out += [(template, c) for c in group[template]["spec"]["containers"]]
    return out


def pod_specs(child: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(template, pod spec) of every pod template a child carries: LeaderWorkerSet leader and
    worker, Job, Deployment."""
    if child["kind"] == "LeaderWorkerSet":
        group = child["spec"]["leaderWorkerTemplate"]
        return [(t, group[t]["spec"]) for t in ("leaderTemplate", "workerTemplate") if t in group]
    if child["kind"] in ("Job", "Deployment"):
        return [("template", child["spec"]["template"]["spec"])]
    return []


def check_pod(kind: str, template: str, pod: dict[str, Any]) -> None:
    """Every pod: no Service environment variables (a Service named vllm-x would inject VLLM_X_*,
    which --fail-on-environ-validation refuses), no envFrom, CPU, memory and ephemeral-storage
    requests on every container; serving pods Guaranteed (requests = limits everywhere) and every
    VLLM_* variable one vLLM 0.33.0 knows."""
    where = f"{kind} {template}"
    assert pod["enableServiceLinks"] is False, where
    every = [*pod.get("initContainers", []), *pod["containers"]]
    for c in every:
        assert "envFrom" not in c, (where, c["name"])
        requests = c["resources"]["requests"]
        assert {"cpu", "memory", "ephemeral-storage"} <= requests.keys(), (where, c["name"], requests)
        if kind == "LeaderWorkerSet":
            limits = c["resources"]["limits"]
            assert requests == limits, f"{where} {c['name']}: not Guaranteed: {requests} != {limits}"
            unknown = [e["name"] for e in c.get("env", []) if e["name"].startswith("VLLM_")
                       and e["name"] not in KNOWN_VLLM_ENV]
            assert not unknown, f"{where} {c['name']}: vLLM 0.33.0 refuses {unknown}"


SERVING_KINDS = frozenset({"Service", "ComputeDomain", "LeaderWorkerSet"})


def check_children(cr: KimiK3Deployment, plan: Plan, replanned: Plan, owner: Owner) -> list[dict[str, Any]]:
    """Render `plan`, assert the invariants and return the children."""
    children = render_children(owner, plan)
    assert children == render_children(owner, replanned), "rendering is not deterministic"
    keys = [(c["kind"], c["metadata"]["name"]) for c in children]
    assert len(keys) == len(set(keys)), f"two children share a name: {keys}"
    assert len([k for k in keys if k[0] == "LeaderWorkerSet"]) == len(plan.role_plans())
    assert len([k for k in keys if k[0] == "Deployment"]) == len(plan.routers) == (
        (cr.spec.router.replicas > 0) * len({role.role == "aggregated" for _, role in plan.role_plans()}))
    ours = labels(owner)
    for child in children:
        meta = child["metadata"]
        assert meta["namespace"] == owner.namespace
        assert meta["ownerReferences"] == [owner.reference()], f"{keys}: owner reference"
        assert ours.items() <= meta["labels"].items()
        if meta["labels"].get("app.kubernetes.io/component") == "router":
            _check_router(child)
        elif child["kind"] in SERVING_KINDS:
            assert LABEL_POOL in meta["labels"] and LABEL_ROLE in meta["labels"], keys
        assert len(meta["name"]) <= 63, meta["name"]
        _check_secret(cr, child)
        for template, pod in pod_specs(child):
            check_pod(child["kind"], template, pod)
        if child["kind"] == "LeaderWorkerSet":
            _check_workload(cr, child)
    return children


def _check_router(child: dict[str, Any]) -> None:
    """A router selects its own pods only, and never gets API access."""
    assert LABEL_ROLE not in child["metadata"]["labels"]  # `-l serving.kimik3.dev/role` finds engines only
    if child["kind"] == "Deployment":
        template = child["spec"]["template"]
        assert child["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
        assert template["spec"]["automountServiceAccountToken"] is False


def _check_secret(cr: KimiK3Deployment, child: dict[str, Any]) -> None:
    """The model token is referenced by Secret name only, from an env var's secretKeyRef: the key
    it names, or for s3:// the AWS keys the stager reads, never the whole Secret."""
    ref = cr.spec.model.auth_secret_ref
    if ref is None:
        return
    for path, value in leaves(child):
        if isinstance(value, str) and ref.name in value:
            assert child["kind"] == "Job" and path[-3:] == SECRET_REF_PATH, \
                f"Secret name {ref.name} rendered at {path}: {value!r}"
    if child["kind"] == "LeaderWorkerSet":  # serving pods read staged files: no credential at all
        for _, c in containers(child):
            assert not [e for e in c["env"] if "secretKeyRef" in (e.get("valueFrom") or {})] and "envFrom" not in c
    if child["kind"] == "Job":  # the staging Job: by reference only, never a literal value
        (c,) = child["spec"]["template"]["spec"]["containers"]
        refs = [e for e in c["env"] if "secretKeyRef" in (e.get("valueFrom") or {})]
        assert all("value" not in e for e in refs) and "envFrom" not in c
        s3 = [{"name": ref.name, "key": k, "optional": True} for k in S3_SECRET_KEYS]
        assert [e["valueFrom"]["secretKeyRef"] for e in refs] in ([], [{"name": ref.name, "key": ref.key}], s3), refs


def _check_workload(cr: KimiK3Deployment, child: dict[str, Any]) -> None:
    extra = literals(cr.spec.engine.extra_args)  # as the kubelet must read them back: see render/kubelet.py
    for template, c in containers(child):
        argv = c["command"]
        assert argv[:2] == ["vllm", "serve"] and argv[len(argv) - len(extra):] == extra, (template, argv)
        rendered = argv[: len(argv) - len(extra)]
        ours = {flag_name(a) for a in rendered if a.startswith("-")}
        theirs = {flag_name(a) for a in extra if a.startswith("-")}
        assert not ours & theirs, f"extraArgs repeat rendered flags {sorted(ours & theirs)}"
        assert owned_flag(extra) is None
        counts = Counter(flag_name(a) for a in argv if a.startswith("-"))
        assert not [f for f, n in counts.items() if n > 1 and owned_flag([f])], counts
        names = [e["name"] for e in c["env"]]
        repeated = sorted(n for n in names if names.count(n) > 1)
        assert not repeated, f"{template}: duplicate env {repeated}"
        for e in c["env"]:
            assert ("value" in e) != ("valueFrom" in e), e
        pod = child["spec"]["leaderWorkerTemplate"][template]
        assert child["metadata"]["labels"].items() <= pod["metadata"]["labels"].items()
        # a serving pod never talks to the API server and runs under the runtime's seccomp profile
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
