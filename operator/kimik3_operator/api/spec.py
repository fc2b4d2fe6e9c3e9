"""The spec of KimiK3Deployment v1alpha1: what users write, the public contract their manifests rely on.

Field names are the published ones (docs/architecture.md, "The API"); the CRD in crds/ is generated from
these models (`kimik3 crd`), so attribute docstrings here are what `kubectl explain` prints. The status
the operator writes is in status.py; the resource itself (kind, version, both halves) in v1alpha1.py.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import Field, create_model

from ..contract import uri as model_uri
from ..contract.names import OPERATOR_POD_LABELS, RESERVED_POD_KEY_PREFIXES, reserved_pod_key
from ..gpus import PRODUCTS as GPU_PRODUCTS
from ..gpus import products_with
from ..kimi_k3 import KDA_HEADS, MAX_MODEL_LEN
from . import role_settings, router_policies
from .base import Rule, SpecModel, list_map
from .owned_flags import CEL_FLAG_NAME, OWNED_FLAGS, cel_option_in, cel_owned, owned_flag, owner_of
from .quantity import PATTERN as QUANTITY_PATTERN
from .quantity import quantity
from .rust_frontend_flags import RUST_FRONTEND_REFUSED, rust_frontend_refuses
from .vllm_env import KNOWN_VLLM_ENV, VLLM_VERSION

RoleName = Literal["prefill", "decode", "aggregated"]
RouterMode = Literal["PrefillDecode", "Aggregated"]
ROLE_NAMES: tuple[RoleName, ...] = ("prefill", "decode", "aggregated")

if TYPE_CHECKING:
    GpuProduct = str
else:  # the enum is the GPU table's products (gpus.py), in its order, after Auto
    GpuProduct = Literal[("Auto", *GPU_PRODUCTS)]
XGMI_PRODUCTS = products_with("xGMI")
"""AMD Instinct products, whose boards are joined by xGMI rather than NVLink."""
Interconnect = Literal["Auto", "NVLink", "RDMA", "xGMI"]
PoolMode = Literal["Disaggregated", "Aggregated"]

# Choices of vLLM 0.33.0's argument parser (config/parallel.py All2AllBackend, config/kernel.py
# MoEBackend), minus `passthrough`, which argparse rejects. The planner narrows them per GPU.
All2AllBackend = Literal[
    "allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency", "deepep_v2",
    "flashinfer_all2allv", "flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided", "moonep",
    "mori_high_throughput", "mori_low_latency", "naive", "nixl_ep", "pplx",
]
MoeBackend = Literal[
    "aiter", "aiter_mega_moe", "aiter_triton_mxfp4_bf16", "aiter_triton_mxfp4_mxfp4", "auto", "b12x",
    "batched_triton", "cutlass", "deep_gemm", "deep_gemm_mega_moe", "emulation", "flashinfer_b12x",
    "flashinfer_cutedsl", "flashinfer_cutlass", "flashinfer_moe_ep_cutedsl",
    "flashinfer_moe_ep_mega_deep_gemm", "flashinfer_trtllm", "flydsl", "hpc", "humming", "marlin",
    "rdna3", "triton", "triton_unfused",
]

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DnsLabel = Annotated[str, Field(min_length=1, max_length=40, pattern=DNS_LABEL)]
ShortString = Annotated[str, Field(max_length=253)]
LabelValue = Annotated[str, Field(max_length=63)]
Quantity = Annotated[str, Field(max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?([KMGTPE]i?|[mkMGTPE])?$")]
ResourceQuantity = Annotated[str, Field(max_length=32, pattern=QUANTITY_PATTERN)]
"""A CPU or memory amount, or a rate in bytes per second: 500m, 2, 1Gi, 1.5G."""
ImageRef = Annotated[str, Field(max_length=512)]
ModelUri = Annotated[str, Field(max_length=model_uri.MAX_LENGTH, pattern=model_uri.PATTERN)]
"""What the stager stages: the Hub, S3, or a claim in place. The grammar is the stager's own
(contract/uri.py); what a pattern cannot say is in `model_uri_rules`."""
EndpointUrl = Annotated[str, Field(max_length=512, pattern=r"^https?://[^\t\n\v\f\r /]+(/[^\t\n\v\f\r ]*)?$")]
"""No whitespace, spelled out: `\\s` is ASCII in the API server's Go regexp but Unicode in pydantic's."""
EnvName = Annotated[str, Field(max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
ROUTER_TRACES_URL = re.compile(r"^http://([^\t\n\v\f\r /@?#:\[\]]+|\[[0-9A-Fa-f:.]+\])(:" + _PORT
                               + r")?(/[^\t\n\v\f\r ]*)?$")
RouterTracesUrl = Annotated[str, Field(max_length=512, pattern=ROUTER_TRACES_URL.pattern)]
"""kimik3-router's --otlp-traces-endpoint as it takes one (router/src/config.rs): plain HTTP, a host or
[IPv6] and an optional port 1-65535, no user info, query or fragment."""


def model_uri_rules(field: str, attribute: str, *, optional: bool = False) -> tuple[Rule, ...]:
    """The model-URI refusals a pattern cannot express (contract/uri.py RULES), as Rules of the
    model that holds the URI in `field` (wire name) / `attribute` (Python name)."""
    guard = f"!has(self.{field}) || " if optional else ""
    def check(holds: Callable[[str], bool]) -> Callable[[Any], bool]:
        return lambda m: getattr(m, attribute) is None or holds(getattr(m, attribute))

    return tuple(Rule(cel=guard + rule.cel.format(uri=f"self.{field}"), message=rule.message,
                      field_path=f".{field}", check=check(rule.holds))
                 for rule in model_uri.RULES)


def not_a_flag(field: str, attribute: str, what: str) -> Rule:
    """A name the renderer passes as the value of a flag: one starting with '-' would be read as a
    flag of its own (vLLM's and the stager's parsers take `--served-model-name --x` as two options)."""
    return Rule(cel=f"!has(self.{field}) || !self.{field}.startsWith('-')",
                message=f"{field} is {what}, not a flag: it must not start with '-'",
                check=lambda m: not getattr(m, attribute).startswith("-"), field_path=f".{field}")


class SecretKeyRef(SpecModel):
    """A key in a Secret of the deployment's namespace."""

    name: ShortString
    """Secret name."""
    key: ShortString = "token"
    """Key inside the Secret."""


class ConfigMapKeyRef(SpecModel):
    """A key in a ConfigMap of the deployment's namespace."""

    name: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]
    """ConfigMap name."""
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")]
    """Key inside the ConfigMap."""


LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
"""A label key: an optional DNS-subdomain prefix and a name (meta/v1 validation)."""
LabelKey = Annotated[str, Field(min_length=1, max_length=317, pattern=LABEL_KEY)]


class Toleration(SpecModel):
    """A pod toleration (the core/v1 fields)."""

    key: ShortString | None = None
    """Taint key; empty with operator Exists tolerates everything."""
    operator: Literal["Exists", "Equal"] | None = None
    """Exists | Equal (default Equal)."""
    value: LabelValue | None = None
    """Taint value for operator Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; all effects when empty."""
    toleration_seconds: Annotated[int, Field(ge=-(1 << 53), le=1 << 53)] | None = None
    """How long a NoExecute taint is tolerated."""  # bounds a float64 holds exactly, as the API server compares them


class NodeSelectorRequirement(SpecModel):
    """One matchExpressions entry of a node selector term (core/v1)."""

    key: LabelKey
    """Node label key."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    """In | NotIn (values needed) | Exists | DoesNotExist (no values) | Gt | Lt (one integer value)."""
    values: Annotated[list[LabelValue], Field(max_length=64)] = []
    """Label values: for In and NotIn, or the one integer of Gt and Lt."""

    rules = (
        Rule(cel="(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
             message="a node selector requirement has values exactly when its operator is In or NotIn, "
                     "or one integer value for Gt and Lt",
             check=lambda r: r.operator in ("Gt", "Lt") or (r.operator in ("In", "NotIn")) == bool(r.values)),
        Rule(cel="!(self.operator in ['Gt', 'Lt']) || (has(self.values) && size(self.values) == 1 "
                 "&& self.values[0].matches('^-?[0-9]+$'))",
             message="Gt and Lt take exactly one integer value",
             check=lambda r: r.operator not in ("Gt", "Lt") or (
                 len(r.values) == 1 and re.fullmatch(r"-?[0-9]+", r.values[0]) is not None)),
    )


class NodeSelectorTerm(SpecModel):
    """Requirements that must all hold on a node (core/v1 NodeSelectorTerm, matchExpressions only)."""

    match_expressions: Annotated[list[NodeSelectorRequirement], Field(min_length=1, max_length=16)]
    """The requirements, ANDed."""


class RequiredNodeSelector(SpecModel):
    """Terms of which a node must match at least one (core/v1 NodeSelector)."""

    node_selector_terms: Annotated[list[NodeSelectorTerm], Field(min_length=1, max_length=8)]
    """The terms, ORed."""


class PreferredSchedulingTerm(SpecModel):
    """A node preference and its weight (core/v1)."""

    weight: Annotated[int, Field(ge=1, le=100)]
    """Added to a node's score when it matches."""
    preference: NodeSelectorTerm
    """What a preferred node matches."""


