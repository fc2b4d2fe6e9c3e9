"""What a cluster needs before a KimiK3Deployment can serve on it, judged from what the cluster serves
and what its nodes advertise (`kimik3 preflight`; docs/install.md has the same matrix in prose).

Pure: the caller reads the served API kinds, the nodes and the StorageClasses (k8s/preflight.py).
One row per requirement (REQUIREMENTS): what it is, what needs it, and what to install when it is
missing. A row's verdict is `ok`, `missing` (a deployment that needs it cannot serve) or `warn`
(some deployments need it: say which), with what was found.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from ..contract.kinds import COMPUTE_DOMAIN, HTTP_ROUTE, LEADER_WORKER_SET, SCALED_OBJECT
from ..contract.kueue import WORKLOAD_API_VERSION, WORKLOAD_KIND
from ..gpus import BY_PRODUCT
from .facts import NodeFacts, node_facts

Verdict = Literal["ok", "missing", "warn"]


@dataclass(frozen=True)
class ClusterView:
    """What preflight reads: the (apiVersion, kind) pairs the API server serves, the nodes (wire form)
    and the StorageClasses (wire form)."""

    served: frozenset[tuple[str, str]]
    nodes: Sequence[Mapping[str, Any]]
    storage_classes: Sequence[Mapping[str, Any]]

    @cached_property
    def gpu_nodes(self) -> tuple[NodeFacts, ...]:
        """Read once: four requirements judge the GPU nodes, on clusters of thousands of nodes."""
        return tuple(f for f in map(node_facts, self.nodes) if f.gpu_resource and f.gpus > 0)


@dataclass(frozen=True)
class Finding:
    requirement: str
    verdict: Verdict
    found: str
    hint: str
    """What to do when the verdict is not ok."""


@dataclass(frozen=True)
class Requirement:
    name: str
    needed_for: str
    judge: Callable[[ClusterView], tuple[Verdict, str]]
    hint: str


def _served(api_version: str, kind: str, absent: Verdict = "missing",
            consequence: str = "") -> Callable[[ClusterView], tuple[Verdict, str]]:
    def judge(view: ClusterView) -> tuple[Verdict, str]:
        if (api_version, kind) in view.served:
            return "ok", f"{kind} {api_version} served"
        return absent, f"no {kind} {api_version}" + (f": {consequence}" if consequence else "")
    return judge


def _optional(api_version: str, kind: str, needed_for: str) -> Callable[[ClusterView], tuple[Verdict, str]]:
    return _served(api_version, kind, "warn", f"{needed_for} cannot be used")


def _gpu_nodes(view: ClusterView) -> tuple[Verdict, str]:
    nodes = view.gpu_nodes
    if not nodes:
        return "missing", "no node advertises nvidia.com/gpu or amd.com/gpu"
    known = [n for n in nodes if n.product]
    unknown = sorted({n.product_label or "(no product label)" for n in nodes if not n.product})
    products = ", ".join(f"{p} x{sum(1 for n in known if n.product == p)}"
                         for p in sorted({n.product for n in known if n.product}))
    if not known:
        return "missing", f"{len(nodes)} GPU node(s), none with a product label the catalog knows: {unknown}"
    return ("warn" if unknown else "ok"), (f"{len(nodes)} GPU node(s): {products}"
                                           + (f"; unknown product labels: {unknown}" if unknown else ""))


def _nvl_nodes(view: ClusterView) -> list[NodeFacts]:
    return [n for n in view.gpu_nodes if n.product and BY_PRODUCT[n.product].multi_node_nvlink]


def _cliques(view: ClusterView) -> tuple[Verdict, str]:
    racks = _nvl_nodes(view)
    if not racks:
        return "ok", "no NVL72 node (not needed)"
    bare = [n.name for n in racks if not n.clique]
    if bare:
        return "warn", f"{len(bare)} of {len(racks)} NVL72 node(s) without nvidia.com/gpu.clique, e.g. {bare[0]}"
    return "ok", f"{len(racks)} NVL72 node(s) in {len({n.clique for n in racks})} clique(s)"


def _compute_domains(view: ClusterView) -> tuple[Verdict, str]:
    if not _nvl_nodes(view):
        return "ok", "no NVL72 node (not needed)"
    return _served(COMPUTE_DOMAIN.api_version, COMPUTE_DOMAIN.kind, "warn",
                   "NVL72 nodes, but replicas spanning trays cannot share NVLink")(view)


def _rdma(view: ClusterView) -> tuple[Verdict, str]:
    boards = [n for n in view.gpu_nodes if not (n.product and BY_PRODUCT[n.product].multi_node_nvlink)]
    if not boards:
        return "ok", "no HGX/OAM GPU node (not needed)"
    with_rdma = [n for n in boards if n.rdma_resources]
    if not with_rdma:
        return "warn", (f"none of {len(boards)} HGX/OAM GPU node(s) advertises an RDMA resource: replicas "
                        "spanning nodes and P/D KV transfer across nodes cannot use RDMA")
    names = sorted({r for n in with_rdma for r in n.rdma_resources})
    return "ok", f"{len(with_rdma)} of {len(boards)} HGX/OAM GPU node(s) advertise {', '.join(names)}"


def _storage(view: ClusterView) -> tuple[Verdict, str]:
    if not view.storage_classes:
        return "missing", "no StorageClass: the weights cache claim (ReadWriteMany) cannot be provisioned"
    default = [c["metadata"]["name"] for c in view.storage_classes
               if ((c.get("metadata") or {}).get("annotations") or {}).get(
                   "storageclass.kubernetes.io/is-default-class") == "true"]
    names = ", ".join(sorted(c["metadata"]["name"] for c in view.storage_classes))
    if not default:
        return "warn", f"no default StorageClass (have: {names}): set spec.model.cache.storageClassName"
    return "ok", f"default {default[0]} (have: {names}); it must offer ReadWriteMany"


REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement("LeaderWorkerSet", "every deployment (one per pool and role)",
                _served(LEADER_WORKER_SET.api_version, LEADER_WORKER_SET.kind),
                "install LeaderWorkerSet v0.9 or newer (sigs.k8s.io/lws)"),
    Requirement("GPU nodes", "every deployment",
                _gpu_nodes,
                "install the NVIDIA GPU Operator or AMD GPU Operator with GPU Feature Discovery (node labels "
                "nvidia.com/gpu.product or amd.com/gpu.product-name, allocatable nvidia.com/gpu or amd.com/gpu)"),
    Requirement("NVLink cliques", "GB200/GB300 NVL72 replicas spanning trays",
                _cliques,
                "GPU Feature Discovery publishes nvidia.com/gpu.clique on NVL72 trays (IMEX-capable drivers)"),
    Requirement("ComputeDomain", "GB200/GB300 NVL72 replicas spanning trays (multi-node NVLink)",
                _compute_domains, "install NVIDIA's DRA driver for GPUs with ComputeDomains (resource.nvidia.com)"),
    Requirement("RDMA", "HGX/OAM replicas spanning nodes; prefill/decode KV transfer across nodes",
                _rdma, "install an RDMA device plugin (e.g. NVIDIA Network Operator's rdma/ib resources)"),
    Requirement("Storage", "the weights cache (one ReadWriteMany claim per deployment)",
                _storage, "a StorageClass with ReadWriteMany (NFS, CephFS, Lustre, a cloud file service)"),
    Requirement("Prometheus Operator", "the chart's ServiceMonitor, PodMonitors and PrometheusRule",
                _optional("monitoring.coreos.com/v1", "ServiceMonitor", "metrics.*.enabled"),
                "install kube-prometheus-stack (docs/monitoring.md)"),
    Requirement("KEDA", "autoscaling mode KEDA", _optional(SCALED_OBJECT.api_version, SCALED_OBJECT.kind, "mode KEDA"),
                "install KEDA 2.x"),
    Requirement("Kueue", "spec.pools[].<role>.queueName", _optional(WORKLOAD_API_VERSION, WORKLOAD_KIND, "queueName"),
                "install Kueue (docs/queues.md)"),
    Requirement("Gateway API", "spec.router.gateway", _optional(HTTP_ROUTE.api_version, HTTP_ROUTE.kind,
                                                                "spec.router.gateway"),
                "install the Gateway API CRDs and a Gateway controller"),
)


def preflight(view: ClusterView) -> list[Finding]:
    """One finding per requirement, in REQUIREMENTS' order."""
    out = []
    for req in REQUIREMENTS:
        verdict, found = req.judge(view)
        out.append(Finding(req.name, verdict, found, "" if verdict == "ok" else req.hint))
    return out


def table(findings: Sequence[Finding]) -> str:
    rows = [("REQUIREMENT", "NEEDED FOR", "VERDICT", "FOUND / TO DO")]
    by_name = {r.name: r for r in REQUIREMENTS}
    for f in findings:
        rows.append((f.requirement, by_name[f.requirement].needed_for, f.verdict,
                     f.found + (f" -> {f.hint}" if f.hint else "")))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)), r[3]]) for r in rows)
