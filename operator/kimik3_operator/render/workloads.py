"""One LeaderWorkerSet per (pool, role): a group per replica, one pod per node.

The group size is the replica's node count; every pod requests the GPUs of a whole node (or of
the whole replica when it fits in one node). On NVL72 racks the pods of one group must share an
NVLink clique: required pod affinity on the clique label, scoped to the group with
`matchLabelKeys: [group-key]`, so many groups can share a rack (LWS exclusive topology would
allow one group per clique).
"""

from __future__ import annotations

from typing import Any

from ..contract.kinds import LEADER_WORKER_SET
from ..contract.kueue import QUEUE_LABEL
from ..planner import Plan, PoolPlan, RolePlan
from . import chat_template, compile_cache
from .compute_domain import CLAIM_NAME, kv_domain_affinity, pod_claims
from .engine import HTTP_PORT, engine_args, engine_env, nixl_ports
from .names import LABEL_COMPAT, Owner, labels, object_meta, workload_name
from .placement import place
from .rdma import fabric_env
from .weights import serving_mounts, serving_volumes, wait_containers

LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"

# Loading 1.6 TB of weights and JIT warm-up takes far longer than default probes allow
# (NVIDIA Dynamo's K3 recipes budget 120 minutes); the plan's estimate (planner/timeouts.py),
# which outlasts vLLM's own ready deadline, replaces this when it has one.
STARTUP_PROBE_SECONDS = 7200
PROBE_PERIOD_SECONDS = 10
PRE_STOP_SECONDS = 10
SHM_SIZE = "128Gi"  # NCCL, NIXL and the DP coordinator exchange through /dev/shm


def pod_security() -> dict[str, Any]:
    """What every serving pod gets, and why not more.

    The vLLM container runs as the image's user, root: images/vllm-cuda/Dockerfile sets no USER (nor
    does vllm/vllm-openai-rocm, the base of images/vllm-rocm/Dockerfile), and it must stay root while
    the pod does RDMA: Kubernetes grants no ambient capabilities, so IPC_LOCK (which memory
    registration needs to pin buffers beyond RLIMIT_MEMLOCK) is only effective for uid 0. Its JIT
    caches (Triton, FlashInfer, DeepGEMM) also live under root's HOME. It keeps the runtime's default
    capabilities: root reads the checkpoint of a pvc:// claim whatever its files' owner and mode,
    which it could not without DAC_OVERRIDE. What it does get: the RuntimeDefault seccomp profile, no
    privilege escalation (no setuid binary is needed), no ServiceAccount token (a serving pod never
    talks to the API server) and no Service environment variables (every Service of the namespace as
    `*_SERVICE_HOST`: nothing reads them, and a Service named vllm would set VLLM_PORT to a URL,
    one named vllm-x an unknown VLLM_* variable, which --fail-on-environ-validation refuses). The
    init containers that wait for the weights run as the stager's non-root user, with no
    capability at all.

    This is Pod Security "baseline", except that RDMA pods (a replica spanning HGX nodes, or NIXL KV
    transfer) add IPC_LOCK, which baseline does not allow: see images/README.md. The router pods are
    "restricted" (router.py)."""
    return {"seccompProfile": {"type": "RuntimeDefault"}}


def leader_worker_set(owner: Owner, plan: Plan, pool: PoolPlan, role: RolePlan, partition: int = 0,
                      broken: int = 0) -> dict[str, Any]:
    """`partition`: groups below it keep the template they run (LWS rollingUpdateConfiguration;
    reconcile/rollout.py holds a paired role's old groups with it while a new revision fills);
    `broken`: old groups that fail below healthy ones, added to maxUnavailable so that the rollout
    replaces the healthy ones as if they were not there (rollout.py)."""
    name = workload_name(owner, pool.name, role.role)
    group: dict[str, Any] = {
        "size": role.nodes_per_replica,
        "restartPolicy": "RecreateGroupOnPodRestart",
        "workerTemplate": pod_template(owner, plan, pool, role, name, worker=role.nodes_per_replica > 1),
    }
    if role.nodes_per_replica > 1:
        group["leaderTemplate"] = pod_template(owner, plan, pool, role, name, worker=False)
    meta = object_meta(owner, name, pool.name, role.role)
    if role.queue:
        meta["labels"][QUEUE_LABEL] = role.queue
    return {
        **LEADER_WORKER_SET.type_meta(),
        "metadata": meta,
        "spec": {
            # An autoscaled role's count is its scaler's: left out of our apply so we never fight it
            # (reconcile/autoscaler.py hands it to the scaler's field manager: Cluster.set_replicas).
            **({} if role.autoscaling else {"replicas": role.replicas}),
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxUnavailable": plan.max_unavailable + broken,
                                               "maxSurge": plan.max_surge,
                                               **({"partition": partition} if partition else {})},
            },
            "leaderWorkerTemplate": group,
        },
    }