class NodeAffinity(SpecModel):
    """Node affinity as core/v1 spells it, ANDed with the pool's nodeSelector."""

    required_during_scheduling_ignored_during_execution: RequiredNodeSelector | None = None
    """Nodes the pods may only run on. Planning refuses a role whose pool has no node matching it."""
    preferred_during_scheduling_ignored_during_execution: Annotated[
        list[PreferredSchedulingTerm], Field(max_length=8)] = []
    """Nodes the scheduler prefers."""


class Scheduling(SpecModel):
    """How the cluster's scheduler places these pods, on top of what the planner requires (the
    pool's nodeSelector, the GPU taints' tolerations, the NVLink clique and ComputeDomain affinity)."""

    priority_class_name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)] | None = None
    """A PriorityClass of the cluster; its pods may preempt lower ones and are preempted by higher."""
    scheduler_name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)] | None = None
    """A scheduler other than the default (a gang scheduler such as Volcano or KAI for multi-node groups)."""
    tolerations: Annotated[list[Toleration], Field(max_length=16)] = []
    """Tolerations beside the pool's (or the router's) own and the GPU taints'."""
    node_affinity: NodeAffinity | None = None
    """Node affinity, ANDed with the nodeSelector."""


class Staging(SpecModel):
    """The staging Jobs that download the checkpoint into the cache volume (or verify a pvc:// one)."""

    scheduling: Scheduling | None = None
    """Priority class, scheduler, tolerations and node affinity of their pods (they need no GPU)."""


class ModelCache(SpecModel):
    """The shared volume the weights are staged into once (~1.6 TB for Kimi K3)."""

    storage_class_name: ShortString | None = None
    """StorageClass of the ReadWriteMany claim; the cluster default when omitted."""
    size: Quantity = "2Ti"
    """Requested size of the claim."""
    retention_policy: Literal["Retain", "Delete"] = "Retain"
    """What happens to the claim (<name>-model-cache) and the staged weights when the deployment is
    deleted, as StatefulSet's persistentVolumeClaimRetentionPolicy: Retain keeps it (no owner
    reference; a deployment re-created under the same name adopts it and verifies what is staged
    instead of downloading again; delete it by hand to free the space), Delete lets garbage
    collection remove it with the deployment, and prunes it once no checkpoint needs it. A deployment
    whose checkpoints are all pvc:// has no such claim; its compile-cache claim (<name>-compile-cache)
    follows the same policy."""


MIN_READ_THROUGHPUT = "10M"
"""Below this a weights read of ~1.6 TB takes days: a unit slip (1 for 1G), not a storage."""
MAX_READ_THROUGHPUT = "10T"
"""Beyond what any node reads (a GB300 tray's PCIe and NICs move well under 1T per second); status
keeps it as an integer, which the API server holds to 2^53."""


class ModelSource(SpecModel):
    """Where the checkpoint comes from and how it is served."""

    uri: ModelUri
    """Checkpoint location: hf://org/name, s3://bucket/prefix or pvc://claim/path (a claim of this
    namespace that already holds the checkpoint; it is verified in place)."""
    revision: Annotated[str, Field(max_length=128)] = "main"
    """Branch, tag or commit of the checkpoint (hf:// only). A branch is resolved to a commit once,
    when staging; status.weights shows it and a moved branch is not followed until this changes."""
    served_name: Annotated[str, Field(max_length=128)] = "kimi-k3"
    """Model name clients send in requests (--served-model-name)."""
    auth_secret_ref: SecretKeyRef | None = None
    """Secret to read the checkpoint with, given only to the staging Jobs and never rendered into
    arguments: for hf:// the key holds the Hub token; for s3:// the Secret's keys (AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION) become the Job's environment."""
    cache: ModelCache | None = None
    """Shared weights volume; omitted means the default claim settings."""
    staging: Staging | None = None
    """How the staging Jobs' pods are scheduled."""
    loading: Literal["Auto", "InstantTensor", "Safetensors"] = "Auto"
    """How engines read the weights (--load-format). Safetensors (what Auto picks): memory-mapped
    reads per rank, on any file system. InstantTensor: vLLM 0.33.0's direct-I/O loader, which
    spreads a replica's reads over its pods; NVIDIA only, and the cache volume's file system must
    support O_DIRECT (not every FUSE mount does), else the engines fail at start. Under expert
    parallelism without EPLB either reads only the experts each rank holds. status.pools[].roles[]
    shows the choice, docs/loading.md why."""
    read_throughput: ResourceQuantity | None = None
    """Bytes per second one node reads the weights at from their volume (the cache claim, or the
    pvc:// claim): about 1G for an NFS-class ReadWriteMany share (the default), 10G and more for a
    parallel file system or local NVMe. The predicted cold start of each role
    (status.pools[].roles[].coldStart), the start-up deadlines and the SLO scaler's lead time follow it."""
    endpoint: EndpointUrl | None = None
    """Hub or S3 endpoint to download from (a mirror, a private S3 service); rendered as HF_ENDPOINT
    or AWS_ENDPOINT_URL_S3 for the staging Jobs only. Default: the public Hub / AWS. Must be https://
    unless allowInsecureEndpoint is set: the Hub token or the S3 credentials are sent to it."""
    allow_insecure_endpoint: bool = False
    """Allow a plain http:// endpoint (a mirror or S3 service inside the cluster network), accepting
    that the credentials and the weights cross the network unencrypted."""

    rules = (
        *model_uri_rules("uri", "uri"),
        Rule(
            cel="!has(self.endpoint) || self.endpoint.startsWith('https://') "
                "|| (has(self.allowInsecureEndpoint) && self.allowInsecureEndpoint)",
            message="endpoint must be https:// (set allowInsecureEndpoint to allow plain http://)",
            field_path=".endpoint",
            check=lambda m: m.endpoint is None or m.endpoint.startswith("https://") or m.allow_insecure_endpoint,
        ),
        Rule(
            cel=(f"!has(self.readThroughput) "
                 f"|| (quantity(self.readThroughput).compareTo(quantity('{MIN_READ_THROUGHPUT}')) >= 0 "
                 f"&& quantity(self.readThroughput).compareTo(quantity('{MAX_READ_THROUGHPUT}')) <= 0)"),
            message=f"readThroughput is bytes per second a node reads the weights at: from {MIN_READ_THROUGHPUT} to "
                    f"{MAX_READ_THROUGHPUT} (1G is an NFS-class share)",
            field_path=".readThroughput",
            check=lambda m: m.read_throughput is None
            or quantity(MIN_READ_THROUGHPUT) <= quantity(m.read_throughput) <= quantity(MAX_READ_THROUGHPUT),
        ),
        not_a_flag("servedName", "served_name", "the model's name"),
        not_a_flag("revision", "revision", "a branch, tag or commit"),
    )


class Retention(SpecModel):
    """How long KDA recurrent state is kept for prefix-cache reuse.

    Interval checkpoints every intervalTokens (and at prompt boundaries); Selective keeps state
    only where prefixes are really shared (Marconi-style); Dense keeps state at every block.
    """

    policy: Literal["Interval", "Selective", "Dense"] = "Selective"
    """Interval | Selective | Dense."""
    interval_tokens: Annotated[int, Field(ge=1, le=1 << 24)] | None = None
    """Checkpoint spacing in tokens; required for Interval, forbidden otherwise."""

    rules = (
        Rule(
            cel="self.policy != 'Interval' || has(self.intervalTokens)",
            message="retention policy Interval needs intervalTokens",
            check=lambda r: r.policy != "Interval" or r.interval_tokens is not None,
        ),
        Rule(
            cel="self.policy == 'Interval' || !has(self.intervalTokens)",
            message="intervalTokens applies only to retention policy Interval",
            check=lambda r: r.policy == "Interval" or r.interval_tokens is None,
        ),
    )


class PrefixCaching(SpecModel):
    """Prefix caching across paged MLA KV and KDA state (always rendered explicitly)."""

    enabled: bool = True
    """Render --enable-prefix-caching (true) or --no-enable-prefix-caching (false)."""
    retention: Retention = Retention()
    """KDA state retention policy."""


class Speculative(SpecModel):
    """Speculative decoding."""

    method: Literal["DSpark", "MTP"] = "DSpark"
    """DSpark (block-diffusion draft model) or MTP (the checkpoint's own MTP layers)."""
    num_speculative_tokens: Annotated[int, Field(ge=1, le=16)] = 7
    """Draft tokens proposed per step."""
    draft_model_uri: ModelUri | None = None
    """Checkpoint of the DSpark draft (K3DSparkModel); required for DSpark, since vLLM would
    otherwise pick another model's draft class."""

    rules = (
        Rule(
            cel="self.method != 'DSpark' || has(self.draftModelUri)",
            message="speculative method DSpark needs draftModelUri (a K3DSparkModel checkpoint)",
            check=lambda s: s.method != "DSpark" or s.draft_model_uri is not None,
        ),
        *model_uri_rules("draftModelUri", "draft_model_uri", optional=True),
    )


