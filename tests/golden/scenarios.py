"""The golden scenarios: one deployment each, planned against `all_pools()`, with the leader pods
the operator saw (the routers list them)."""

from __future__ import annotations

from typing import Any

from tests.support.cases import base_deployment

GB300 = {"nvidia.com/gpu.product": "NVIDIA-GB300"}
DSPARK = {"speculative": {"method": "DSpark", "numSpeculativeTokens": 7,
                          "draftModelUri": "hf://moonshotai/Kimi-K3-DSpark"}}


def _deployment(name: str, pools: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    body = base_deployment(name=name, namespace="inference")
    body["spec"]["model"]["authSecretRef"] = {"name": "hf-token", "key": "token"}
    body["spec"]["pools"] = pools
    body["spec"].update(spec)
    return body


SCENARIOS: dict[str, dict[str, Any]] = {
    "gb300-tp8-aggregated": _deployment("k3", [
        {"name": "gb300", "nodeSelector": GB300, "aggregated": {"replicas": 2, "parallelism": {"tensor": 8}}}]),
    "gb300-tp16-dspark": _deployment("k3-fast", [
        {"name": "gb300", "nodeSelector": GB300, "aggregated": {"replicas": 1, "parallelism": {"tensor": 16}}}],
        engine=DSPARK),
    "b200-dep16-disaggregated": _deployment("k3-b200", [
        {"name": "b200", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-B200"},
         "rdma": {"hcas": [f"mlx5_{i}" for i in range(8)], "gidIndex": 3,
                  "env": [{"name": "NCCL_IB_QPS_PER_CONNECTION", "value": "2"}]},
         "prefill": {"replicas": 1, "parallelism": {"tensor": 8, "data": 2, "expert": True}},
         "decode": {"replicas": 2, "parallelism": {"tensor": 8, "data": 2, "expert": True}}}],
        engine={"prefixCaching": {"retention": {"policy": "Interval", "intervalTokens": 32768}}},
        experimental={"acceptKnownIssues": []}),
    # the Python frontend with traces (leader and headless worker), and spec.pods on every pod
    "h200-16": _deployment("k3-h200", [
        {"name": "h200", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"}, "aggregated": {"replicas": 1}}],
        engine={"rustFrontend": False, "tracing": {"endpoint": "http://otel-collector.monitoring:4317",
                                                   "samplingRatio": 0.05, "detailed": ["worker"],
                                                   "routerEndpoint": "http://otel-collector.monitoring:4318/v1/traces"}},
        pods={"labels": {"team": "ml-platform"}, "annotations": {"sidecar.istio.io/inject": "false"},
              "imagePullSecrets": [{"name": "regcred"}]}),
    "mi355x-tp8": _deployment("k3-amd", [
        {"name": "mi355x", "nodeSelector": {"amd.com/gpu.product-name": "AMD_Instinct_MI355X"},
         "aggregated": {"replicas": 1}}]),
    "gb300-prefill-rack-a-decode-rack-b": _deployment("k3-racks", [
        {"name": "rack-a", "nodeSelector": {**GB300, "nvidia.com/gpu.clique": "cluster.a"},
         "prefill": {"replicas": 1, "parallelism": {"tensor": 8, "data": 2, "expert": True}}},
        {"name": "rack-b", "nodeSelector": {**GB300, "nvidia.com/gpu.clique": "cluster.b"},
         "decode": {"replicas": 3, "parallelism": {"tensor": 8}}}],
        engine=DSPARK, router={"prefillPolicy": "PrecisePrefix"}),  # KV events on a multi-node prefill
    "gb300-pd-one-clique": _deployment("k3-clique", [
        {"name": "rack-a", "nodeSelector": {**GB300, "nvidia.com/gpu.clique": "cluster.a"},
         "prefill": {"replicas": 2, "parallelism": {"tensor": 8, "expert": True}},
         "decode": {"replicas": 2, "parallelism": {"tensor": 8}}}]),
}


LEADER_IPS: dict[str, dict[tuple[str, str], tuple[str, ...]]] = {
    "gb300-tp8-aggregated": {("gb300", "aggregated"): ("10.244.0.12", "10.244.0.4")},
    "gb300-tp16-dspark": {("gb300", "aggregated"): ("10.244.1.3",)},
    "b200-dep16-disaggregated": {("b200", "prefill"): ("10.244.2.21",),
                                 ("b200", "decode"): ("10.244.2.9", "10.244.2.30")},
    "h200-16": {("h200", "aggregated"): ("10.244.3.2",)},
    "mi355x-tp8": {("mi355x", "aggregated"): ("10.244.4.7",)},
    "gb300-prefill-rack-a-decode-rack-b": {("rack-a", "prefill"): ("10.244.5.40",),
                                           ("rack-b", "decode"): ("10.244.6.3", "10.244.6.11", "10.244.6.7")},
    "gb300-pd-one-clique": {("rack-a", "prefill"): ("10.244.7.5", "10.244.7.9"),
                            ("rack-a", "decode"): ("10.244.7.20", "10.244.7.14")},
}
"""Pod IPs of each scenario's ready leader pods, one per replica, listed out of order: the router
arguments show them sorted."""


def leader_pods(name: str, compat_hash: str) -> list[dict[str, Any]]:
    """The ready leader pods of scenario `name`, all of revision `compat_hash`."""
    return [{"metadata": {"labels": {"serving.kimik3.dev/pool": pool, "serving.kimik3.dev/role": role,
                                     "serving.kimik3.dev/compat-hash": compat_hash,
                                     "leaderworkerset.sigs.k8s.io/worker-index": "0"}},
             "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}
            for (pool, role), ips in LEADER_IPS[name].items() for ip in ips]
