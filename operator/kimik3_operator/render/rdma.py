"""The fabric settings of a serving container: NIXL's UCX transports, and NCCL/NVSHMEM on RDMA.

What each setting is for, and whose recipe it follows:
- KV over multi-node NVLink (planner/fabric.py rule 4): NIXL's UCX backend moves GPU memory with
  `cuda_ipc`, which reaches another tray only with UCX_CUDA_IPC_ENABLE_MNNVL; llm-d's GB200
  DeepSeek-V4 decode pods set exactly `UCX_TLS=cuda_copy,cuda_ipc,tcp` and
  `UCX_CUDA_IPC_ENABLE_MNNVL=y` (llm-d/llm-d guides/wide-ep-lws/modelserver/gpu/vllm-deepseek-v4/
  base/decode.yaml).
- KV over RDMA: `rc` (RDMA reliable connection, GPUDirect) for the transfer, `cuda_copy`/`cuda_ipc`
  for staging on the node, as the NIXL P/D recipes of LightLLM and SGLang do (`UCX_TLS=rc,cuda,...`);
  UCX_NET_DEVICES takes `<hca>:<port>` (port 1 when not given) and UCX_IB_GID_INDEX the RoCE GID.
- Collectives across RDMA (a replica spanning nodes): NCCL_IB_HCA selects the HCAs and
  NCCL_IB_GID_INDEX the RoCE address (llm-d's CoreWeave overlay sets NCCL_IB_HCA and
  NVSHMEM_HCA_PREFIX; Dynamo's and vLLM's wide-EP scripts NCCL_IB_GID_INDEX=3 on RoCE). DeepEP's
  NVSHMEM kernels (deepep_high_throughput/low_latency) need IBGDA: NVSHMEM_IB_ENABLE_IBGDA=1 with
  NVSHMEM_HCA_LIST/NVSHMEM_IB_GID_INDEX (llm-d guides/wide-ep-lws/manifests/modelserver/base/
  decode.yaml). `deepep_v2` rides NCCL's GPU-initiated networking (vLLM 0.33.0
  distributed/device_communicators/all2all.py:1040-1105), so the NCCL settings cover it.
- Per-rank NIC pinning is left to the libraries' topology discovery: vLLM 0.33.0's own
  (VLLM_GPU_NIC_PCIE_MAPPING + VLLM_NIC_SELECTION_VARS, v1/executor/vllm_net_devices.py, envs.py:
  2263-2269) needs the node's PCI addresses, which differ per node; a user who has them sets both in
  engine.env (vLLM validates them).
- The user's own values win: `engine.env` and `pools[].rdma.env` (NCCL_*, UCX_*, NVSHMEM_*, NIXL_*,
  GLOO_* only, so no VLLM_* can reach the container from here) replace a default of the same name.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..planner import PoolPlan, RolePlan
from .kubelet import literal

UCX_OVER_MNNVL = (("UCX_TLS", "cuda_copy,cuda_ipc,tcp"), ("UCX_CUDA_IPC_ENABLE_MNNVL", "y"))
UCX_OVER_RDMA = "rc,cuda_copy,cuda_ipc"
NVSHMEM_ALL2ALL = frozenset({"deepep_high_throughput", "deepep_low_latency"})
FABRIC_VARIABLES = frozenset({
    "UCX_TLS", "UCX_CUDA_IPC_ENABLE_MNNVL", "UCX_NET_DEVICES", "UCX_IB_GID_INDEX", "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX", "NVSHMEM_IB_ENABLE_IBGDA", "NVSHMEM_HCA_LIST", "NVSHMEM_IB_GID_INDEX"})
"""Every default fabric_settings may set (besides pools[].rdma.env): none is VLLM_*, and a user's
engine.env of the same name replaces it."""


def _ucx_devices(hcas: Iterable[str]) -> str:
    return ",".join(h if ":" in h else f"{h}:1" for h in hcas)


def fabric_settings(pool: PoolPlan, role: RolePlan) -> list[tuple[str, str]]:
    """(name, value) defaults for one role's containers, before the user's overrides."""
    rdma = pool.rdma
    out: list[tuple[str, str]] = []
    if role.kv_transport == "NVLink":
        out += UCX_OVER_MNNVL
    elif role.kv_transport == "RDMA":
        out.append(("UCX_TLS", UCX_OVER_RDMA))
        if rdma.hcas:
            out.append(("UCX_NET_DEVICES", _ucx_devices(rdma.hcas)))
        if rdma.gid_index is not None:
            out.append(("UCX_IB_GID_INDEX", str(rdma.gid_index)))
    if role.uses_rdma:
        if rdma.hcas:
            out.append(("NCCL_IB_HCA", ",".join(rdma.hcas)))
        if rdma.gid_index is not None:
            out.append(("NCCL_IB_GID_INDEX", str(rdma.gid_index)))
    if role.crosses_rdma and role.all2all_backend in NVSHMEM_ALL2ALL:
        out.append(("NVSHMEM_IB_ENABLE_IBGDA", "1"))
        if rdma.hcas:
            out.append(("NVSHMEM_HCA_LIST", ",".join(rdma.hcas)))
        if rdma.gid_index is not None:
            out.append(("NVSHMEM_IB_GID_INDEX", str(rdma.gid_index)))
    if role.uses_rdma or role.kv_transport:
        out += rdma.env
    return out


def fabric_env(pool: PoolPlan, role: RolePlan, taken: Iterable[str]) -> list[dict[str, Any]]:
    """The role's fabric variables minus those named in `taken` (the user's engine.env); a later
    entry of the same name (pools[].rdma.env) replaces an earlier default."""
    settings = dict(fabric_settings(pool, role))
    blocked = set(taken)
    return [{"name": n, "value": literal(v)} for n, v in settings.items() if n not in blocked]