MediaHost = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
"""A host as vLLM compares an image URL's to its allowed ones: lower case, no scheme, port or wildcard."""


class Multimodal(SpecModel):
    """Image inputs (Kimi K3 takes images only): how many per prompt, and where an engine may fetch
    an image URL from. A prompt's URL is user input, and an engine that fetches any URL reaches
    whatever its pod can (cluster Services, a cloud's metadata address): by default none is fetched
    (docs/multimodal.md)."""

    max_images_per_prompt: Annotated[int, Field(ge=0, le=256)] | None = None
    """Images per prompt (--limit-mm-per-prompt); 0 turns image input off."""
    allowed_media_domains: Annotated[list[MediaHost], Field(max_length=32)] = []
    """With the Python frontend (engine.rustFrontend: false): hosts the engines may fetch http(s)
    image URLs from (--allowed-media-domains), exactly as vLLM compares them: the URL's host (a name
    or an IPv4 literal), no wildcard. Empty (the default): no image URL is fetched, images come
    inline as data: URLs. Redirects are never followed (vLLM checks only the first URL's host). The
    Rust frontend has a policy of its own (docs/multimodal.md)."""
    fetch_timeout_seconds: Annotated[int, Field(ge=1, le=30)] | None = None
    """With the Python frontend: the first attempt's timeout for one image URL
    (VLLM_IMAGE_FETCH_TIMEOUT; vLLM's 5 s when omitted). vLLM retries a timeout or a 5xx up to 3
    times, each attempt waiting 4x the last (multimodal/media/connections.py)."""


OWNED_ENV = ("POD_IP", "VLLM_HOST_IP", "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT",
             "VLLM_SSM_CONV_STATE_LAYOUT", "VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_RUST_FRONTEND",
             "VLLM_ENGINE_READY_TIMEOUT_S", "VLLM_KIMI_K3_SHARD_SP_SHARED_EXPERT", "VLLM_ROCM_USE_AITER",
             "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "DG_JIT_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE",
             "VLLM_MEDIA_URL_ALLOW_REDIRECTS", "VLLM_IMAGE_FETCH_TIMEOUT", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
             "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
             "OTEL_SERVICE_NAME")
"""Variables the renderer sets (a repeat would silently win: Kubernetes takes the last one), and the
Hub token, which belongs in model.authSecretRef."""
OWNED_ENV_CEL = "[" + ", ".join(f"'{n}'" for n in OWNED_ENV) + "]"
_KNOWN_VLLM_ENV_CEL = "{" + ", ".join(f"'{n}': true" for n in sorted(KNOWN_VLLM_ENV)) + "}"
_UNKNOWN_VLLM_ENV_CEL = f"e.name.startsWith('VLLM_') && !(e.name in {_KNOWN_VLLM_ENV_CEL})"


def unknown_vllm_env(names: list[str]) -> str | None:
    """The first VLLM_* name vLLM would refuse under --fail-on-environ-validation (vllm_env.py)."""
    return next((n for n in names if n.startswith("VLLM_") and n not in KNOWN_VLLM_ENV), None)


class EnvVar(SpecModel):
    """A plain environment variable for the serving containers."""

    name: EnvName
    """Variable name."""
    value: Annotated[str, Field(max_length=4096)] = ""
    """Literal value (secrets belong in model.authSecretRef, never here)."""


class Tracing(SpecModel):
    """OpenTelemetry traces from the engines (vLLM's --otlp-traces-endpoint; vllm/tracing/otel.py): a
    span per request, joined to the client's trace by the traceparent header the router passes on.
    Needs the Python frontend (rustFrontend: false): vLLM's Rust frontend exits at start on the flag.
    docs/tracing.md has a collector recipe."""

    endpoint: EndpointUrl
    """Where the engines export spans, e.g. http://otel-collector.monitoring:4317 (OTLP/gRPC) or
    http://otel-collector.monitoring:4318/v1/traces (OTLP/HTTP)."""
    protocol: Literal["grpc", "http/protobuf"] = "grpc"
    """OTLP's transport (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL): vLLM exports gRPC without TLS, or
    protobuf over HTTP."""
    sampling_ratio: Annotated[float, Field(ge=0, le=1)] = 0.1
    """Share of traces started here that are kept (OTEL_TRACES_SAMPLER=parentbased_traceidratio): a
    request that arrives with a sampled traceparent is always traced."""
    detailed: Annotated[list[Literal["model", "worker", "all"]], Field(max_length=3)] = []
    """vLLM's --collect-detailed-traces: per-step timing of the model or worker (costly: it
    synchronises the GPU on every step); none when empty."""
    router_endpoint: RouterTracesUrl | None = None
    """Where kimik3-router posts its own spans (OTLP/HTTP, JSON encoding, plain HTTP), e.g.
    http://otel-collector.monitoring:4318/v1/traces. Default: `endpoint` when protocol is
    http/protobuf over http://; with gRPC and none, the router exports nothing and still passes each
    leg a traceparent. vllm-router exports no spans."""

    @property
    def router_traces_url(self) -> str | None:
        if self.router_endpoint:
            return self.router_endpoint
        plain = self.protocol == "http/protobuf" and ROUTER_TRACES_URL.fullmatch(self.endpoint) is not None
        return self.endpoint if plain else None


_CEL_RUST_REFUSED = cel_option_in("n", RUST_FRONTEND_REFUSED)
_RUST_REFUSED_MESSAGE = (f"extraArgs sets an option the Rust frontend of vLLM {VLLM_VERSION} does not implement (it "
                         "exits at start on it); remove it or set rustFrontend: false")


class Engine(SpecModel):
    """vLLM engine settings shared by every pool and role."""

    image: ImageRef | None = None
    """Serving image; the project's pinned vLLM 0.33.0 image when omitted."""
    max_model_len: Annotated[int, Field(ge=1, le=MAX_MODEL_LEN)] | None = None
    """Context length (--max-model-len); the checkpoint's own limit when omitted."""
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_ds_mla"] | None = None
    """--kv-cache-dtype for the MLA layers: auto (BF16) or fp8 (= fp8_e4m3); fp8 halves KV memory.
    fp8_ds_mla is refused (InvalidSpec): it is the sparse-MLA format, which no dense MLA backend of
    vLLM 0.33.0 stores (docs/pd-handoff.md). When omitted, fp8 where every pool is an NVIDIA
    Blackwell GPU (as peers' Kimi K3 recipes serve it), else auto; status shows the value used.
    Prefill and decode always share it (it enters vLLM's NIXL compatibility hash)."""
    kda_state_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """--mamba-ssm-cache-dtype for the KDA recurrent state: auto (float32) or bfloat16, which
    halves the state and the block size vLLM aligns to."""
    rust_frontend: bool = True
    """Serve HTTP with vLLM's Rust frontend (VLLM_USE_RUST_FRONTEND=1, leader pods only)."""
    prefix_caching: PrefixCaching = PrefixCaching()
    """Prefix caching and KDA state retention."""
    speculative: Speculative | None = None
    """Speculative decoding; off when omitted."""
    tracing: Tracing | None = None
    """OpenTelemetry traces from the engines; none when omitted."""
    tool_calling: bool = True
    """Kimi K3 tool calls: --tool-call-parser kimi_k3 --enable-auto-tool-choice."""
    reasoning: bool = True
    """Separate reasoning content: --reasoning-parser kimi_k3."""
    multimodal: Multimodal | None = None
    """Multimodal input limits; vLLM's defaults when omitted."""
    shutdown_timeout_seconds: Annotated[int, Field(ge=0, le=3600)] = 300
    """How long a terminating pod drains in-flight requests (--shutdown-timeout)."""
    extra_args: Annotated[list[Annotated[str, Field(max_length=1024)]], Field(max_length=64)] = []
    """Extra vLLM arguments; flags the operator renders itself are rejected."""
    env: Annotated[list[EnvVar], Field(max_length=64), list_map("name")] = []
    """Extra environment variables for serving containers (not those the operator sets)."""
    chat_template: ConfigMapKeyRef | None = None
    """A Jinja chat template replacing the checkpoint's (--chat-template), from a ConfigMap key
    mounted read-only into the leader pods. The operator compiles it as vLLM does (jinja2's
    sandboxed environment) before any engine starts on it: a template that does not compile, or a
    missing ConfigMap or key, is reported in status (ChatTemplateInvalid) and engines keep the
    template they run."""

    rules = (
        Rule(
            cel=f"!has(self.env) || !self.env.exists(e, e.name in {OWNED_ENV_CEL})",
            message="env sets a variable the operator owns: " + ", ".join(OWNED_ENV),
            check=lambda s: not any(e.name in OWNED_ENV for e in s.env),
            field_path=".env",
        ),
        Rule(
            cel=f"!has(self.env) || !self.env.exists(e, {_UNKNOWN_VLLM_ENV_CEL})",
            # No messageExpression naming the variable: filtering 64 names against 303 is over the
            # API server's CEL cost budget (the map literal keeps the rule itself within it); the
            # webhook's message (explain) names it.
            message=f"env sets a VLLM_* variable vLLM {VLLM_VERSION} does not know (it would refuse to start)",
            explain=lambda e: (f"env sets a VLLM_* variable vLLM {VLLM_VERSION} does not know (it would refuse "
                               f"to start): {unknown_vllm_env([v.name for v in e.env])}"),
            check=lambda e: unknown_vllm_env([v.name for v in e.env]) is None,
            field_path=".env",
        ),
        Rule(
            cel=f"!has(self.extraArgs) || !self.extraArgs.map(a, {CEL_FLAG_NAME}).exists(n, {cel_owned('n')})",
            message="extraArgs sets a flag the operator owns",
            message_expression=(
                "'extraArgs sets a flag the operator owns: ' + "
                f"self.extraArgs.map(a, {CEL_FLAG_NAME}).filter(n, {cel_owned('n')})[0]"),
            explain=lambda e: (f"extraArgs sets a flag the operator owns: {owned_flag(e.extra_args)} "
                               f"(set by {OWNED_FLAGS.get(owner_of(owned_flag(e.extra_args) or '') or '')})"),
            check=lambda e: owned_flag(e.extra_args) is None,
            field_path=".extraArgs",
        ),
        Rule(
            cel=(f"!self.rustFrontend || !has(self.extraArgs) || "
                 f"!self.extraArgs.map(a, {CEL_FLAG_NAME}).exists(n, {_CEL_RUST_REFUSED})"),
            message=_RUST_REFUSED_MESSAGE,
            message_expression=(
                f"'{_RUST_REFUSED_MESSAGE}: ' + "
                f"self.extraArgs.map(a, {CEL_FLAG_NAME}).filter(n, {_CEL_RUST_REFUSED})[0]"),
            explain=lambda e: f"{_RUST_REFUSED_MESSAGE}: {rust_frontend_refuses(e.extra_args)}",
            check=lambda e: not e.rust_frontend or rust_frontend_refuses(e.extra_args) is None,
            field_path=".extraArgs",
        ),
        Rule(
            cel="!self.rustFrontend || !has(self.tracing)",
            message=f"tracing needs rustFrontend: false (vLLM {VLLM_VERSION}'s Rust frontend exits at start on "
                    "--otlp-traces-endpoint)",
            check=lambda e: not e.rust_frontend or e.tracing is None,
            field_path=".tracing",
        ),
        Rule(
            cel="!self.rustFrontend || !has(self.multimodal) || ((!has(self.multimodal.allowedMediaDomains) "
                "|| size(self.multimodal.allowedMediaDomains) == 0) && !has(self.multimodal.fetchTimeoutSeconds))",
            message="multimodal.allowedMediaDomains and fetchTimeoutSeconds need rustFrontend: false (vLLM "
                    f"{VLLM_VERSION}'s Rust frontend refuses --allowed-media-domains at start and applies its own "
                    "policy: no media from private, loopback or link-local addresses)",
            check=lambda e: not e.rust_frontend or e.multimodal is None or (
                not e.multimodal.allowed_media_domains and e.multimodal.fetch_timeout_seconds is None),
            field_path=".multimodal",
        ),
    )


