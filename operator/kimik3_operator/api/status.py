"""The status of KimiK3Deployment v1alpha1: what the operator observes and writes, only when it
changes. Its attribute docstrings are what `kubectl explain` prints for `.status`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, create_model

from . import role_settings
from .base import StatusModel, list_map
from .meta import Condition, Timestamp
from .spec import RoleName, RouterMode, RouterPolicy


class RoleAutoscalingStatus(StatusModel):
    """How an autoscaled role scales, and what its scaler last did."""

    mode: str
    """SLO | KEDA | HPA: the mode the role's autoscaling resolved to."""
    min_replicas: int
    """The fewest replicas the scaler keeps."""
    max_replicas: int
    """The most replicas the scaler makes."""
    metric: str
    """The load metric it follows (RequestsInFlight, PromptTokensPerSecond, ...)."""
    target: float
    """The metric's value per replica the scaler aims for."""
    target_source: str
    """spec | perf model | default."""
    scaler: str
    """Who moves the replicas: the HorizontalPodAutoscaler or ScaledObject of that name, or the operator."""
    last_scale_time: Timestamp | None = None
    """SLO mode: when the operator's scaler last changed the replica count."""
    last_scale: str | None = None
    """SLO mode: that change and its reason, e.g. "up 2 -> 3: itl p90 52 ms > 40 ms for 31 s"."""
    breach_since: Timestamp | None = None
    """SLO mode: since when a latency target is missed (cleared once met)."""
    calm_since: Timestamp | None = None
    """SLO mode: since when the load has fit one replica fewer (cleared once it does not); a
    replica goes once this is scaleDownCooldownSeconds old."""
    capacity_limited: str | None = None
    """SLO mode: the scaler wanted more replicas than the pool's free GPUs hold (the numbers)."""


class PodResourcesStatus(StatusModel):
    """What each serving pod of a role requests (and is limited to)."""

    cpu: str
    """CPU of each pod, request and limit (Guaranteed)."""
    memory: str
    """Memory of each pod, request and limit."""
    ephemeral_storage: str
    """Local ephemeral storage of each pod, request and limit."""
    source: str
    """nodes (the nodes' allocatable) | catalog (the GPU product's usual node) | spec, or a
    mix such as nodes+spec when pools[].resources gave some of the amounts."""


class ColdStartStatus(StatusModel):
    """The predicted time from a new replica's pods being scheduled to its leader being Ready, and
    its parts, one after another on the group's slowest pod (docs/cold-start.md)."""

    ready_seconds: int
    """A scale-up or a restart (compile cache warm): the SLO scaler's lead time."""
    first_ready_seconds: int
    """The deployment's first start (compile cache empty)."""
    pod_read_bytes: int
    """Distinct bytes each pod reads from the weights, as its loader reads them (each tensor once
    per node)."""
    read_bytes_per_second: int
    """What one node reads the weights at."""
    read_source: Literal["spec", "default"]
    """spec (spec.model.readThroughput) | default (1G, an NFS-class share)."""
    image_pull_seconds: int
    """The serving image reaching a node that has not run it."""
    load_seconds: int
    """Reading podReadBytes at readBytesPerSecond."""
    compile_seconds: int
    """torch.compile and JIT kernels loaded from the compile cache."""
    first_compile_seconds: int
    """The same compiled from nothing."""
    graph_capture_seconds: int
    """One CUDA graph per captured batch size."""


