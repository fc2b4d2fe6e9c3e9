"""Plausible KimiK3Deployment bodies: what a user could write, as camelCase dicts.

Pools select the fake nodes by their own labels (fleet.py), with every role shape (aggregated,
prefill+decode in one pool or split across pools, mixed, free), explicit or planned parallelism
and replicas, GPU overrides, backends, tolerations; engine options, speculation, prefix-cache
retention, extraArgs and env from vocabularies vLLM accepts; workload, SLO, router, model source
with an optional auth Secret. Such a body may still be refused, by a rule or by the planner.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any, get_args

from hypothesis import strategies as st

from kimik3_operator.api import spec as api
from kimik3_operator.api import v1alpha1 as v1
from kimik3_operator.api.router_policies import POLICY_NAMES
from kimik3_operator.kimi_k3 import MAX_MODEL_LEN
from kimik3_operator.planner.catalog import CATALOG

from .fleet import ABSENT, nodes

Draw = Callable[[st.SearchStrategy[Any]], Any]

URIS = ("hf://moonshotai/Kimi-K3", "pvc://weights/kimi-k3", "s3://models/kimi-k3/v1", "oci://registry.example/k3:1",
        "hf://moonshotai/Kimi-K3?revision=main")
DRAFT_URIS = ("hf://moonshotai/Kimi-K3-DSpark", "pvc://weights/k3-dspark")
POOL_NAMES = ("gb300", "b200", "h200", "mi355x", "rack-a", "rack-b", "p", "9lives", "decode-pool", "a" * 40)
SAFE_ARGS = ("--max-num-seqs=64", "--max-num-batched-tokens=16384", "--enforce-eager", "--seed=7",
             "--disable-log-stats", "--async-scheduling", "--uvicorn-log-level=warning", "--max-log-len=100",
             "--long-prefill-token-threshold=2048", "--enable-log-requests")
SAFE_ARG_PAIRS = (("--max-num-seqs", "128"), ("--seed", "-1"), ("--uvicorn-log-level", "info"))
ENV = {"NCCL_DEBUG": ("INFO", "WARN"), "VLLM_LOGGING_LEVEL": ("INFO", "DEBUG"), "HF_HUB_OFFLINE": ("1", "0"),
       "UCX_TLS": ("rc,cuda_copy",), "NCCL_IB_HCA": ("mlx5", ""), "TORCH_NCCL_ASYNC_ERROR_HANDLING": ("1",)}
"""Variables users set, with values their readers accept (VLLM_* ones are checked by vLLM's own reader)."""
QUANTITIES = ("2Ti", "1800Gi", "3T", "500G", "1.5Ti", "2000000000000")


def _enum(literal: Any) -> tuple[str, ...]:
    return tuple(get_args(literal))


def maybe(draw: Draw, p_percent: int) -> bool:
    """True with probability p_percent; False when shrunk (towards 0), so a failing example
    shrinks to a body with as few optional parts as still fail."""
    return draw(st.integers(0, 99)) >= 100 - p_percent


SELECTOR_WEIGHTS = (("nvidia.com/gpu.product", 6), ("amd.com/gpu.product-name", 6), ("nvidia.com/gpu.clique", 3),
                    ("node.kubernetes.io/instance-type", 2), ("nvidia.com/gpu.family", 1), ("kubernetes.io/arch", 1),
                    ("type", 1), ("kubernetes.io/hostname", 1))


def _selector(draw: Draw) -> dict[str, str]:
    """Labels of one fake node (so the selector matches at least it), or nothing, or no node."""
    kind = draw(st.integers(0, 19))
    if kind == 0:
        return {}
    if kind == 1:
        return dict(draw(st.sampled_from(ABSENT)))
    labels = draw(st.sampled_from(nodes()))["metadata"]["labels"]
    keys = [k for k, weight in SELECTOR_WEIGHTS if k in labels for _ in range(weight)]
    # Repeats dropped after the draw: hypothesis's unique=True over a list with repeats depends
    # on string hashes (PYTHONHASHSEED), and the corpus must be the same in every process.
    chosen = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=2))
    return {k: labels[k] for k in dict.fromkeys(chosen)}


