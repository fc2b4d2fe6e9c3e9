"""Node objects as the API server returns them, for pure planner tests."""

from __future__ import annotations

from typing import Any


def node(name: str, product: str, gpus: int, *, clique: str | None = None, rdma: str | None = None,
         rdma_count: int | None = None, arch: str = "amd64", resource: str = "nvidia.com/gpu",
         unschedulable: bool = False) -> dict[str, Any]:
    """A schedulable GPU node; `rdma` names its NIC resource, `rdma_count` units (one NIC per GPU
    when omitted, as HGX and GB300 trays have)."""
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/arch": arch}
    if resource == "nvidia.com/gpu":
        labels["nvidia.com/gpu.product"] = product
    else:
        labels["amd.com/gpu.product-name"] = product
    if clique:
        labels["nvidia.com/gpu.clique"] = clique
    capacity = {"cpu": "128", "memory": "2Ti", resource: str(gpus)}
    if rdma:
        capacity[rdma] = str(gpus if rdma_count is None else rdma_count)
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def gb300_rack(rack: str = "a", trays: int = 18) -> list[dict[str, Any]]:
    return [node(f"gb300-{rack}-{i}", "NVIDIA-GB300", 4, clique=f"cluster.{rack}", rdma="rdma/ib", arch="arm64")
            for i in range(trays)]


def b200_nodes(count: int = 4) -> list[dict[str, Any]]:
    return [node(f"b200-{i}", "NVIDIA-B200", 8, rdma="rdma/ib") for i in range(count)]


def h200_nodes(count: int = 2) -> list[dict[str, Any]]:
    return [node(f"h200-{i}", "NVIDIA-H200", 8, rdma="rdma/ib") for i in range(count)]


def mi355x_nodes(count: int = 2) -> list[dict[str, Any]]:
    return [node(f"mi355x-{i}", "AMD_Instinct_MI355X", 8, rdma="rdma/ib", resource="amd.com/gpu")
            for i in range(count)]


def all_pools() -> list[dict[str, Any]]:
    """Every kind of node the golden scenarios run on: two NVL72 racks, HGX B200/H200, MI355X."""
    return gb300_rack("a") + gb300_rack("b") + b200_nodes() + h200_nodes() + mi355x_nodes()
