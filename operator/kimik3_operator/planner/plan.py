"""The Plan: everything the renderer needs, decided; nothing left to guess downstream.

Frozen dataclasses so a plan can be compared, hashed into labels and printed by `kimik3 plan`.
The planning function fills these types; renderers only read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..api import RoleName
from ..api.router_policies import BY_NAME
from ..kimi_k3 import kv_cache_family, ssm_cache_dtype
from .cold_start import ColdStart
from .errors import PlanningError as PlanningError
from .loading import Loading
from .network import NetworkPlan
from .parallel_layout import Layout as Layout
from .placement import Placement
from .pod_resources import PodResources
from .pods import PodsPlan
from .router import RouterPlan
from .scaling import RoleScaling, ScalingSettings
from .timeouts import StartupTimeouts
from .vision import VisionEncoder
from .weights import WeightsPlan


@dataclass(frozen=True)
class TracingSettings:
    """engine.tracing as the engines get it: flags and OTEL_* variables (render/engine.py)."""

    endpoint: str
    protocol: str
    sampling_ratio: float
    detailed: tuple[str, ...] = ()


@dataclass(frozen=True)
class EngineSettings:
    """vLLM settings shared by every role of a deployment; the values that must match between
    prefill and decode live here so one hash covers them."""

    model_path: str
    served_name: str
    max_model_len: int | None
    kv_cache_dtype: str
    kda_state_dtype: str
    prefix_caching: bool
    retention_policy: str
    retention_interval: int | None
    """--prefix-cache-retention-interval as rendered (a multiple of every role's block size);
    None renders dense retention."""
    speculative_config: Mapping[str, Any] | None
    rust_frontend: bool
    draft_path: str | None = None
    retention_requested: int | None = None
    """The interval the spec asked for, before rounding to the block size."""
    retention_granularity: int | None = None
    """The least common multiple of the roles' block sizes: what the interval must divide by."""
    tool_calling: bool = True
    reasoning: bool = True
    mm_limits: tuple[tuple[str, int], ...] = ()
    """--limit-mm-per-prompt entries, e.g. (("image", 4),)."""
    media_domains: tuple[str, ...] = ()
    """Hosts an engine may fetch image URLs from; none: no URL is fetched."""
    media_fetch_timeout: int | None = None
    """Seconds an engine waits for one image URL (vLLM's default when None)."""
    max_request_body: int | None = None
    """Bytes of request body the Rust frontend takes (vLLM's 32 MiB when None)."""
    shutdown_timeout: int = 300
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    commits: tuple[tuple[str, str], ...] = ()
    """(source, commit) of the staged checkpoints: both roles must serve the same weights."""
    chat_template: tuple[str, str] | None = None
    """(ConfigMap, key) of engine.chatTemplate."""
    tracing: TracingSettings | None = None
    """engine.tracing; None: no trace is exported."""

    @property
    def kv_dtype_family(self) -> str:
        return kv_cache_family(self.kv_cache_dtype)

    @property
    def ssm_dtype(self) -> str:
        return ssm_cache_dtype(self.kda_state_dtype)

    @property
    def speculative_tokens(self) -> int:
        return int((self.speculative_config or {}).get("num_speculative_tokens", 0))

    def pd_contract(self) -> dict[str, Any]:
        """What prefill and decode must agree on for NIXL to hand over MLA KV and KDA state:
        the model and draft paths, KV cache dtype, prefix caching and retention (the KDA
        checkpoint layout), and the speculative config (hashed by vLLM's NIXL handshake)."""
        return {
            "model_path": self.model_path,
            "draft_path": self.draft_path,
            "kv_cache_dtype": self.kv_cache_dtype,
            "kda_state_dtype": self.kda_state_dtype,
            "max_model_len": self.max_model_len,
            "prefix_caching": self.prefix_caching,
            "retention_interval": self.retention_interval,
            "speculative_config": dict(self.speculative_config) if self.speculative_config else None,
            **({"commits": dict(self.commits)} if self.commits else {}),
        }


@dataclass(frozen=True)
class RdmaPlan:
    """How a pool's pods reach its RDMA NICs (fabric.py): spec.pools[].rdma over the nodes' facts."""

    resource: str | None = None
    """The NICs' extended resource; None when neither the spec nor the nodes name one."""
    nics_per_gpu: int = 1
    shared: bool = False
    """A shared RDMA device (one unit grants every HCA of the node): each pod requests one."""
    hcas: tuple[str, ...] = ()
    gid_index: int | None = None
    env: tuple[tuple[str, str], ...] = ()
    """pools[].rdma.env, in the spec's order."""

    def nics(self, gpus: int) -> int:
        """Units a pod holding `gpus` GPUs requests."""
        return 0 if self.resource is None else 1 if self.shared else self.nics_per_gpu * gpus


@dataclass(frozen=True)
class EngineShape:
    """A role's scheduler, CUDA-graph and EPLB flags (shaping.py); None leaves vLLM's default."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_cudagraph_capture_size: int | None = None
    long_prefill_token_threshold: int | None = None
    eplb_redundant_experts: int | None = None
    """Redundant experts per MoE layer across the EP group; None: EPLB off."""


@dataclass(frozen=True)
class RolePlan:
    role: RoleName
    replicas: int
    layout: Layout
    gpus_per_pod: int
    """GPUs each pod requests: the node's GPUs when a replica spans nodes."""
    nodes_per_replica: int
    """Pods per replica = LeaderWorkerSet group size."""
    all2all_backend: str | None = None
    moe_backend: str | None = None
    compute_domain: bool = False
    """Multi-node NVLink replica that needs a DRA ComputeDomain."""
    group_topology_key: str | None = None
    """Node label every pod of one replica must share (the NVLink clique on NVL72 racks)."""
    crosses_rdma: bool = False
    """The replica's GPUs talk over RDMA between nodes (HGX multi-node)."""
    expert_dispatch: str | None = None
    """What really moves tokens to the experts: the all-to-all backend, or the MoE kernel when it
    dispatches itself (deep_gemm_mega_moe)."""
    kv_transport: str | None = None
    """Prefill/decode: NVLink (multi-node NVLink, a ComputeDomain shared with the paired role) or RDMA."""
    shared_compute_domain: bool = False
    """The role claims the deployment's one KV ComputeDomain instead of its own."""
    rdma_nics: int = 0
    """RDMA NIC units each pod requests (0: the pod's traffic stays on NVLink)."""
    rdma_resource: str | None = None
    block_size: int | None = None
    """The KV block size vLLM aligns to for this role's tensor parallel size (blocks.py)."""
    replicas_source: str = "spec"
    """Where `replicas` came from: spec | workload (rate matching) | default."""
    predicted: Mapping[str, float] = field(default_factory=dict)
    autoscaling: RoleScaling | None = None
    """Set when a scaler owns the replica count; `replicas` is then only where it starts."""
    shape: EngineShape | None = None
    placement: Placement = field(default_factory=Placement)
    """Where its pods may run: the pool's selector and tolerations, the GPU taints', the role's scheduling."""
    queue: str | None = None
    """The Kueue LocalQueue that admits its groups (spec queueName); None: not queued."""
    """Scheduler, CUDA-graph and EPLB settings of this role (shaping.py)."""
    pod_resources: PodResources | None = None
    """CPU, memory and ephemeral storage of each pod (requests = limits); pod_resources.py."""
    loading: Loading | None = None
    """How its engines read the weights; loading.py."""
    cold_start: ColdStart | None = None
    """Predicted time to Ready of a new replica, and its parts; cold_start.py."""
    vision_encoder: VisionEncoder = "weights"
    """How its engines run the vision tower: off | weights | data (vision.py)."""
    timeouts: StartupTimeouts | None = None
    """Start-up and collective deadlines around the cold start; timeouts.py."""

    @property
    def gpus_per_replica(self) -> int:
        return self.layout.gpus

    @property
    def uses_rdma(self) -> bool:
        """The pod's traffic leaves its NVLink domain: a replica over RDMA, or KV over RDMA."""
        return self.crosses_rdma or self.kv_transport == "RDMA"

    @property
    def rdma_request(self) -> str | None:
        return f"{self.rdma_nics} x {self.rdma_resource}" if self.rdma_nics and self.rdma_resource else None

    @property
    def load_format(self) -> str | None:
        return self.loading.loader.load_format if self.loading else None

    @property
    def expert_weight_filter(self) -> bool | None:
        return self.loading.expert_filter if self.loading else None

    @property
    def cold_start_fields(self) -> dict[str, object] | None:
        """What status and `kimik3 plan` show of cold_start."""
        return self.cold_start.fields() if self.cold_start else None

    @property
    def pod_resources_fields(self) -> dict[str, str] | None:
        """What status and `kimik3 plan` show of pod_resources."""
        if self.pod_resources is None:
            return None
        return {"cpu": self.pod_resources.cpu, "memory": self.pod_resources.memory,
                "ephemeralStorage": self.pod_resources.ephemeral_storage, "source": self.pod_resources.source}


@dataclass(frozen=True)
class PoolPlan:
    name: str
    gpu_product: str | None
    interconnect: str
    gpus_per_node: int
    gpu_resource: str
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    image: str
    roles: tuple[RolePlan, ...]
    rdma: RdmaPlan = RdmaPlan()
    vendor: str = "nvidia"
    arch: str = "amd64"


@dataclass(frozen=True)
class Plan:
    pools: tuple[PoolPlan, ...]
    engine: EngineSettings
    compat_hash: str
    """Hash over every setting prefill and decode must share; stamped on both roles."""
    weights: WeightsPlan
    """What the staging Jobs fetch and where serving pods find it."""
    max_surge: int = 1
    max_unavailable: int = 0
    """The rolling update of every role (spec.rollout), in replicas."""
    routers: tuple[RouterPlan, ...] = ()
    """The routers in front of the roles; none when spec.router.replicas is 0."""
    scaling: ScalingSettings | None = None
    """Deployment-wide autoscaling settings; None when no role is autoscaled."""
    network: NetworkPlan | None = None
    """Who may connect to the pods (NetworkPolicies); None: no policy."""
    pods: PodsPlan | None = None
    """Labels, annotations and pull secrets every pod carries (spec.pods); None: none."""

    def role_plans(self) -> list[tuple[PoolPlan, RolePlan]]:
        return [(pool, role) for pool in self.pools for role in pool.roles]

    def router_tokenizes(self, pool: str, role: str) -> bool:
        """A router in front of this role picks its engines by the prompt's tokens (CacheAware: the
        `tokenizes` column of api/router_policies.py), which needs the token ids from the engines.

        vllm-router 0.1.17's cache_aware policy POSTs `{route}/render` to every candidate engine and
        falls back to `/tokenize` only on 404/405/501 (src/backend/preprocess.rs:179-316; a 403 is
        final, :306-311; docs/vllm-facts.md §8). vLLM 0.33.0 answers the render routes 403 unless
        `vllm serve --enable-scale-out` (vllm/entrypoints/scale_out/factories.py:87-127, flag at
        entrypoints/common/cli_args.py:216-221); with it the Python frontend serves /render and the
        Rust frontend answers 501 and serves /tokenize (tests/contract/test_simulator_rs_frontend.py
        runs the wheel's vllm-rs). Without the flag every request is routed least-loaded."""
        return any((pool, role) in r.routes and BY_NAME[policy].tokenizes
                   for r in self.routers for kind, policy in r.policies if kind == role)

    def publishes_kv_events(self, pool: str, role: str) -> bool:
        """A router in front of this role follows its engines' caches by their KV events (PrecisePrefix:
        the `kv_events` column of api/router_policies.py), so the engines publish them."""
        return any((pool, role) in r.routes and BY_NAME[policy].kv_events
                   for r in self.routers for kind, policy in r.policies if kind == role)

    @property
    def gpus(self) -> int:
        return sum(r.replicas * r.gpus_per_replica for _, r in self.role_plans())