def _parallelism(draw: Draw) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if maybe(draw, 90):
        out["tensor"] = draw(st.sampled_from((8, 8, 8, 8, 8, 8, 16, 16, 4, 32, 1, 2, 6, 12, 24, 48, 96)))
    if maybe(draw, 20):
        out["pipeline"] = draw(st.sampled_from((1, 2, 2, 4)))
    if maybe(draw, 40):
        out["data"] = draw(st.sampled_from((1, 2, 4, 8, 16)))
    if maybe(draw, 40):
        out["expert"] = draw(st.booleans())
    return out


def _role(draw: Draw) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if maybe(draw, 65):
        out["replicas"] = draw(st.sampled_from((1, 1, 2, 2, 3, 4, 0)))
    if maybe(draw, 45):
        out["parallelism"] = _parallelism(draw)
    if maybe(draw, 15):
        out["autoscaling"] = _role_autoscaling(draw)
    if maybe(draw, 15):
        out["engine"] = _role_engine(draw)
    return out


def _role_engine(draw: Draw) -> dict[str, Any]:
    """Per-role shaping overrides, each present or not (the planner fills the rest)."""
    out: dict[str, Any] = {}
    if maybe(draw, 40):
        out["maxNumSeqs"] = draw(st.sampled_from((1, 16, 64, 256, 1024)))
    if maybe(draw, 40):
        out["maxNumBatchedTokens"] = draw(st.sampled_from((1024, 8192, 16384, 65536)))
    if maybe(draw, 30):
        out["maxCudagraphCaptureSize"] = draw(st.sampled_from((8, 256, 1024)))
    if maybe(draw, 30):
        out["longPrefillTokenThreshold"] = draw(st.sampled_from((0, 2048, 8192)))
    if maybe(draw, 30):
        out["eplb"] = {"enabled": draw(st.booleans())}
        if out["eplb"]["enabled"] and maybe(draw, 50):
            out["eplb"]["redundantExperts"] = draw(st.sampled_from((0, 16, 32)))
    return out


def _role_autoscaling(draw: Draw) -> dict[str, Any]:
    low = draw(st.sampled_from((1, 1, 2, 4)))
    out: dict[str, Any] = {"maxReplicas": low + draw(st.sampled_from((0, 1, 3, 8)))}
    if maybe(draw, 60):
        out["minReplicas"] = low
    if maybe(draw, 60):
        out["mode"] = draw(st.sampled_from(_enum(api.AutoscalingMode)))
    if maybe(draw, 40):
        out["metric"] = draw(st.sampled_from(_enum(api.ScalingMetric)))
    if maybe(draw, 30):
        out["target"] = draw(st.sampled_from((0.5, 4, 32, 20000.0)))
    return out


def _autoscaling(draw: Draw) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if maybe(draw, 50):
        out["mode"] = draw(st.sampled_from(_enum(api.AutoscalingMode)))
    if maybe(draw, 30):
        out["prometheusUrl"] = draw(st.sampled_from(("http://prometheus.monitoring:9090", "https://p.example/api")))
    for key, values in (("intervalSeconds", (1, 15, 600)), ("windowSeconds", (5, 60)), ("breachSeconds", (0, 30)),
                        ("scaleUpCooldownSeconds", (0, 60)), ("scaleDownCooldownSeconds", (0, 300, 86400))):
        if maybe(draw, 20):
            out[key] = draw(st.sampled_from(values))
    if maybe(draw, 20):
        low = draw(st.sampled_from((0.25, 0.5, 1.0)))
        out["prefillDecodeRatio"] = {"min": low, "max": low * draw(st.sampled_from((1, 2, 4)))}
    return out


def _toleration(draw: Draw) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if maybe(draw, 80):
        out["key"] = draw(st.sampled_from(("nvidia.com/gpu", "dedicated", "")))
    if maybe(draw, 70):
        out["operator"] = draw(st.sampled_from(("Exists", "Equal")))
    if out.get("operator") == "Equal" or maybe(draw, 20):
        out["value"] = draw(st.sampled_from(("true", "inference", "")))
    if maybe(draw, 60):
        out["effect"] = draw(st.sampled_from(("NoSchedule", "PreferNoSchedule", "NoExecute")))
    if out.get("effect") == "NoExecute" and maybe(draw, 50):
        out["tolerationSeconds"] = draw(st.integers(0, 86400))
    return out