def pod_template(owner: Owner, plan: Plan, pool: PoolPlan, role: RolePlan, lws_name: str,
                 *, worker: bool) -> dict[str, Any]:
    pod_labels = {**labels(owner, pool.name, role.role), LABEL_COMPAT: plan.compat_hash}
    vllm = container(plan, pool, role, worker=worker)
    vllm["volumeMounts"] += [*serving_mounts(owner, plan.weights), compile_cache.mount(pool.image),
                             *chat_template.mounts(plan.engine, worker=worker)]
    vllm["env"] += compile_cache.env()
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security(),
        "initContainers": wait_containers(owner, plan.weights, pool.image),
        "containers": [vllm],
        # vLLM drains for --shutdown-timeout after SIGTERM; give it that plus the preStop pause.
        "terminationGracePeriodSeconds": plan.engine.shutdown_timeout + PRE_STOP_SECONDS + 30,
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
                    *serving_volumes(owner, plan.weights), compile_cache.volume(owner, plan.weights),
                    *chat_template.volumes(plan.engine, worker=worker)],
    }
    place(spec, role.placement)
    if role.compute_domain:
        spec["resourceClaims"] = pod_claims(owner, pool, role)
    terms = [kv_domain_affinity(owner)] if role.shared_compute_domain else []
    if role.group_topology_key:
        terms.append({
            "labelSelector": {"matchLabels": {LWS_NAME_LABEL: lws_name}},
            "matchLabelKeys": [LWS_GROUP_KEY_LABEL],
            "topologyKey": role.group_topology_key,
        })
    if terms:
        spec["affinity"] = {**(spec.get("affinity") or {}),
                            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}}
    return {"metadata": {"labels": pod_labels}, "spec": spec}


def container(plan: Plan, pool: PoolPlan, role: RolePlan, *, worker: bool) -> dict[str, Any]:
    engine = plan.engine
    resources = {pool.gpu_resource: str(role.gpus_per_pod)}
    if role.pod_resources is not None:
        resources.update(role.pod_resources.amounts())  # requests = limits: Guaranteed (pod_resources.py)
    if role.rdma_nics and role.rdma_resource:
        resources[role.rdma_resource] = str(role.rdma_nics)  # planner/fabric.py rule 5
    out: dict[str, Any] = {
        "name": "vllm",
        "image": pool.image,
        "command": engine_args(role, engine, worker=worker, scale_out=plan.router_tokenizes(pool.name, role.role),
                               kv_events=plan.publishes_kv_events(pool.name, role.role)),
        "env": engine_env(role, engine, worker=worker, vendor=pool.vendor)
               + fabric_env(pool, role, taken=(name for name, _ in engine.env)),
        "resources": {"limits": dict(resources), "requests": dict(resources)},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        # The endpoints controller needs a moment to stop routing here before vLLM starts draining.
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SECONDS}}},
    }
    out["securityContext"] = {"allowPrivilegeEscalation": False}  # root, see pod_security
    if role.rdma_nics:
        # RDMA registers (pins) GPU and host memory: verbs need IPC_LOCK.
        out["securityContext"]["capabilities"] = {"add": ["IPC_LOCK"]}
    if role.compute_domain:
        out["resources"]["claims"] = [{"name": CLAIM_NAME}]
    ports = nixl_ports(role)
    if not worker:
        ports = [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}, *ports]
        health = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": PROBE_PERIOD_SECONDS}
        startup = role.timeouts.startup_probe_seconds if role.timeouts else STARTUP_PROBE_SECONDS
        out["startupProbe"] = {**health, "failureThreshold": startup // PROBE_PERIOD_SECONDS}
        out["readinessProbe"] = {**health, "failureThreshold": 3}
    if ports:
        out["ports"] = ports
    return out