class Parallelism(SpecModel):
    """Parallel layout of one replica: GPUs per replica = tensor x pipeline x data."""

    tensor: Annotated[int, Field(ge=1, le=KDA_HEADS)] = 1
    """Tensor-parallel size; must divide the 96 KDA heads."""
    pipeline: Annotated[int, Field(ge=1, le=16)] = 1
    """Pipeline-parallel size."""
    data: Annotated[int, Field(ge=1, le=256)] = 1
    """Data-parallel ranks inside one replica (attention data parallelism)."""
    expert: bool = False
    """Expert parallelism across the replica's ranks (--enable-expert-parallel)."""

    rules = (
        Rule(
            cel=f"{KDA_HEADS} % self.tensor == 0",
            message=f"tensor parallel size must divide the {KDA_HEADS} KDA heads",
            check=lambda p: KDA_HEADS % p.tensor == 0,
            field_path=".tensor",
        ),
    )

    @property
    def gpus(self) -> int:
        return self.tensor * self.pipeline * self.data


AutoscalingMode = Literal["SLO", "KEDA", "HPA"]
ScalingMetric = Literal["RequestsInFlight", "RequestsWaiting", "KvCacheUsage", "PromptTokensPerSecond",
                        "GenerationTokensPerSecond"]
"""What a role's replica count follows, summed over the role's engines (vLLM's own metrics):
RequestsInFlight (vllm:num_requests_running + vllm:num_requests_waiting), RequestsWaiting,
KvCacheUsage (vllm:kv_cache_usage_perc, 0-1 per engine), PromptTokensPerSecond and
GenerationTokensPerSecond (rates of vllm:prompt_tokens_total and vllm:generation_tokens_total)."""


class RoleAutoscaling(SpecModel):
    """Scale this role from serving metrics, in whole replicas (a replica is a multi-node group).
    While set, the role's replica count belongs to its scaler: spec replicas is only where it starts."""

    min_replicas: Annotated[int, Field(ge=1, le=1024)] = 1
    """Fewest replicas (at least 1: a replica loads 1.6 TB of weights, far too slow to start from zero)."""
    max_replicas: Annotated[int, Field(ge=1, le=1024)]
    """Most replicas; the pool's free GPUs may allow fewer (then condition InsufficientCapacity)."""
    mode: AutoscalingMode | None = None
    """SLO (the operator's scaler) | KEDA (a ScaledObject with a Prometheus trigger) | HPA (an
    autoscaling/v2 HorizontalPodAutoscaler on a pods metric of the custom metrics API, e.g.
    prometheus-adapter); spec.autoscaling.mode when omitted."""
    metric: ScalingMetric | None = None
    """The load metric: PromptTokensPerSecond for prefill, RequestsInFlight for decode and
    aggregated when omitted."""
    target: Annotated[float, Field(gt=0, le=1e9)] | None = None
    """The metric's value one replica should carry; when omitted, the perf model's capacity of one
    replica at the workload's shape (status shows it), times the planner's utilisation."""

    rules = (
        Rule(
            cel="self.minReplicas <= self.maxReplicas",
            message="autoscaling: minReplicas must not exceed maxReplicas",
            check=lambda a: a.min_replicas <= a.max_replicas,
            field_path=".minReplicas",
        ),
    )


class _RoleEngineRules(SpecModel):
    """Per-role vLLM scheduler, CUDA-graph and expert-balancing settings; each omitted value is the
    planner's, derived from the perf model's batch at the SLO (status and `kimik3 plan` show the values
    used). Its fields are the rows of role_settings.py."""

    rules = (
        Rule(
            cel="!has(self.maxNumSeqs) || !has(self.maxNumBatchedTokens) "
                "|| self.maxNumBatchedTokens >= self.maxNumSeqs",
            message="maxNumBatchedTokens must be at least maxNumSeqs (vLLM refuses fewer)",
            check=lambda e: e.max_num_seqs is None or e.max_num_batched_tokens is None
            or e.max_num_batched_tokens >= e.max_num_seqs,
            field_path=".maxNumBatchedTokens",
        ),
    )


if TYPE_CHECKING:
    RoleEngine = _RoleEngineRules  # its fields are read through the rows (role_settings.given)
else:
    RoleEngine = create_model("RoleEngine", __base__=_RoleEngineRules, __module__=__name__,
                              __doc__=_RoleEngineRules.__doc__, **role_settings.spec_fields())


class Role(SpecModel):
    """One serving role in a pool. Omitted values are chosen by the planner."""

    replicas: Annotated[int, Field(ge=0, le=1024)] | None = None
    """Number of replicas (serving instances); planned when omitted. With autoscaling, the count
    the role starts with (clamped to minReplicas..maxReplicas); its scaler moves it from there."""
    parallelism: Parallelism | None = None
    """Layout of one replica; planned when omitted."""
    autoscaling: RoleAutoscaling | None = None
    """Scale this role from metrics (see spec.autoscaling for the deployment-wide settings)."""
    engine: RoleEngine | None = None
    """This role's scheduler, CUDA-graph and expert-balancing settings; planned when omitted."""
    scheduling: Scheduling | None = None
    """Priority class, scheduler, tolerations and node affinity of this role's pods."""
    queue_name: Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL)] | None = None
    """A Kueue LocalQueue of this namespace that admits the role's replicas, each a whole
    LeaderWorkerSet group: a group waits, its pods gated and holding no GPU, until the queue's
    ClusterQueue has quota for all of it (Kueue v0.17+ with its leaderworkerset integration; the
    Admitted condition tells how many wait and why). Kueue refuses to move a LeaderWorkerSet to
    another queue, and to change a waiting group's resources or placement (docs/queues.md)."""


class Gpu(SpecModel):
    """GPU facts of a pool; Auto reads them from node labels and capacity."""

    product: GpuProduct = Field(default="Auto", description=" | ".join(("Auto", *GPU_PRODUCTS)) + ".")
    per_node: Annotated[int, Field(ge=1, le=16)] | None = None
    """GPUs per node; node capacity when omitted."""