def _pool(draw: Draw, name: str, roles: tuple[str, ...]) -> dict[str, Any]:
    pool: dict[str, Any] = {"name": name}
    selector = _selector(draw)
    if selector or maybe(draw, 20):
        pool["nodeSelector"] = selector
    if maybe(draw, 30):
        gpu: dict[str, Any] = {}
        if maybe(draw, 80):
            gpu["product"] = draw(st.sampled_from(("Auto", *CATALOG)))
        if maybe(draw, 40):
            gpu["perNode"] = draw(st.sampled_from((4, 8, 8, 2, 16)))
        pool["gpu"] = gpu
    if maybe(draw, 20):
        pool["interconnect"] = draw(st.sampled_from(_enum(api.Interconnect)))
    if maybe(draw, 15):
        pool["rdma"] = _rdma(draw)
    if maybe(draw, 8):
        backends: dict[str, Any] = {}
        if maybe(draw, 60):
            backends["all2all"] = draw(st.sampled_from(_enum(api.All2AllBackend)))
        if maybe(draw, 60):
            backends["moe"] = draw(st.sampled_from(_enum(api.MoeBackend)))
        pool["backends"] = backends
    if maybe(draw, 15):
        pool["tolerations"] = [_toleration(draw) for _ in range(draw(st.integers(1, 2)))]
    if maybe(draw, 10):
        pool["image"] = draw(st.sampled_from(("registry.example/vllm:0.33.0", "rocm/vllm:0.33.0")))
    for role in roles:
        pool[role] = _role(draw)
    if maybe(draw, 20):
        pool["mode"] = "Aggregated" if "aggregated" in roles else "Disaggregated"
    return pool


RDMA_RESOURCES = ("rdma/ib", "rdma/rdma_shared_device_a", "nvidia.com/hostdev")
RDMA_ENV = {"NCCL_IB_TIMEOUT": ("22",), "UCX_TLS": ("rc,cuda_copy", "rc_x,cuda_copy,cuda_ipc"),
            "NVSHMEM_QP_DEPTH": ("1024",), "NCCL_IB_GID_INDEX": ("3",), "GLOO_SOCKET_IFNAME": ("eth0",),
            "NIXL_LOG_LEVEL": ("INFO",)}
"""Fabric variables users set per pool (rdma.env takes no other prefix)."""


def _rdma(draw: Draw) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if maybe(draw, 40):
        out["resource"] = draw(st.sampled_from(RDMA_RESOURCES))
    if maybe(draw, 30):
        out["nicsPerGpu"] = draw(st.sampled_from((1, 1, 2, 4)))
    if maybe(draw, 40):
        out["hcas"] = draw(st.lists(st.sampled_from(("mlx5_0", "mlx5_1", "mlx5_2:1", "ibp0", "bnxt_re0")),
                                    min_size=1, max_size=4, unique=True))
    if maybe(draw, 30):
        out["gidIndex"] = draw(st.sampled_from((0, 3, 255)))
    if maybe(draw, 30):
        names = draw(st.lists(st.sampled_from(sorted(RDMA_ENV)), min_size=1, max_size=3, unique=True))
        out["env"] = [{"name": n, "value": draw(st.sampled_from(RDMA_ENV[n]))} for n in names]
    return out


SHAPES = ("aggregated", "pd-same-pool", "pd-split", "mixed", "free")