class _RoleStatusBase(StatusModel):
    """What a role resolved to and how many replicas are up."""

    role: RoleName
    """prefill | decode | aggregated."""
    replicas: int = 0
    """Planned replicas."""
    ready_replicas: int = 0
    """Replicas whose every pod is ready, as the LeaderWorkerSet counts them: more than planned
    while groups beyond the plan still run."""
    updated_replicas: int = 0
    """Replicas on the current revision, as the LeaderWorkerSet counts them."""
    queued_replicas: int = 0
    """Replicas (whole groups) a Kueue queue has not admitted yet (spec queueName): their pods are
    gated, hold no GPU and serve nothing; the Admitted condition says why they wait."""
    gpus_per_replica: int | None = None
    """GPUs one replica uses (tensor x pipeline x data parallel)."""
    nodes_per_replica: int | None = None
    """Nodes one replica spans: more than 1 makes it a LeaderWorkerSet group of a leader and workers."""
    tensor_parallel: int | None = None
    """vLLM's --tensor-parallel-size."""
    pipeline_parallel: int | None = None
    """vLLM's --pipeline-parallel-size."""
    data_parallel: int | None = None
    """vLLM's --data-parallel-size (attention data parallelism, with expert parallelism)."""
    expert_parallel: bool | None = None
    """vLLM's --enable-expert-parallel: the MoE experts are split across the replica's GPUs."""
    all2all_backend: Annotated[str | None, Field(alias="all2allBackend")] = None
    """vLLM's --all2all-backend (the key `kimik3 plan -o json` uses too; pydantic alone would write
    all2AllBackend)."""
    moe_backend: str | None = None
    """vLLM's --moe-backend."""
    compute_domain: bool | None = None
    """The replica's nodes share an NVIDIA ComputeDomain (multi-node NVLink, IMEX channels)."""
    expert_dispatch: str | None = None
    """How tokens really reach the experts: the all-to-all backend, or the MoE kernel when it
    dispatches itself (deep_gemm_mega_moe: DeepGEMM's symmetric memory over NVLink, whatever
    --all2all-backend says); none without expert parallelism across data-parallel ranks."""
    kv_transport: str | None = None
    """Prefill/decode roles: the fabric NIXL moves KV and KDA state over, NVLink (multi-node NVLink,
    one ComputeDomain for the pair) or RDMA."""
    rdma_nics: str | None = None
    """The RDMA NICs each pod requests, e.g. "8 x rdma/ib" (pods whose traffic leaves the node)."""
    block_size: int | None = None
    """The KV block size vLLM will use for this role."""
    replicas_source: Literal["spec", "workload", "default"] | None = None
    """Where the replica count came from: the spec, rate matching on spec.workload, or the default."""
    workload: str | None = None
    """Name of the LeaderWorkerSet serving this role."""
    endpoint: str | None = None
    """In-cluster URL of the role's leader Service."""
    autoscaling: RoleAutoscalingStatus | None = None
    """Set when the role is autoscaled: replicas is then its scaler's current count."""
    pod_resources: PodResourcesStatus | None = None
    """CPU, memory and ephemeral storage of each pod (requests = limits: Guaranteed)."""
    load_format: str | None = None
    """The loader vLLM reads the weights with: instanttensor | safetensors (spec.model.loading;
    docs/loading.md). safetensors without the expert filter is vLLM's default and renders no flag."""
    expert_weight_filter: bool | None = None
    """vLLM's --enable-ep-weight-filter: each rank reads only the experts it holds (expert
    parallelism without EPLB)."""
    cold_start: ColdStartStatus | None = None
    """How long a new replica takes to be Ready, predicted (docs/cold-start.md)."""
    vision_encoder: Literal["off", "weights", "data"] | None = None
    """How the engines run K3's vision tower (vLLM's --mm-encoder-tp-mode): data, whole on every
    tensor-parallel rank with the images split among them; weights, on a single-GPU rank; off,
    images turned off (multimodal.maxImagesPerPrompt 0), the tower not loaded (docs/multimodal.md)."""


if TYPE_CHECKING:
    RoleStatus = _RoleStatusBase  # the engine settings' fields are read through role_settings' rows
else:  # the values of the per-role engine settings used (role_settings.py), after the rest
    RoleStatus = create_model("RoleStatus", __base__=_RoleStatusBase, __module__=__name__,
                              __doc__=_RoleStatusBase.__doc__, **role_settings.status_fields())


class PoolStatus(StatusModel):
    """Resolved facts of one pool, under the keys of `kimik3 plan -o json`."""

    name: str
    """The pool's name in spec.pools."""
    gpu_product: str | None = None
    """The GPU the planner planned for (from spec.pools[].gpu.product, else the nodes' labels)."""
    interconnect: str | None = None
    """NVLink | RDMA | xGMI: the fabric a multi-node replica communicates over."""
    gpus_per_node: int | None = None
    """GPUs per node the planner planned with."""
    roles: Annotated[list[RoleStatus], Field(max_length=3), list_map("role")] = []
    """Per role: its resolved layout and replica counts."""


class EngineStatus(StatusModel):
    """Effective engine values, after the planner resolved defaults and adjusted what it must."""

    kv_cache_dtype: str | None = None
    """vLLM's --kv-cache-dtype for the MLA layers."""
    retention_policy: str | None = None
    """How KDA recurrent state is kept for prefix-cache reuse: Interval | Selective | Dense."""
    retention_interval_tokens: int | None = None
    """The --prefix-cache-retention-interval rendered (0: semantic checkpoints only; unset: dense),
    rounded to a multiple of blockSize."""
    requested_retention_interval_tokens: int | None = None
    """What spec.engine.prefixCaching.retention asked for."""
    block_size: int | None = None
    """What a retention interval must be a multiple of: the least common multiple of the block
    sizes vLLM aligns each role to (hybrid alignment raises them well above --block-size)."""
    speculative_method: str | None = None
    """The speculative decoding method rendered into --speculative-config (unset: none)."""
    num_speculative_tokens: int | None = None
    """Tokens proposed per step by the speculative method."""
    compatibility_hash: str | None = None
    """Hash of every setting prefill and decode must share; stamped on both roles' pods."""