class Backends(SpecModel):
    """Overrides of the planner's kernel choices (validated against the pool's hardware)."""

    all2all: All2AllBackend | None = Field(default=None, alias="all2all")
    """--all2all-backend."""  # the alias keeps the published spelling; to_camel would say all2All
    moe: MoeBackend | None = None
    """--moe-backend."""


RDMA_ENV_PREFIXES = ("NCCL_", "UCX_", "NVSHMEM_", "NIXL_", "GLOO_")
"""What `pools[].rdma.env` may set: the fabric libraries' own variables. Never VLLM_*: the serving
pods run --fail-on-environ-validation, so an unknown VLLM_* variable would stop every engine."""
_RDMA_ENV_CEL = " || ".join(f"e.name.startsWith('{p}')" for p in RDMA_ENV_PREFIXES)
HcaName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.=^-]+(:[0-9]+)?$")]


class Rdma(SpecModel):
    """How the pool's pods reach the RDMA NICs (multi-node replicas and P/D KV transfer over RDMA).
    Omitted values come from the nodes (the RDMA extended resource they advertise, and how many
    units per GPU) and from NCCL's, NVSHMEM's and UCX's own device discovery."""

    resource: Annotated[str, Field(max_length=253, pattern=r"^[a-z0-9.-]+/[A-Za-z0-9_.-]+$")] | None = None
    """Extended resource of the NICs (e.g. rdma/ib, nvidia.com/hostdev); the one every node of the
    pool advertises when omitted."""
    nics_per_gpu: Annotated[int, Field(ge=1, le=4)] | None = None
    """NICs a pod requests per GPU it requests (HGX and GB300 nodes have one per GPU); when omitted,
    the node's count divided by its GPUs when that is 1-2 whole NICs per GPU, else the resource is
    taken as a shared device (k8s-rdma-shared-dev-plugin) and each pod requests one unit."""
    hcas: Annotated[list[HcaName], Field(max_length=32)] = []
    """HCA device names, optionally with a port (mlx5_0, mlx5_1:1): NCCL_IB_HCA (which reads each as
    a prefix), NVSHMEM_HCA_LIST and UCX_NET_DEVICES (port 1 when none is given); each library picks
    its own devices when empty."""
    gid_index: Annotated[int, Field(ge=0, le=255)] | None = None
    """RoCE GID index (the address type, e.g. 3 for RoCE v2 over IPv4 on most NICs):
    NCCL_IB_GID_INDEX, NVSHMEM_IB_GID_INDEX and UCX_IB_GID_INDEX; unset on InfiniBand."""
    env: Annotated[list[EnvVar], Field(max_length=32), list_map("name")] = []
    """Further fabric settings for the pool's RDMA pods, NCCL_*, UCX_*, NVSHMEM_*, NIXL_* or GLOO_*
    only; they win over the operator's defaults of the same name."""

    rules = (
        Rule(
            cel=f"!has(self.env) || self.env.all(e, {_RDMA_ENV_CEL})",
            message="rdma.env takes only " + ", ".join(f"{p}*" for p in RDMA_ENV_PREFIXES)
                    + " variables (never VLLM_*: the engines refuse unknown ones)",
            check=lambda r: all(e.name.startswith(RDMA_ENV_PREFIXES) for e in r.env),
            field_path=".env",
        ),
    )


class ServingResources(SpecModel):
    """CPU, memory and ephemeral storage of each serving pod of a pool. Requests equal limits, so the
    pods are Guaranteed (evicted and OOM-killed last; whole cores under the static CPU manager). An
    omitted amount is the pod's share of the node's allocatable, in proportion to the GPUs it holds,
    after 8% (at least 2 cores and 16 GiB) is kept back per node for its daemons; from the GPU
    product's usual node when the nodes are not known yet. Status shows the amounts rendered."""

    cpu: ResourceQuantity | None = None
    """CPU of each pod (request and limit); whole cores get exclusive CPUs under the static policy."""
    memory: ResourceQuantity | None = None
    """Memory of each pod (request and limit); includes /dev/shm, which NCCL and NIXL use."""
    ephemeral_storage: ResourceQuantity | None = None
    """Local ephemeral storage of each pod (request and limit): logs, /tmp, scratch; the weights
    and compile caches live on claims."""


def _cel_product_in(products: tuple[str, ...]) -> str:
    return f"self.gpu.product in [{', '.join(repr(p) for p in products)}]"


def _cel_product_not_in(products: tuple[str, ...]) -> str:
    if len(products) == 1:
        return f"self.gpu.product != {products[0]!r}"
    return f"!({_cel_product_in(products)})"


class Pool(SpecModel):
    """A set of alike GPU nodes and the roles served on them."""

    name: DnsLabel
    """Pool name, unique in the deployment; part of every child's name."""
    node_selector: Annotated[dict[str, LabelValue], Field(max_length=16)] = {}
    """Labels that select the pool's nodes."""
    tolerations: Annotated[list[Toleration], Field(max_length=16)] = []
    """Tolerations for the pool's pods."""
    image: ImageRef | None = None
    """Per-pool serving image (GB300 trays are arm64; MI355X needs ROCm)."""
    gpu: Gpu = Gpu()
    """GPU product and count per node."""
    interconnect: Interconnect = "Auto"
    """Fabric inside one replica. Auto: NVLink (or xGMI) inside the NVLink domain (the node on HGX
    and MI355X boards, the clique on NVL72 racks), RDMA beyond it. NVLink: tensor and expert groups
    must stay inside the NVLink domain (a node on HGX; multi-node NVLink on GB300/GB200 racks), a
    layout that would cross RDMA is refused. RDMA: the NVLink domain ends at the node even on NVL72
    racks. xGMI: AMD Instinct (MI355X) only, like NVLink on its 8-GPU board."""
    rdma: Rdma | None = None
    """RDMA NIC resources and fabric settings; from the nodes when omitted."""
    backends: Backends | None = None
    """Kernel overrides."""
    resources: ServingResources = ServingResources()
    """CPU, memory and ephemeral storage of each serving pod; sized from the nodes when omitted."""
    mode: PoolMode | None = None
    """Disaggregated (prefill and/or decode) or Aggregated; inferred from the roles present."""
    prefill: Role | None = None
    """Prefill role (disaggregated)."""
    decode: Role | None = None
    """Decode role (disaggregated)."""
    aggregated: Role | None = None
    """Aggregated role: prefill and decode in one engine."""

    rules = (
        Rule(
            cel="has(self.prefill) || has(self.decode) || has(self.aggregated)",
            message="a pool needs at least one role: prefill, decode or aggregated",
            check=lambda p: any(r is not None for r in (p.prefill, p.decode, p.aggregated)),
        ),
        Rule(
            cel="!has(self.aggregated) || !(has(self.prefill) || has(self.decode))",
            message="a pool is either aggregated or disaggregated (prefill/decode), not both",
            check=lambda p: p.aggregated is None or (p.prefill is None and p.decode is None),
        ),
        Rule(
            cel="!has(self.mode) || self.mode != 'Aggregated' || has(self.aggregated)",
            message="mode Aggregated needs the aggregated role",
            check=lambda p: p.mode != "Aggregated" or p.aggregated is not None,
        ),
        Rule(
            cel="!has(self.mode) || self.mode != 'Disaggregated' || !has(self.aggregated)",
            message="mode Disaggregated takes prefill and/or decode roles, not aggregated",
            check=lambda p: p.mode != "Disaggregated" or p.aggregated is None,
        ),
        Rule(
            cel="!has(self.interconnect) || self.interconnect != 'xGMI' || !has(self.gpu) "
                f"|| !has(self.gpu.product) || {_cel_product_in(('Auto', *XGMI_PRODUCTS))}",
            message=f"interconnect xGMI is AMD Instinct's fabric: it needs gpu.product {' or '.join(XGMI_PRODUCTS)} "
                    "(or Auto)",
            check=lambda p: p.interconnect != "xGMI" or p.gpu.product in ("Auto", *XGMI_PRODUCTS),
            field_path=".interconnect",
        ),
        Rule(
            cel="!has(self.interconnect) || self.interconnect != 'NVLink' || !has(self.gpu) "
                f"|| !has(self.gpu.product) || {_cel_product_not_in(XGMI_PRODUCTS)}",
            message=f"interconnect NVLink is NVIDIA's fabric: {'/'.join(XGMI_PRODUCTS)} boards use xGMI",
            check=lambda p: p.interconnect != "NVLink" or p.gpu.product not in XGMI_PRODUCTS,
            field_path=".interconnect",
        ),
    )

    @property
    def effective_mode(self) -> PoolMode:
        return self.mode or ("Aggregated" if self.aggregated is not None else "Disaggregated")

    def roles(self) -> list[tuple[RoleName, Role]]:
        """The roles present, in a fixed order (prefill, decode, aggregated)."""
        present: tuple[tuple[RoleName, Role | None], ...] = (
            ("prefill", self.prefill), ("decode", self.decode), ("aggregated", self.aggregated))
        return [(n, r) for n, r in present if r is not None]