def _pools(draw: Draw) -> list[dict[str, Any]]:
    count = draw(st.sampled_from((1, 1, 1, 1, 2, 2, 3)))
    names = draw(st.lists(st.sampled_from(POOL_NAMES), min_size=count, max_size=count, unique=True))
    shape = draw(st.sampled_from(SHAPES))
    roles: list[tuple[str, ...]]
    if shape == "aggregated":
        roles = [("aggregated",)] * count
    elif shape == "pd-same-pool" or (shape == "pd-split" and count == 1):
        roles = [("prefill", "decode")] + [("aggregated",)] * (count - 1)
    elif shape == "pd-split":
        roles = [("prefill",), ("decode",)] + [draw(st.sampled_from((("prefill",), ("decode",), ("aggregated",))))
                                                for _ in range(count - 2)]
    elif shape == "mixed":
        roles = [draw(st.sampled_from((("aggregated",), ("prefill", "decode")))) for _ in range(count)]
    else:
        choices = (("aggregated",), ("prefill",), ("decode",), ("prefill", "decode"))
        roles = [draw(st.sampled_from(choices)) for _ in range(count)]
    return [_pool(draw, n, r) for n, r in zip(names, roles, strict=True)]


def _engine(draw: Draw) -> dict[str, Any]:
    e: dict[str, Any] = {}
    if maybe(draw, 10):
        e["image"] = "registry.example/vllm:0.33.0-custom"
    if maybe(draw, 40):
        e["maxModelLen"] = draw(st.one_of(st.sampled_from((4096, 8192, 32768, 131072, 262144, MAX_MODEL_LEN)),
                                          st.integers(1, MAX_MODEL_LEN)))
    if maybe(draw, 30):
        dtypes = get_args(api.Engine.model_fields["kv_cache_dtype"].annotation)[0]  # Literal[...] | None
        e["kvCacheDtype"] = draw(st.sampled_from(_enum(dtypes)))
    if maybe(draw, 25):
        e["kdaStateDtype"] = draw(st.sampled_from(_enum(api.Engine.model_fields["kda_state_dtype"].annotation)))
    for key in ("rustFrontend", "toolCalling", "reasoning"):
        if maybe(draw, 15):
            e[key] = draw(st.booleans())
    if maybe(draw, 35):
        pc: dict[str, Any] = {}
        if maybe(draw, 40):
            pc["enabled"] = draw(st.booleans())
        if maybe(draw, 70):
            policy = draw(st.sampled_from(("Interval", "Selective", "Dense")))
            pc["retention"] = {"policy": policy}
            if policy == "Interval":
                pc["retention"]["intervalTokens"] = draw(st.one_of(
                    st.sampled_from((4096, 8192, 32768, 1000)), st.integers(1, 1 << 24)))
        e["prefixCaching"] = pc
    if maybe(draw, 35):
        method = draw(st.sampled_from(("DSpark", "MTP")))
        sp: dict[str, Any] = {"method": method}
        if maybe(draw, 60):
            sp["numSpeculativeTokens"] = draw(st.integers(1, 16))
        if method == "DSpark":
            sp["draftModelUri"] = draw(st.sampled_from(DRAFT_URIS))
        e["speculative"] = sp
    if maybe(draw, 15):
        e["multimodal"] = {"maxImagesPerPrompt": draw(st.integers(0, 256))} if maybe(draw, 80) else {}
    if maybe(draw, 20):
        e["shutdownTimeoutSeconds"] = draw(st.sampled_from((0, 30, 300, 3600)))
    if maybe(draw, 30):
        args: list[str] = []
        for _ in range(draw(st.integers(1, 3))):
            if maybe(draw, 70):
                args.append(draw(st.sampled_from(SAFE_ARGS)))
            else:
                args.extend(draw(st.sampled_from(SAFE_ARG_PAIRS)))
        e["extraArgs"] = args
    if maybe(draw, 20):
        names = draw(st.lists(st.sampled_from(sorted(ENV)), min_size=1, max_size=3, unique=True))
        e["env"] = [{"name": n, **({"value": draw(st.sampled_from(ENV[n]))} if maybe(draw, 80) else {})}
                    for n in names]
    return e