class WeightsStatus(StatusModel):
    """One checkpoint staged into the cache volume (the model, or the DSpark draft)."""

    name: Literal["model", "draft"]
    """model (spec.model) | draft (the DSpark draft of speculative decoding)."""
    uri: str | None = None
    """The checkpoint's location, as the spec gives it."""
    revision: str | None = None
    """The branch, tag or commit the spec asks for."""
    commit: str | None = None
    """The commit the revision resolved to when it was staged; serving pods wait for exactly it."""
    phase: Literal["Pending", "Staging", "Staged", "Failed"] | None = None
    """Pending (Job not started) | Staging | Staged | Failed (the Job gave up)."""
    job: str | None = None
    """The staging Job."""
    files_done: int | None = None
    """Files staged and checksummed so far."""
    files_total: int | None = None
    """Files the checkpoint has."""
    bytes_done: int | None = None
    """Bytes staged so far."""
    bytes_total: int | None = None
    """Bytes the checkpoint has."""
    percent: float | None = None
    """bytesDone over bytesTotal, in percent."""
    attempts: int | None = None
    """Pods the Job ran so far (a killed or failed attempt resumes where it stopped)."""
    message: str | None = None
    """Why it failed, or what it is doing."""


class RouterStatus(StatusModel):
    """One router: where it listens and which engines it sends requests to."""

    name: str
    """The router's Deployment (a P/D router runs one per revision that has a pair)."""
    service: str | None = None
    """Its Service: the one endpoint of every revision's router."""
    mode: RouterMode
    """PrefillDecode (prefill, then decode with the KV hand-off) | Aggregated (load balancing)."""
    prefill_policy: RouterPolicy | None = None
    """PrefillDecode: how it picks a prefill engine."""
    decode_policy: RouterPolicy | None = None
    """PrefillDecode: how it picks a decode engine."""
    policy: RouterPolicy | None = None
    """Aggregated: how it picks an engine."""
    endpoint: str | None = None
    """In-cluster URL of the router's Service."""
    replicas: int = 0
    """Desired router replicas: spec.router.replicas, shared between revisions in proportion to
    their routable pairs while a rollout serves both (at least one each)."""
    ready_replicas: int = 0
    """Ready router pods."""
    compatibility_hash: str | None = None
    """PrefillDecode: the revision whose engines it pairs (the hash both roles' leaders carry)."""
    prefill_workers: int | None = None
    """Prefill engines it finds (routable leader pods: Ready, not terminating)."""
    decode_workers: int | None = None
    """Decode engines it finds."""
    aggregated_workers: int | None = None
    """Aggregated engines it finds."""


class KimiK3DeploymentStatus(StatusModel):
    """Observed state, written by the operator only when it changes."""

    observed_generation: int | None = None
    """The spec generation this status describes."""
    phase: Literal["Pending", "Progressing", "Ready", "Degraded", "Failed"] | None = None
    """Summary: Pending | Progressing | Ready | Degraded | Failed."""
    reason: str | None = None
    """Why, in a word: the Degraded condition's reason while it is True, else the Ready condition's
    (a failing replica's CrashLoopBackOff, OOMKilled, ... names the pod in that condition's message)."""
    conditions: Annotated[list[Condition], Field(max_length=16), list_map("type")] = []
    """Ready, Progressing and Degraded, with stable reasons; P/D deployments also Disaggregating
    (whether decode receives its prompts' KV from prefill, measured from the engines' metrics)."""
    pools: Annotated[list[PoolStatus], Field(max_length=16), list_map("name")] = []
    """Per pool: resolved facts and per-role replica counts."""
    endpoint: str | None = None
    """The URL clients send requests to: the router's Service, else (spec.router.replicas 0) a
    role's leader Service."""
    routers: Annotated[list[RouterStatus], Field(max_length=8), list_map("name")] = []
    """The routers and the engines each one finds."""
    routable_capacity_percent: int | None = None
    """The fewest, over the roles, of routed Ready leaders per planned replica, in percent: what the
    routers can send requests to now against what the plan asks (a rollout holds it at 100 or more
    while surge groups can start)."""
    routing: str | None = None
    """Set when no router is rendered: what clients reach instead, and what that costs."""
    engine: EngineStatus | None = None
    """Effective engine settings."""
    ready_summary: str | None = None
    """Ready replicas over desired replicas, across roles ("3/3")."""
    gpus: int | None = None
    """GPUs requested by all roles at the desired replica counts."""
    weights: Annotated[list[WeightsStatus], Field(max_length=2), list_map("name")] = []
    """Staging of the checkpoint and the draft into the cache volume."""