class Rollout(SpecModel):
    """How a changed role replaces its replicas (LeaderWorkerSet rolling update, counted in replicas)."""

    max_surge: Annotated[int, Field(ge=0, le=64)] = 1
    """Extra replicas started before old ones stop: serving capacity never drops, but it needs the
    GPUs of one more replica. 0 for clusters sized for exactly one copy."""
    max_unavailable: Annotated[int, Field(ge=0, le=64)] = 0
    """Replicas that may be down at once during the update."""

    rules = (
        Rule(
            cel="self.maxSurge + self.maxUnavailable >= 1",
            message="a rollout needs room to move: maxSurge or maxUnavailable must be at least 1 "
            "(maxSurge 0 with maxUnavailable 1 updates in place on a cluster sized for one copy)",
            check=lambda s: s.max_surge + s.max_unavailable >= 1,
        ),
    )


if TYPE_CHECKING:
    RouterPolicy = str
else:  # the enum is the policy table's names (router_policies.py), in its order
    RouterPolicy = Literal[router_policies.POLICY_NAMES]


class RouterRequests(SpecModel):
    """What each router pod requests."""

    cpu: ResourceQuantity = "1"
    """CPU request."""
    memory: ResourceQuantity = "1Gi"
    """Memory request."""


class RouterLimits(SpecModel):
    """The ceiling of each router pod."""

    cpu: ResourceQuantity | None = None
    """CPU limit; none by default, so a burst of requests is not throttled."""
    memory: ResourceQuantity = "2Gi"
    """Memory limit (the cache-aware prefix trees live in memory)."""


def _cel_amount(part: str, resource: str, default: str | None) -> str:
    """CEL for an amount of the router's resources that may be left out (then its default)."""
    given = f"self.{part}.{resource}"
    return f"quantity(has(self.{part}) ? {given} : '{default}')" if default else f"quantity({given})"


class RouterResources(SpecModel):
    """Requests and limits of each router pod."""

    requests: RouterRequests = RouterRequests()
    """Requested CPU and memory."""
    limits: RouterLimits = RouterLimits()
    """CPU and memory limits."""

    rules = (
        Rule(
            cel=(f"{_cel_amount('requests', 'memory', RouterRequests().memory)}"
                 f".compareTo({_cel_amount('limits', 'memory', RouterLimits().memory)}) <= 0"),
            message="router resources: the memory request exceeds the memory limit",
            check=lambda r: quantity(r.requests.memory) <= quantity(r.limits.memory),
            field_path=".limits",
        ),
        Rule(
            cel=(f"!has(self.limits) || !has(self.limits.cpu) || {_cel_amount('requests', 'cpu', RouterRequests().cpu)}"
                 f".compareTo({_cel_amount('limits', 'cpu', None)}) <= 0"),
            message="router resources: the CPU request exceeds the CPU limit",
            check=lambda r: r.limits.cpu is None or quantity(r.requests.cpu) <= quantity(r.limits.cpu),
            field_path=".limits",
        ),
    )


DEFAULT_MAX_REQUEST_BYTES = "30Mi"
MIN_REQUEST_BYTES = "1Mi"
MAX_REQUEST_BYTES = "512Mi"
"""vllm-router 0.1.17's own cap (--max-payload-size default, src/config/types.rs): above it the
router refuses whatever the front lets through."""


class RouterAdmission(SpecModel):
    """How many requests each router pod carries at once, and what the rest get: enforced by the
    pod's front (HAProxy), before the router. A request over the limit waits in a queue; one more
    than the queue holds gets 429 with Retry-After at once, and one that waited queueTimeoutSeconds
    gets 503 with Retry-After. Every refusal is counted in the front's metrics."""

    max_concurrent_requests: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    """Requests each router pod passes on at once (streams included, until they end); none: no limit."""
    queue_size: Annotated[int, Field(ge=0, le=100_000)] = 128
    """Requests that may wait for a slot per router pod (with maxConcurrentRequests); 0 refuses at once."""
    queue_timeout_seconds: Annotated[int, Field(ge=1, le=600)] = 30
    """How long a request may wait for a slot."""
    max_request_bytes: ResourceQuantity = DEFAULT_MAX_REQUEST_BYTES
    """The largest request body a router pod takes, inline (base64) images included: a larger one gets
    413 at the front, before the router holds it in memory (its own cap is 512 MiB). The engines
    behind it take at least this much plus what the router adds (docs/front-door.md). From 1Mi to
    512Mi; 30Mi by default, so a request the front takes is one vLLM's Rust frontend takes (32 MiB)."""

    @property
    def body_bytes(self) -> int:
        """max_request_bytes in bytes: the front's limit and, with what the router adds, the engines'."""
        return int(quantity(self.max_request_bytes))

    rules = (
        Rule(
            cel=(f"!has(self.maxRequestBytes) "
                 f"|| (quantity(self.maxRequestBytes).compareTo(quantity('{MIN_REQUEST_BYTES}')) >= 0 "
                 f"&& quantity(self.maxRequestBytes).compareTo(quantity('{MAX_REQUEST_BYTES}')) <= 0)"),
            message=f"maxRequestBytes is the largest request body a router pod takes: from {MIN_REQUEST_BYTES} "
                    f"to {MAX_REQUEST_BYTES}",
            field_path=".maxRequestBytes",
            check=lambda a: quantity(MIN_REQUEST_BYTES) <= quantity(a.max_request_bytes) <= quantity(MAX_REQUEST_BYTES),
        ),
    )


GatewayHostname = Annotated[str, Field(min_length=1, max_length=253,
                                       pattern=r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")]
"""Gateway API's Hostname: a DNS name, optionally a `*.` wildcard; no IP, no port."""


class RouterGateway(SpecModel):
    """Exposure through Gateway API: an HTTPRoute (gateway.networking.k8s.io/v1, named as the
    router's Service) that attaches the deployment's endpoint to a Gateway the cluster runs. The
    Gateway's listener must admit routes from this namespace (its allowedRoutes). With
    spec.network.policies on, list the Gateway's own pods in spec.network.clients, or the router
    pods refuse its connections."""

    name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
    """The Gateway."""
    namespace: Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL)] | None = None
    """Its namespace (default: the deployment's)."""
    section_name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)] | None = None
    """One listener of the Gateway, by name (default: every listener that admits the route)."""
    hostnames: Annotated[list[GatewayHostname], Field(max_length=16)] = []
    """Host names the route answers (default: every host name of the listener)."""


RouterImplementation = Literal["KimiK3Router", "VllmRouter"]


def _has_policies(impl: str, lacking: tuple[str, ...], r: Router) -> bool:
    return r.implementation != impl or not {r.policy, r.prefill_policy, r.decode_policy} & set(lacking)


def _implementation_rules() -> tuple[Rule, ...]:
    """One rule per router implementation that lacks a policy of the table (router_policies.py)."""
    out = []
    for impl in get_args(RouterImplementation):
        lacking = router_policies.lacking(impl)
        if not lacking:
            continue
        out.append(Rule(
            cel=(f"(has(self.implementation) ? self.implementation : 'KimiK3Router') != '{impl}' || "
                 f"![self.policy, self.prefillPolicy, self.decodePolicy].exists(p, p in {list(lacking)})"),
            message=f"{impl} has no {', '.join(lacking)} policy: use implementation KimiK3Router, or another policy",
            check=functools.partial(_has_policies, impl, lacking),
            field_path=".implementation",
        ))
    return tuple(out)


class RouterWatchdog(SpecModel):
    """When kimik3-router gives up on an engine that took a request and does not answer: it then
    sends the request elsewhere if no token has reached the client yet, else ends the stream with
    an error event (docs/router.md)."""

    first_token_seconds: Annotated[int, Field(ge=1, le=3600)] = 30
    """The first-token deadline's base; the router adds the prompt's predicted prefill time at the
    slowest prefill rate the planner predicts for the roles it routes to."""
    idle_gap_seconds: Annotated[int, Field(ge=1, le=3600)] = 60
    """The longest silence between two chunks of a stream."""


class RouterMigration(SpecModel):
    """Mid-stream migration (kimik3-router): a stream whose engine dies or stalls after tokens reached
    the client goes on on another engine from its prompt and generated token ids, under the same
    response id, with usage over the whole answer (docs/migration.md). What cannot move (n > 1,
    guided decoding, an open tool call, chat logprobs...) still ends with an SSE error event."""

    max_per_stream: Annotated[int, Field(ge=0, le=8)] = 2
    """Times one stream may move; 0 turns migration off (a failure mid-stream then ends the stream
    with an error event). Each move prefills the whole context again on the new engine."""