def _model(draw: Draw) -> dict[str, Any]:
    m: dict[str, Any] = {"uri": draw(st.sampled_from(URIS))}
    if maybe(draw, 15):
        m["revision"] = draw(st.sampled_from(("main", "v1.0", "0123456789abcdef")))
    if maybe(draw, 20):
        m["servedName"] = draw(st.sampled_from(("kimi-k3", "k3", "moonshotai/Kimi-K3")))
    if maybe(draw, 50):
        ref = {"name": f"hf-token-{draw(st.text(string.hexdigits.lower()[:16], min_size=6, max_size=6))}"}
        if maybe(draw, 50):
            ref["key"] = draw(st.sampled_from(("token", "HF_TOKEN", "hf.token")))
        m["authSecretRef"] = ref
    if maybe(draw, 15):
        cache: dict[str, Any] = {}
        if maybe(draw, 50):
            cache["storageClassName"] = draw(st.sampled_from(("standard", "fast-rwx")))
        if maybe(draw, 60):
            cache["size"] = draw(st.sampled_from(QUANTITIES))
        m["cache"] = cache
    return m


ROUTER_POLICIES = POLICY_NAMES
ROUTER_AMOUNTS = ("250m", "1", "1.5", "4", "512Mi", "1Gi", "3Gi")
REQUEST_BYTES = ("512Ki", "1Mi", "30Mi", "40Mi", "512Mi", "513Mi")


def _router_settings(draw: Draw) -> dict[str, Any]:
    """The router's policies and resources, requests above limits included (a rule refuses them)."""
    router: dict[str, Any] = {}
    for key in ("policy", "prefillPolicy", "decodePolicy"):
        if maybe(draw, 30):
            router[key] = draw(st.sampled_from(ROUTER_POLICIES))
    if maybe(draw, 30):
        router["resources"] = {
            part: {r: draw(st.sampled_from(ROUTER_AMOUNTS)) for r in ("cpu", "memory") if maybe(draw, 50)}
            for part in ("requests", "limits") if maybe(draw, 60)}
    if maybe(draw, 20):
        router["admission"] = {k: draw(st.integers(lo, hi)) for k, lo, hi in (
            ("maxConcurrentRequests", 1, 4096), ("queueSize", 0, 1024), ("queueTimeoutSeconds", 1, 600))
            if maybe(draw, 60)}
        if maybe(draw, 30):  # the front's body limit, its bounds (1Mi, 512Mi) straddled
            router["admission"]["maxRequestBytes"] = draw(st.sampled_from(REQUEST_BYTES))
    if maybe(draw, 15):
        router["apiKey"] = {"name": "clients", **({"key": "key"} if maybe(draw, 50) else {})}
    if maybe(draw, 20):
        router["implementation"] = draw(st.sampled_from(("KimiK3Router", "VllmRouter")))
    if maybe(draw, 10):
        router["watchdog"] = {k: draw(st.integers(1, 3600)) for k in ("firstTokenSeconds", "idleGapSeconds")
                              if maybe(draw, 60)}
    return router


GATEWAY_HOSTS = ("k3.example.com", "*.example.com", "api", "*.k3", "K3.example.com", "k3.example.com:443", "*",
                 "10.0.0.1", "-k3.example.com")
"""Host names a user may write, and a few Gateway API refuses (a capital, a port, a bare `*`)."""


def _gateway(draw: Draw) -> dict[str, Any]:
    """The Gateway to attach to; now and then a name, namespace or listener Gateway API refuses."""
    gateway: dict[str, Any] = {"name": draw(st.sampled_from(("public", "edge.gw", "Public", "-gw")))}
    if maybe(draw, 40):
        gateway["namespace"] = draw(st.sampled_from(("gateways", "infra-gw", "Gateways", "a.b")))
    if maybe(draw, 30):
        gateway["sectionName"] = draw(st.sampled_from(("https", "web.tls", "HTTPS")))
    if maybe(draw, 40):
        gateway["hostnames"] = draw(st.lists(st.sampled_from(GATEWAY_HOSTS), max_size=3))
    return gateway


def _selector_spec(draw: Draw) -> dict[str, Any]:
    """A meta/v1 label selector; now and then a requirement whose values do not fit its operator."""
    out: dict[str, Any] = {}
    if maybe(draw, 50):
        out["matchLabels"] = _selector(draw) if maybe(draw, 90) else {"not a key!": "x"}
    if maybe(draw, 50):
        operator = draw(st.sampled_from(("In", "NotIn", "Exists", "DoesNotExist")))
        fits = maybe(draw, 80)
        has_values = (operator in ("In", "NotIn")) == fits
        out["matchExpressions"] = [{"key": "app", "operator": operator,
                                    **({"values": ["envoy"]} if has_values else {})}]
    return out


