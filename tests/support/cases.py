"""Shared test inputs: a valid base deployment and one negative example per cross-field rule.

The unit tests feed the negative examples to pydantic, the e2e tests to the real API server
(CEL); both must answer with the rule's own message.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from kimik3_operator.api import SpecModel, role_settings, spec
from kimik3_operator.api import v1alpha1 as v1

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))


def base_deployment(name: str = "k3-test", namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": f"{v1.GROUP}/{v1.VERSION}",
        "kind": v1.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"uri": "hf://moonshotai/Kimi-K3"},
            "pools": [{
                "name": "gb300",
                "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GB300"},
                "aggregated": {"replicas": 1, "parallelism": {"tensor": 8}},
            }],
        },
    }


def _pool(d: dict[str, Any]) -> dict[str, Any]:
    return d["spec"]["pools"][0]


def _edit(fn: Callable[[dict[str, Any]], None]) -> Callable[[], dict[str, Any]]:
    def build() -> dict[str, Any]:
        d = copy.deepcopy(base_deployment())
        fn(d)
        return d
    return build


INVALID: dict[str, Callable[[], dict[str, Any]]] = {
    "retention policy Interval needs intervalTokens": _edit(
        lambda d: d["spec"].update(engine={"prefixCaching": {"retention": {"policy": "Interval"}}})),
    "intervalTokens applies only to retention policy Interval": _edit(
        lambda d: d["spec"].update(
            engine={"prefixCaching": {"retention": {"policy": "Dense", "intervalTokens": 4096}}})),
    "speculative method DSpark needs draftModelUri (a K3DSparkModel checkpoint)": _edit(
        lambda d: d["spec"].update(engine={"speculative": {"method": "DSpark"}})),
    "tensor parallel size must divide the 96 KDA heads": _edit(
        lambda d: _pool(d)["aggregated"].update(parallelism={"tensor": 5})),
    "a pool needs at least one role: prefill, decode or aggregated": _edit(
        lambda d: _pool(d).pop("aggregated")),
    "a pool is either aggregated or disaggregated (prefill/decode), not both": _edit(
        lambda d: _pool(d).update(prefill={"replicas": 1}, decode={"replicas": 1})),
    "mode Aggregated needs the aggregated role": _edit(
        lambda d: (_pool(d).pop("aggregated"), _pool(d).update(mode="Aggregated", decode={"replicas": 1}),
                   d["spec"]["pools"].append({"name": "p", "prefill": {"replicas": 1}}))),
    "mode Disaggregated takes prefill and/or decode roles, not aggregated": _edit(
        lambda d: _pool(d).update(mode="Disaggregated")),
    "prefill and decode come together: a prefill role needs a decode role in the same "
    "KimiK3Deployment, and a decode role needs a prefill role": _edit(
        lambda d: (_pool(d).pop("aggregated"), _pool(d).update(prefill={"replicas": 1}))),
}


def all_rules() -> list[tuple[type, str]]:
    """Every (model, rule message) declared anywhere in the API."""
    out = []
    for obj in {**vars(spec), **vars(role_settings)}.values():
        if isinstance(obj, type) and issubclass(obj, SpecModel) and obj is not SpecModel:
            out += [(obj, r.message) for r in obj.__dict__.get("rules", ())]
    return out


def load_examples() -> list[tuple[str, dict[str, Any]]]:
    return [(p.name, yaml.safe_load(p.read_text())) for p in EXAMPLES]

INVALID["a rollout needs room to move: maxSurge or maxUnavailable must be at least 1 (maxSurge 0 with "
        "maxUnavailable 1 updates in place on a cluster sized for one copy)"] = _edit(
    lambda d: d["spec"].update(rollout={"maxSurge": 0, "maxUnavailable": 0}))
INVALID["env sets a variable the operator owns: " + ", ".join(spec.OWNED_ENV)] = _edit(
    lambda d: d["spec"].update(engine={"env": [{"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "0.0.0.0"}]}))
INVALID["env sets a VLLM_* variable vLLM 0.33.0 does not know (it would refuse to start)"] = _edit(
    lambda d: d["spec"].update(engine={"env": [{"name": "VLLM_ROUTER_SERVICE_HOST", "value": "10.0.0.1"}]}))
INVALID["decodePolicy: PrecisePrefix picks prefill and aggregated engines only (a decode's cache holds what its "
        "prefill handed over); pick a decode engine by load, e.g. CacheAware or StickyLeastLoaded"] = _edit(
    lambda d: d["spec"].update(router={"decodePolicy": "PrecisePrefix"}))
INVALID["VllmRouter has no PrecisePrefix policy: use implementation KimiK3Router, or another policy"] = _edit(
    lambda d: d["spec"].update(router={"implementation": "VllmRouter", "policy": "PrecisePrefix"}))
INVALID["router: PrecisePrefix follows the engines' prefix caches, which engine.prefixCaching.enabled false turns "
        "off: enable prefix caching or pick another policy"] = _edit(
    lambda d: d["spec"].update(router={"policy": "PrecisePrefix"}, engine={"prefixCaching": {"enabled": False}}))
INVALID["router resources: the memory request exceeds the memory limit"] = _edit(
    lambda d: d["spec"].update(router={"resources": {"requests": {"memory": "3Gi"}}}))  # the default limit is 2Gi
INVALID["router resources: the CPU request exceeds the CPU limit"] = _edit(
    lambda d: d["spec"].update(router={"resources": {"limits": {"cpu": "500m"}}}))  # the default request is 1
INVALID["a network peer is an ipBlock, or a podSelector and/or namespaceSelector, not both, not neither"] = _edit(
    lambda d: d["spec"].update(network={"clients": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}))
INVALID["a selector requirement has values exactly when its operator is In or NotIn"] = _edit(
    lambda d: d["spec"].update(network={"clients": [{"podSelector": {"matchExpressions": [
        {"key": "app", "operator": "In"}]}}]}))
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
INVALID["a node selector requirement has values exactly when its operator is In or NotIn, or one integer value "
        "for Gt and Lt"] = _edit(
    lambda d: _pool(d)["aggregated"].update(scheduling={"nodeAffinity": {REQUIRED: {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Exists", "values": ["a"]}]}]}}}))
INVALID["Gt and Lt take exactly one integer value"] = _edit(
    lambda d: d["spec"].update(router={"scheduling": {"nodeAffinity": {PREFERRED: [
        {"weight": 10, "preference": {"matchExpressions": [
            {"key": "cores", "operator": "Gt", "values": ["many"]}]}}]}}}))
INVALID["matchLabels keys must be label keys: an optional DNS prefix and '/', then a name"] = _edit(
    lambda d: d["spec"].update(network={"metricsFrom": [{"namespaceSelector": {"matchLabels": {"a b": "x"}}}]}))
INVALID["multimodal.allowedMediaDomains and fetchTimeoutSeconds need rustFrontend: false (vLLM "
        f"{spec.VLLM_VERSION}'s Rust frontend refuses --allowed-media-domains at start and applies its own "
        "policy: no media from private, loopback or link-local addresses)"] = _edit(
    lambda d: d["spec"].update(engine={"multimodal": {"allowedMediaDomains": ["images.example.com"]}}))
INVALID[f"extraArgs sets an option the Rust frontend of vLLM {spec.VLLM_VERSION} does not implement (it exits at "
        "start on it); remove it or set rustFrontend: false"] = _edit(
    lambda d: d["spec"].update(engine={"extraArgs": ["--enforce-eager", "--max_log_len=100"]}))
INVALID[f"tracing needs rustFrontend: false (vLLM {spec.VLLM_VERSION}'s Rust frontend exits at start on "
        "--otlp-traces-endpoint)"] = _edit(
    lambda d: d["spec"].update(engine={"tracing": {"endpoint": "http://otel-collector.monitoring:4317"}}))
INVALID["pods.labels has a key that is not a label key (an optional DNS-subdomain prefix and /, then a name of "
        "at most 63 letters, digits, '-', '_' or '.')"] = _edit(
    lambda d: d["spec"].update(pods={"labels": {"team": "ml", "Bad Key/x": "1"}}))
INVALID["pods.annotations has a key that is not a label key (an optional DNS-subdomain prefix and /, then a name "
        "of at most 63 letters, digits, '-', '_' or '.')"] = _edit(
    lambda d: d["spec"].update(pods={"annotations": {"example.com/" + "x" * 64: "1"}}))
INVALID["pods.labels sets a label the operator, LeaderWorkerSet or Kueue owns"] = _edit(
    lambda d: d["spec"].update(pods={"labels": {"team": "ml", "app.kubernetes.io/component": "x"}}))
INVALID["pods.annotations sets an annotation the operator, LeaderWorkerSet or Kueue owns"] = _edit(
    lambda d: d["spec"].update(pods={"annotations": {"kueue.x-k8s.io/podset": "main"}}))
INVALID["extraArgs sets a flag the operator owns"] = _edit(
    lambda d: d["spec"].update(engine={"extraArgs": ["--max-num-seqs=64", "--tensor-parallel-size=4"]}))
INVALID["an hf:// repository id has no '--' or '..' and does not end in .git (the Hub refuses them)"] = _edit(
    lambda d: d["spec"]["model"].update(uri="hf://moonshotai/Kimi--K3"))
INVALID["a pvc:// path stays inside its claim: no '..' in it"] = _edit(
    lambda d: d["spec"]["model"].update(uri="pvc://weights/../kimi-k3"))
INVALID["endpoint must be https:// (set allowInsecureEndpoint to allow plain http://)"] = _edit(
    lambda d: d["spec"]["model"].update(endpoint="http://hf-mirror.internal"))
INVALID["readThroughput is bytes per second a node reads the weights at: from 10M to 10T "
        "(1G is an NFS-class share)"] = _edit(lambda d: d["spec"]["model"].update(readThroughput="1"))
INVALID["maxRequestBytes is the largest request body a router pod takes: from 1Mi to 512Mi"] = _edit(
    lambda d: d["spec"].update(router={"admission": {"maxRequestBytes": "1Gi"}}))
INVALID["servedName is the model's name, not a flag: it must not start with '-'"] = _edit(
    lambda d: d["spec"]["model"].update(servedName="--trust-remote-code"))
INVALID["revision is a branch, tag or commit, not a flag: it must not start with '-'"] = _edit(
    lambda d: d["spec"]["model"].update(revision="--dest=/cache/other"))
INVALID["autoscaling: minReplicas must not exceed maxReplicas"] = _edit(
    lambda d: _pool(d)["aggregated"].update(autoscaling={"minReplicas": 3, "maxReplicas": 2, "mode": "HPA"}))
INVALID["rdma.env takes only NCCL_*, UCX_*, NVSHMEM_*, NIXL_*, GLOO_* variables (never VLLM_*: the engines "
        "refuse unknown ones)"] = _edit(
    lambda d: _pool(d).update(rdma={"env": [{"name": "NCCL_IB_HCA", "value": "mlx5"},
                                            {"name": "VLLM_NIXL_ABORT_REQUEST_TIMEOUT", "value": "60"}]}))
INVALID["interconnect xGMI is AMD Instinct's fabric: it needs gpu.product MI355X (or Auto)"] = _edit(
    lambda d: _pool(d).update(interconnect="xGMI", gpu={"product": "GB300"}))
INVALID["interconnect NVLink is NVIDIA's fabric: MI355X boards use xGMI"] = _edit(
    lambda d: _pool(d).update(interconnect="NVLink", gpu={"product": "MI355X"}))
INVALID["maxNumBatchedTokens must be at least maxNumSeqs (vLLM refuses fewer)"] = _edit(
    lambda d: _pool(d)["aggregated"].update(engine={"maxNumSeqs": 512, "maxNumBatchedTokens": 256}))
INVALID["eplb.redundantExperts needs eplb.enabled (vLLM keeps redundant experts only with EPLB)"] = _edit(
    lambda d: _pool(d)["aggregated"].update(engine={"eplb": {"enabled": False, "redundantExperts": 16}}))
INVALID["prefillDecodeRatio: min must not exceed max"] = _edit(
    lambda d: d["spec"].update(autoscaling={"prefillDecodeRatio": {"min": 2, "max": 0.5}}))


def _slo_mode_without_target(role: str) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        pool = _pool(d)
        if role != "aggregated":
            pool.pop("aggregated")
            pool.update(prefill={"replicas": 1}, decode={"replicas": 2})
        pool[role]["autoscaling"] = {"maxReplicas": 4}  # mode SLO by default, and no spec.slo
    return edit


for _role, _targets in spec.SLO_TARGETS.items():
    INVALID[f"autoscaling mode SLO on a {_role} role needs spec.slo." + " or spec.slo.".join(_targets)
            + " (the latency it scales toward); or choose mode KEDA or HPA"] = _edit(_slo_mode_without_target(_role))