class Router(SpecModel):
    """The router in front of the engines (kimik3-router): one endpoint for clients. A deployment with
    prefill/decode roles gets a prefill/decode router (`<name>-router`) that sends each request to a
    prefill engine, then to a decode engine with the KV hand-off; aggregated roles get a load-balancing
    router (`<name>-router`, or `<name>-router-aggregated` beside a prefill/decode one)."""

    replicas: Annotated[int, Field(ge=0, le=64)] = 2
    """Router replicas. 0 renders no router: clients then reach a role's Service directly, and
    prefill/decode roles do not disaggregate (a decode engine prefills every prompt itself)."""
    policy: RouterPolicy = Field(default="CacheAware", description=(
        f"How the aggregated router picks an engine: {router_policies.described()}."))
    prefill_policy: RouterPolicy = "CacheAware"
    """How the prefill/decode router picks a prefill engine (the values of policy)."""
    decode_policy: RouterPolicy = "CacheAware"
    """How the prefill/decode router picks a decode engine (the values of policy)."""
    resources: RouterResources = RouterResources()
    """CPU and memory of each router pod."""
    node_selector: Annotated[dict[str, LabelValue], Field(max_length=16)] = {}
    """Labels that select the nodes the router pods may run on (they need no GPU: e.g. CPU nodes)."""
    tolerations: Annotated[list[Toleration], Field(max_length=16)] = []
    """Tolerations for the router pods (e.g. of a tainted CPU pool)."""
    admission: RouterAdmission = RouterAdmission()
    """Concurrency limit and queue of each router pod."""
    api_key: SecretKeyRef | None = None
    """A key of a Secret holding the API key clients must send (`Authorization: Bearer <key>`) for
    every route but the health checks; compared in constant time by the front and not passed on. A
    missing Secret keeps the router pods from starting; an empty key refuses every request."""
    gateway: RouterGateway | None = None
    """Attach the endpoint to a Gateway (Gateway API's HTTPRoute); none: the router's Service only."""
    scheduling: Scheduling | None = None
    """Priority class, scheduler, tolerations and node affinity of the router pods (beside
    nodeSelector and tolerations above)."""
    implementation: RouterImplementation = "KimiK3Router"
    """KimiK3Router: the project's router, which fails a leg over to another engine by the NIXL
    connector's rules (docs/router.md). VllmRouter: vllm-router 0.1.17, the router of earlier
    releases, kept for one release as a fallback: it never retries a leg, so an engine's death costs
    every request sent to it until its pod turns unready (docs/decisions/router-failover.md)."""
    watchdog: RouterWatchdog = RouterWatchdog()
    """kimik3-router's deadlines for an engine that took a request and does not answer."""
    migration: RouterMigration = RouterMigration()
    """kimik3-router's mid-stream migration."""
    image: ImageRef | None = None
    """The router pods' image (the router and its HAProxy front), e.g. a mirror of the project's;
    the image of `implementation` at this operator's version when omitted."""

    rules = (
        Rule(
            cel=f"!has(self.decodePolicy) || !(self.decodePolicy in {list(router_policies.NOT_FOR_DECODE)})",
            message=f"decodePolicy: {', '.join(router_policies.NOT_FOR_DECODE)} picks prefill and aggregated "
                    "engines only (a decode's cache holds what its prefill handed over); pick a decode engine by "
                    "load, e.g. CacheAware or StickyLeastLoaded",
            check=lambda r: r.decode_policy not in router_policies.NOT_FOR_DECODE,
            field_path=".decodePolicy",
        ),
        *_implementation_rules(),
    )


class SelectorRequirement(SpecModel):
    """One matchExpressions entry of a label selector (meta/v1)."""

    key: LabelKey
    """Label key."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    """In | NotIn (values needed) | Exists | DoesNotExist (no values)."""
    values: Annotated[list[LabelValue], Field(max_length=64)] = []
    """Label values for In and NotIn."""

    rules = (
        Rule(cel="(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)",
             message="a selector requirement has values exactly when its operator is In or NotIn",
             check=lambda r: (r.operator in ("In", "NotIn")) == bool(r.values)),
    )


class LabelSelector(SpecModel):
    """A label selector (meta/v1); empty selects everything in its scope."""

    match_labels: Annotated[dict[str, LabelValue], Field(max_length=32)] = {}
    """Labels that must all be present with these values."""
    match_expressions: Annotated[list[SelectorRequirement], Field(max_length=16)] = []
    """Requirements that must all hold."""

    rules = (
        Rule(cel=f"!has(self.matchLabels) || self.matchLabels.all(k, size(k) <= 317 && k.matches('{LABEL_KEY}'))",
             message="matchLabels keys must be label keys: an optional DNS prefix and '/', then a name",
             check=lambda s: all(len(k) <= 317 and re.match(LABEL_KEY, k) for k in s.match_labels),
             field_path=".matchLabels"),
    )


Cidr = Annotated[str, Field(max_length=64, pattern=r"^[0-9a-fA-F:.]+/[0-9]{1,3}$")]


class IpBlock(SpecModel):
    """Addresses outside the cluster's pods (networking/v1 IPBlock)."""

    cidr: Cidr
    """The addresses allowed, e.g. 10.0.0.0/16."""
    except_: Annotated[list[Cidr], Field(max_length=16, alias="except")] = []
    """Ranges inside cidr left out."""


class NetworkPeer(SpecModel):
    """Who may connect (a networking/v1 NetworkPolicyPeer): pods chosen by podSelector in the
    namespaces chosen by namespaceSelector (the deployment's own when left out), or an ipBlock."""

    pod_selector: LabelSelector | None = None
    """Pods; with namespaceSelector, in those namespaces."""
    namespace_selector: LabelSelector | None = None
    """Namespaces; every pod in them unless podSelector narrows it."""
    ip_block: IpBlock | None = None
    """Addresses; alone, without the two selectors."""

    rules = (
        Rule(cel="has(self.ipBlock) != (has(self.podSelector) || has(self.namespaceSelector))",
             message="a network peer is an ipBlock, or a podSelector and/or namespaceSelector, not both, not neither",
             check=lambda p: (p.ip_block is not None)
             != (p.pod_selector is not None or p.namespace_selector is not None)),
    )


class Network(SpecModel):
    """NetworkPolicies for the deployment's pods (enforced where the cluster's network plugin
    enforces NetworkPolicies). Engines accept connections only from the deployment's own pods: its
    routers, their P/D peers (NIXL) and the other pods of their group (NCCL, torch.distributed), and
    on their HTTP port (vLLM's /metrics is on it) from metricsFrom. Routers accept clients on their
    HTTP port from clients, and their metrics ports from metricsFrom or, when it is empty, from anywhere."""

    policies: bool = True
    """Render the NetworkPolicies."""
    clients: Annotated[list[NetworkPeer], Field(max_length=16)] = []
    """Who may send requests to the routers; empty: every pod of the deployment's namespace. An
    ingress controller or a gateway in another namespace needs its entry here."""
    metrics_from: Annotated[list[NetworkPeer], Field(max_length=16)] = []
    """Who scrapes metrics (Prometheus). The engines serve /metrics beside inference, so they admit
    only these: leave it empty and an in-cluster Prometheus outside the namespace reads no engine."""


class Workload(SpecModel):
    """The traffic to size for: used to choose replicas the spec leaves out."""

    input_tokens: Annotated[int, Field(ge=1, le=MAX_MODEL_LEN)] = 8192
    """Typical prompt length in tokens."""
    output_tokens: Annotated[int, Field(ge=1, le=MAX_MODEL_LEN)] = 1024
    """Typical completion length in tokens."""
    requests_per_second: Annotated[float, Field(gt=0, le=100000)] = 1.0
    """Sustained request rate across the deployment."""
    acceptance_length: Annotated[float, Field(ge=1, le=17)] | None = None
    """Measured speculative acceptance length (tokens per verify step, at most 1 + the draft tokens):
    the perf model's decode throughput, ITL and batch at the ITL target use it. When omitted, the
    acceptance the model's calibration implies from the published DSpark point (status and
    `kimik3 plan` show it as speculativeAcceptance)."""


class Slo(SpecModel):
    """Latency targets the replica counts and the autoscaler aim for."""

    ttft_milliseconds: Annotated[int, Field(ge=1, le=3600000)] | None = None
    """Time to first token at the typical prompt length."""
    itl_milliseconds: Annotated[int, Field(ge=1, le=60000)] | None = None
    """Inter-token latency during decode."""


class PrefillDecodeRatio(SpecModel):
    """Bounds on prefill replicas per decode replica, across the deployment."""

    min: Annotated[float, Field(gt=0, le=64)] = 0.0625
    """Fewest prefill replicas per decode replica."""
    max: Annotated[float, Field(gt=0, le=64)] = 16.0
    """Most prefill replicas per decode replica."""

    rules = (
        Rule(cel="self.min <= self.max", message="prefillDecodeRatio: min must not exceed max",
             check=lambda r: r.min <= r.max),
    )