def _network(draw: Draw) -> dict[str, Any]:
    """spec.network: peers as users write them, now and then one that is neither or both kinds."""
    def peer() -> dict[str, Any]:
        # tuples, not sets: the draws below follow this order, which must not depend on string hashes
        kinds = (draw(st.sampled_from((("podSelector",), ("namespaceSelector",), ("podSelector", "namespaceSelector"),
                                       ("ipBlock",)))) if maybe(draw, 85)
                 else draw(st.sampled_from(((), ("ipBlock", "podSelector")))))
        return {k: ({"cidr": draw(st.sampled_from(("10.0.0.0/8", "192.168.1.0/24", "fd00::/64")))}
                    if k == "ipBlock" else _selector_spec(draw)) for k in kinds}
    network: dict[str, Any] = {}
    if maybe(draw, 30):
        network["policies"] = draw(st.booleans())
    for key in ("clients", "metricsFrom"):
        if maybe(draw, 50):
            network[key] = [peer() for _ in range(draw(st.integers(1, 2)))]
    return network


@st.composite
def plausible_bodies(draw: Draw) -> dict[str, Any]:
    """A deployment a user could plausibly write (it may still be refused, by a rule or the planner)."""
    name = draw(st.one_of(st.sampled_from(("k3", "k3-pd", "kimi")),
                          st.from_regex(r"[a-z]([-a-z0-9]{0,70}[a-z0-9])?", fullmatch=True)))
    spec: dict[str, Any] = {"model": _model(draw), "pools": _pools(draw)}
    if maybe(draw, 55):
        spec["engine"] = _engine(draw)
    if maybe(draw, 10):
        spec["router"] = {"replicas": draw(st.integers(0, 64))}
    if maybe(draw, 30):
        w: dict[str, Any] = {}
        if maybe(draw, 60):
            w["inputTokens"] = draw(st.sampled_from((1024, 8192, 32768, 131072, 1)))
        if maybe(draw, 60):
            w["outputTokens"] = draw(st.sampled_from((128, 1024, 4096, 1)))
        if maybe(draw, 70):
            w["requestsPerSecond"] = draw(st.one_of(st.sampled_from((0.1, 1.0, 5.0, 50.0, 1000.0)),
                                                    st.floats(0.001, 100000)))
        if maybe(draw, 20):  # mostly within what the drafts allow (1 + k); sometimes past it (refused)
            speculative = spec.get("engine", {}).get("speculative")
            most = 1 + speculative.get("numSpeculativeTokens", 7) if speculative and maybe(draw, 85) else 17
            w["acceptanceLength"] = draw(st.floats(1, most))
        spec["workload"] = w
    if maybe(draw, 20):
        slo: dict[str, Any] = {}
        if maybe(draw, 60):
            slo["ttftMilliseconds"] = draw(st.sampled_from((1, 200, 2000, 10000, 3600000)))
        if maybe(draw, 60):
            slo["itlMilliseconds"] = draw(st.sampled_from((1, 10, 20, 50, 60000)))
        spec["slo"] = slo
    if maybe(draw, 15):
        spec["experimental"] = {"acceptKnownIssues": draw(st.lists(st.sampled_from(("vllm#52627", "vllm#1")),
                                                                  max_size=2, unique=True))}
    if maybe(draw, 10):
        spec["autoscaling"] = _autoscaling(draw)
    if maybe(draw, 15):
        spec["router"] = {**spec.get("router", {}), **_router_settings(draw)}
    if maybe(draw, 15):
        spec["network"] = _network(draw)
    if maybe(draw, 10):  # last: the draws before it stay those of the examples before it existed
        spec["router"] = {**spec.get("router", {}), "gateway": _gateway(draw)}
    return {"apiVersion": f"{v1.GROUP}/{v1.VERSION}", "kind": v1.KIND, "metadata": {"name": name}, "spec": spec}
