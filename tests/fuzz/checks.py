"""Invariants every accepted-and-planned spec's children must hold, shared by the pure fuzz and
the vLLM contract fuzz."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from kimik3_operator.api import KimiK3Deployment
from kimik3_operator.api.owned_flags import flag_name, owned_flag
from kimik3_operator.api.spec import OWNED_ENV, RDMA_ENV_PREFIXES
from kimik3_operator.api.vllm_env import KNOWN_VLLM_ENV
from kimik3_operator.contract.stager import S3_SECRET_KEYS
from kimik3_operator.planner import Plan, PoolPlan, RolePlan
from kimik3_operator.render import Owner, render_children
from kimik3_operator.render.kubelet import literals
from kimik3_operator.render.names import LABEL_POOL, LABEL_ROLE, labels, workload_name

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
        # the model cache claim has an owner only with spec.model.cache.retentionPolicy Delete
        retained = child["kind"] == "PersistentVolumeClaim" and plan.weights.cache_retained
        assert meta.get("ownerReferences") == (None if retained else [owner.reference()]), f"{keys}: owner reference"
        assert ours.items() <= meta["labels"].items()
        if meta["labels"].get("app.kubernetes.io/component") == "router":
            _check_router(child, children, owner)
        elif child["kind"] in SERVING_KINDS and not _shared_domain(plan, child):
            assert LABEL_POOL in meta["labels"] and LABEL_ROLE in meta["labels"], keys
        assert len(meta["name"]) <= 63, meta["name"]
        _check_secret(cr, child)
        for template, pod in pod_specs(child):
            check_pod(child["kind"], template, pod)
        if child["kind"] == "LeaderWorkerSet":
            _check_workload(cr, child)
    _check_fabric(cr, plan, owner, children)
    _check_shapes(cr, plan, children)
    return children


def _shared_domain(plan: Plan, child: dict[str, Any]) -> bool:
    """The one ComputeDomain prefill and decode share (labelled with neither's pool or role)."""
    return child["kind"] == "ComputeDomain" and any(r.shared_compute_domain for _, r in plan.role_plans())


def _pods(owner: Owner, pool: PoolPlan, role: RolePlan,
          children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (lws,) = [c for c in children if c["kind"] == "LeaderWorkerSet"
              and c["metadata"]["name"] == workload_name(owner, pool.name, role.role)]
    group = lws["spec"]["leaderWorkerTemplate"]
    return [group[t]["spec"] for t in ("leaderTemplate", "workerTemplate") if t in group]


def _check_fabric(cr: KimiK3Deployment, plan: Plan, owner: Owner, children: list[dict[str, Any]]) -> None:
    """MegaMoE never spans RDMA; NIXL between NVLink domains has NICs, IPC_LOCK and UCX over RDMA,
    inside one it shares the paired role's ComputeDomain; no pod env carries a VLLM_* variable
    that is neither the operator's nor the user's engine.env (rdma.env holds none)."""
    user_env = {e.name for e in cr.spec.engine.env}
    spec_pools = {p.name: p for p in cr.spec.pools}
    fabric_user = {e.name for p in cr.spec.pools if p.rdma for e in p.rdma.env} | user_env
    domains: dict[str, set[str]] = {}
    for pool, role in plan.role_plans():
        layout = role.layout
        if role.moe_backend == "deep_gemm_mega_moe" and role.crosses_rdma:
            # the replica crosses RDMA: only the pipeline may; each stage's EP group sits in one pod
            assert layout.data == 1 and layout.tensor <= role.gpus_per_pod, (pool.name, role.role, layout)
        rdma = spec_pools[pool.name].rdma
        assert not [e.name for e in (rdma.env if rdma else []) if not e.name.startswith(RDMA_ENV_PREFIXES)]
        for pod in _pods(owner, pool, role, children):
            (c,) = pod["containers"]
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert pod["enableServiceLinks"] is False  # no <SERVICE>_* variable from the namespace
            unknown = {n for n in env if n.startswith("VLLM_")} - set(OWNED_ENV) - user_env
            assert not unknown, f"{pool.name}/{role.role}: VLLM_* variables nobody owns: {sorted(unknown)}"
            claims = {cl["resourceClaimTemplateName"] for cl in pod.get("resourceClaims", [])}
            if role.kv_transport == "NVLink":
                domains.setdefault("kv", set()).update(claims)
                assert claims and ("UCX_CUDA_IPC_ENABLE_MNNVL" in fabric_user
                                   or env.get("UCX_CUDA_IPC_ENABLE_MNNVL") == "y"), (pool.name, role.role)
            elif role.role in ("prefill", "decode") and pool.rdma.resource is not None:
                nics = int(c["resources"]["requests"].get(pool.rdma.resource, "0"))
                assert nics >= 1 and "IPC_LOCK" in c["securityContext"]["capabilities"]["add"], (pool.name, role.role)
                assert "UCX_TLS" in fabric_user or "rc" in env["UCX_TLS"].split(","), env.get("UCX_TLS")
    assert len(domains.get("kv", set())) <= 1, f"paired roles claim different ComputeDomains: {domains}"


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def _check_shapes(cr: KimiK3Deployment, plan: Plan, children: list[dict[str, Any]]) -> None:
    """Every role's engine shape holds what vLLM needs and what the shaping promises: a token budget
    of at least max-num-seqs; a decode CUDA-graph capture covering max-num-seqs x (1 + k) unless the
    user set either; EPLB only on an expert group the experts spread evenly over; the command line
    says what the plan says, on every pod of the role."""
    k = plan.engine.speculative_tokens
    given = {(p.name, n): r.engine for p in cr.spec.pools for n, r in p.roles()}
    commands = {(c["metadata"]["labels"][LABEL_POOL], c["metadata"]["labels"][LABEL_ROLE]): containers(c)
                for c in children if c["kind"] == "LeaderWorkerSet"}
    for pool, role in plan.role_plans():
        shape = role.shape
        assert shape is not None
        assert shape.max_num_batched_tokens >= shape.max_num_seqs >= 1, shape
        override = given[(pool.name, role.role)]
        if role.role != "prefill" and not (override and override.max_cudagraph_capture_size):
            assert shape.max_cudagraph_capture_size is not None
            assert shape.max_cudagraph_capture_size >= shape.max_num_seqs * (1 + k), (shape, k)
        if role.role == "decode" and not (override and override.max_num_batched_tokens):
            assert shape.max_num_batched_tokens >= shape.max_num_seqs * (1 + k), shape
        # the rate a replica is credited with is one its schedulers admit
        assert role.predicted.get("decodeBatchAtSlo", 0) <= role.layout.data * shape.max_num_seqs, (role, shape)
        limit = plan.engine.max_model_len
        assert not (limit and shape.long_prefill_token_threshold and shape.long_prefill_token_threshold > limit), shape
        if shape.eplb_redundant_experts is not None:
            ep = role.layout.tensor * role.layout.data
            assert role.layout.expert and ep > 1 and (896 + shape.eplb_redundant_experts) % ep == 0, shape
        for _, c in commands[(pool.name, role.role)]:
            argv = c["command"]
            assert _flag(argv, "--max-num-seqs") == str(shape.max_num_seqs), argv
            assert _flag(argv, "--max-num-batched-tokens") == str(shape.max_num_batched_tokens), argv
            assert ("--enable-eplb" in argv) == (shape.eplb_redundant_experts is not None), argv


ROUTER_RULES = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
"""All the router's discovery may do with its token: list and watch pods, in its namespace."""


def _check_router(child: dict[str, Any], children: list[dict[str, Any]], owner: Owner) -> None:
    """A router selects its own pods only, finds the engines in its own namespace, and its token
    is its own ServiceAccount's, which may only list and watch pods there (one RoleBinding, to a
    namespaced Role; the account mounts no token in pods that do not ask for one)."""
    assert LABEL_ROLE not in child["metadata"]["labels"]  # `-l serving.kimik3.dev/role` finds engines only
    if child["kind"] != "Deployment":
        return
    template = child["spec"]["template"]
    assert child["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    pod = template["spec"]
    # clients reach the front only; the router listens on the pod's loopback
    assert [c["name"] for c in pod["containers"]] == ["front", "router"]
    c = pod["containers"][1]
    args = c["args"]
    assert args[args.index("--host") + 1] == "127.0.0.1"
    if "--service-discovery" in args:  # vllm-router, the fallback
        assert args[args.index("--service-discovery-namespace") + 1] == owner.namespace
    else:  # kimik3-router
        assert args[args.index("--namespace") + 1] == owner.namespace and "--prefill" not in args
    assert pod["automountServiceAccountToken"] is True
    name = pod["serviceAccountName"]
    assert name not in {j["spec"]["template"]["spec"].get("serviceAccountName") for j in children if j["kind"] == "Job"}
    by = {(o["kind"], o["metadata"]["name"]): o for o in children}
    assert by[("ServiceAccount", name)]["automountServiceAccountToken"] is False
    subject = {"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}
    bindings = [o for o in children if "subjects" in o and subject in o["subjects"]]
    assert [(b["kind"], b["roleRef"]) for b in bindings] == [
        ("RoleBinding", {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name})], bindings
    assert by[("Role", name)]["rules"] == ROUTER_RULES
    assert not [o for o in children if o["kind"].startswith("Cluster") and o["kind"].endswith(("Role", "RoleBinding"))]


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