class Autoscaling(SpecModel):
    """Deployment-wide autoscaling settings; which roles scale, and between which counts, is each
    role's own autoscaling."""

    mode: AutoscalingMode = "SLO"
    """The mode of roles that do not name one: SLO (the operator's own scaler: reads Prometheus,
    follows spec.slo and the load against the perf model's capacity, never beyond the pool's free
    GPUs) | KEDA | HPA."""
    prometheus_url: EndpointUrl | None = None
    """Prometheus's HTTP API for the SLO scaler and KEDA's triggers; the operator's
    --prometheus-url (chart value autoscaling.prometheusUrl) when omitted."""
    interval_seconds: Annotated[int, Field(ge=1, le=600)] = 15
    """How often the SLO scaler decides (and KEDA's pollingInterval)."""
    window_seconds: Annotated[int, Field(ge=5, le=3600)] = 60
    """The range of the rates and latency quantiles the scalers read."""
    breach_seconds: Annotated[int, Field(ge=0, le=3600)] = 30
    """How long a latency target must be missed before the SLO scaler adds a replica for it."""
    scale_up_cooldown_seconds: Annotated[int, Field(ge=0, le=3600)] = 60
    """Least time between a scaling of a role and its next scale-up (a new replica takes minutes to
    load; its effect shows only once Ready)."""
    scale_down_cooldown_seconds: Annotated[int, Field(ge=0, le=86400)] = 300
    """Least time between a scaling of a role and its next scale-down, and how long the load must
    have fit one replica fewer before the SLO scaler removes it; also KEDA's cooldownPeriod and the
    HPA's scale-down stabilization window."""
    prefill_decode_ratio: PrefillDecodeRatio | None = None
    """SLO mode: keep prefill replicas per decode replica within these bounds."""


class Experimental(SpecModel):
    """Knobs that may change without an API version bump."""

    accept_known_issues: Annotated[list[Annotated[str, Field(max_length=64)]], Field(max_length=8)] = []
    """Upstream issues (e.g. "vllm#52627") whose trap the planner should let through, for engines
    patched against them."""


SLO_TARGETS: dict[str, tuple[str, ...]] = {
    "prefill": ("ttftMilliseconds",), "decode": ("itlMilliseconds",),
    "aggregated": ("ttftMilliseconds", "itlMilliseconds")}
"""The spec.slo targets a role's SLO scaler follows: a prefill replica shortens time to first
token, a decode replica inter-token latency; an aggregated replica does both (either will do)."""


def _slo_mode_rules() -> tuple[Rule, ...]:
    """One rule per role kind: an SLO-mode role needs the latency target it scales toward."""
    def rule(role: str, targets: tuple[str, ...]) -> Rule:
        mode = (f"(has(p.{role}.autoscaling.mode) ? p.{role}.autoscaling.mode : "
                "(has(self.autoscaling) && has(self.autoscaling.mode) ? self.autoscaling.mode : 'SLO'))")
        has_target = " || ".join(f"has(self.slo.{t})" for t in targets)
        snake = {"ttftMilliseconds": "ttft_milliseconds", "itlMilliseconds": "itl_milliseconds"}

        def check(spec: Any) -> bool:
            default = spec.autoscaling.mode if spec.autoscaling else "SLO"
            slo_roles = [r for p in spec.pools if (r := getattr(p, role)) is not None and r.autoscaling
                         and (r.autoscaling.mode or default) == "SLO"]
            return not slo_roles or (spec.slo is not None
                                     and any(getattr(spec.slo, snake[t]) is not None for t in targets))
        return Rule(
            cel=(f"!self.pools.exists(p, has(p.{role}) && has(p.{role}.autoscaling) && {mode} == 'SLO') "
                 f"|| (has(self.slo) && ({has_target}))"),
            message=(f"autoscaling mode SLO on a {role} role needs spec.slo."
                     + " or spec.slo.".join(targets) + " (the latency it scales toward); "
                     "or choose mode KEDA or HPA"),
            check=check,
            field_path=".slo",
        )
    return tuple(rule(role, targets) for role, targets in SLO_TARGETS.items())


_RESERVED_POD_KEY_CEL = ("(k in [" + ", ".join(f"'{k}'" for k in OPERATOR_POD_LABELS) + "] || "
                         + " || ".join(f"k.startsWith('{p}')" for p in RESERVED_POD_KEY_PREFIXES) + ")")


POD_KEY = r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
"""A label or annotation key as the API server checks a pod's (an optional DNS-subdomain prefix of
at most 253 characters, a name of at most 63). A rule, not a key schema: a CRD's structural schema
cannot constrain map keys (no propertyNames)."""


def _key_format_rule(field: str) -> Rule:
    return Rule(
        cel=f"!has(self.{field}) || self.{field}.all(k, k.matches('{POD_KEY}'))",
        message=f"pods.{field} has a key that is not a label key (an optional DNS-subdomain prefix and /, "
                "then a name of at most 63 letters, digits, '-', '_' or '.')",
        check=lambda pods: all(re.fullmatch(POD_KEY, k) for k in getattr(pods, field)),
        field_path=f".{field}",
    )


def _reserved_key_rule(field: str, what: str) -> Rule:
    return Rule(
        cel=f"!has(self.{field}) || !self.{field}.exists(k, {_RESERVED_POD_KEY_CEL})",
        message=f"pods.{field} sets {what} the operator, LeaderWorkerSet or Kueue owns",
        message_expression=(f"'pods.{field} sets {what} the operator, LeaderWorkerSet or Kueue owns: ' + "
                            f"self.{field}.filter(k, {_RESERVED_POD_KEY_CEL})[0]"),
        explain=lambda pods: (f"pods.{field} sets {what} the operator, LeaderWorkerSet or Kueue owns: "
                              + next(k for k in getattr(pods, field) if reserved_pod_key(k))),
        check=lambda pods: not any(reserved_pod_key(k) for k in getattr(pods, field)),
        field_path=f".{field}",
    )


class PullSecret(SpecModel):
    """A Secret of type kubernetes.io/dockerconfigjson in the deployment's namespace."""

    name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
    """Secret name."""


class Pods(SpecModel):
    """What every pod of the deployment carries beside what the operator sets: the serving leaders
    and workers, the routers, and the staging Jobs' pods. For cost allocation, a service mesh's or a
    security scanner's opt-in, and a private registry. A change rolls every serving and router pod
    (their templates change: each replica reloads the weights); a staging Job made before keeps
    its pods as they were (a Job's template is immutable)."""

    labels: Annotated[dict[str, LabelValue], Field(max_length=32)] = {}
    """Labels; never the operator's own (app.kubernetes.io/name, instance, managed-by, part-of,
    component) nor a serving.kimik3.dev/, leaderworkerset.sigs.k8s.io/ or kueue.x-k8s.io/ key."""
    annotations: Annotated[dict[str, Annotated[str, Field(max_length=4096)]], Field(max_length=32)] = {}
    """Annotations, under the same reserved keys as labels."""
    image_pull_secrets: Annotated[list[PullSecret], Field(max_length=8), list_map("name")] = []
    """Secrets the kubelet pulls every image of these pods with (serving, router, stager)."""

    rules = (_key_format_rule("labels"), _key_format_rule("annotations"),
             _reserved_key_rule("labels", "a label"), _reserved_key_rule("annotations", "an annotation"))


class KimiK3DeploymentSpec(SpecModel):
    """A Kimi K3 serving deployment across one or more GPU node pools."""

    model: ModelSource
    """The checkpoint and how it is named."""
    engine: Engine = Engine()
    """vLLM settings shared by all pools."""
    pools: Annotated[list[Pool], Field(min_length=1, max_length=16), list_map("name")]
    """Node pools and the roles each serves; every prefill role pairs with every decode role."""
    router: Router = Router()
    """Request router."""
    network: Network = Network()
    """Who may connect to the engines and the routers (NetworkPolicies)."""
    pods: Pods = Pods()
    """Labels, annotations and image pull secrets of every pod the deployment runs."""
    rollout: Rollout = Rollout()
    """How spec changes roll out to running replicas."""
    workload: Workload | None = None
    """Expected traffic; sizes the replicas the pools leave out."""
    slo: Slo | None = None
    """Latency targets (TTFT, ITL)."""
    experimental: Experimental | None = None
    """Unstable settings."""
    autoscaling: Autoscaling | None = None
    """Autoscaling settings."""

    rules = (
        *_slo_mode_rules(),
        Rule(
            cel=(f"!has(self.router) || ![self.router.policy, self.router.prefillPolicy, self.router.decodePolicy]"
                 f".exists(p, p in {list(router_policies.KV_EVENTS)}) || !has(self.engine) || "
                 "!has(self.engine.prefixCaching) || !has(self.engine.prefixCaching.enabled) || "
                 "self.engine.prefixCaching.enabled"),
            message=f"router: {', '.join(router_policies.KV_EVENTS)} follows the engines' prefix caches, which "
                    "engine.prefixCaching.enabled false turns off: enable prefix caching or pick another policy",
            check=lambda s: s.engine.prefix_caching.enabled or not (
                {s.router.policy, s.router.prefill_policy, s.router.decode_policy} & set(router_policies.KV_EVENTS)),
            field_path=".router",
        ),
        Rule(
            cel="self.pools.exists(p, has(p.prefill)) == self.pools.exists(p, has(p.decode))",
            message="prefill and decode come together: a prefill role needs a decode role in the "
            "same KimiK3Deployment, and a decode role needs a prefill role",
            check=lambda s: any(p.prefill for p in s.pools) == any(p.decode for p in s.pools),
            field_path=".pools",
        ),
    )
