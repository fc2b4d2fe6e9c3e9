"""Which fabric carries each kind of traffic, and what follows from it.

Rules, and what they rest on (paths inside the vLLM 0.33.0 wheel unless a repository is named):

1. MegaMoE stays inside one NVLink domain. `--moe-backend deep_gemm_mega_moe` makes Kimi K3 build
   `DeepGemmMegaMoEExperts` (models/kimi_k3/nvidia/model.py:401-417, :516-540), whose dispatch,
   expert GEMMs and combine run in one kernel on a DeepGEMM symmetric buffer over the whole
   expert-parallel group (model_executor/layers/fused_moe/deep_gemm_mega_moe.py:606-650): torch
   symmetric memory, `symm_mem.empty` + `symm_mem.rendezvous` (third_party/deep_gemm/mega/__init__.py:
   58-66), which maps every peer's buffer into each GPU, so every rank of the group must be a CUDA
   peer: one HGX node, or one NVL72 clique with a ComputeDomain. An expert group (tensor x data
   ranks) larger than the NVLink domain cannot use it.
2. Across RDMA the experts run as `deep_gemm` with `--all2all-backend deepep_v2`. K3's MXFP4 experts go
   through `Mxfp4MoEMethod` -> `select_deepseek_v4_mxfp4_moe_backend`
   (model_executor/layers/quantization/mxfp4.py:578; fused_moe/oracle/mxfp4.py:763-835), which maps
   `deep_gemm` to `DeepGemmFP4Experts` (oracle/mxfp4.py:207-212, :352-375): Blackwell SM100, SiTU among
   its activations and any all-to-all but FlashInfer's NVLink ones
   (fused_moe/experts/deep_gemm_moe.py:474-512), with FP8 block activations that DeepEP v2 then
   dispatches in FP8 (fused_moe/all2all_utils.py:284-290), half the RDMA bytes of BF16. The
   alternative, `flashinfer_trtllm`, is monolithic only without all-to-all kernels
   (experts/trtllm_mxfp4_moe.py:176-183) and its explicit alias tries the BF16-activation variant
   first (oracle/mxfp4.py:780-795). llm-d's wide-EP recipe runs the same pair across HGX nodes
   (llm-d/llm-d guides/wide-ep-lws/modelserver/gpu/vllm-deepseek-r1-0528/base/prefill.yaml:
   `--moe-backend deep_gemm --all2all-backend deepep_v2`). Hopper keeps Marlin, MI355X AITER.
3. `interconnect: NVLink | xGMI` pins tensor and expert groups to the NVLink (xGMI) domain: a node
   on HGX and MI355X boards, the clique on NVL72 racks (multi-node NVLink). Pipeline stages may
   still cross nodes (only activations between stages travel). xGMI is AMD's, NVLink NVIDIA's.
4. Prefill/decode KV goes over multi-node NVLink only when both sides are certain to share one
   NVLink domain: NVL72 GPUs whose nodes all carry one clique label (or, planned ahead of the
   nodes, a single pool, as topology.py assumes a full rack). A ComputeDomain gives IMEX channels to
   its own pods only, so the pair then claims one domain together, as NVIDIA Dynamo's K3 GB300
   disaggregated recipe does (ai-dynamo/dynamo recipes/kimi-k3/vllm/disagg-gb300-agentic/
   deploy.yaml: PrefillWorker and DecodeWorker on one clique, one ComputeDomain). Everything else
   (HGX nodes, two cliques, clique labels missing) moves KV over RDMA, which needs NICs.
5. RDMA pods request NICs per GPU. Dynamo's DEP16 recipe over two HGX nodes asks `rdma/ib: "8"` per
   8-GPU pod (ai-dynamo/dynamo recipes/deepseek-r1/vllm/disagg/deploy_hopper_prefill_dep16_decode_dep16.yaml);
   a shared RDMA device (k8s-rdma-shared-dev-plugin, e.g. CoreWeave's `rdma/ib: "1"` in llm-d's
   guides/wide-ep-lws/modelserver/gpu/vllm-deepseek-r1-0528/coreweave/kustomization.yaml) hands
   every HCA to a pod holding one unit. The node's count tells them apart: 1-2 units per GPU are
   NICs (HGX B200/B300 and GB300 have one per GPU), more are shares.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..api import Pool
from ..api.reasons import INVALID_SPEC, RDMA_UNAVAILABLE
from .catalog import CATALOG, GpuSpec
from .facts import PoolFacts
from .plan import Layout, PlanningError, PoolPlan, RdmaPlan, RolePlan

MEGA_MOE = "deep_gemm_mega_moe"
RDMA_MOE = "deep_gemm"
"""K3's MXFP4 experts behind DeepEP v2 on Blackwell (rule 2)."""
NVLINK_ONLY_ALL2ALL = frozenset({"flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided",
                                 "flashinfer_all2allv", "moonep"})
"""All-to-all kernels that write into peers' memory over NVLink (MNNVL at most)."""
MAX_NICS_PER_GPU = 2
"""More RDMA units per GPU than this are a shared device's shares, not NICs (rule 5)."""
PD_ROLES = ("prefill", "decode")


def expert_group(layout: Layout) -> int:
    """GPUs of one expert-parallel group: tensor x data ranks (vLLM's EP spans both); 0 without EP."""
    return layout.tensor * layout.data if layout.expert else 0


def expert_group_crosses(layout: Layout, nvlink_gpus: int) -> bool:
    """The EP group of one pipeline stage leaves the NVLink domain. vLLM orders ranks data-major,
    then pipeline, then tensor, and an EP group is data x tensor ranks of one stage
    (distributed/parallel_state.py:2149-2160, :2326-2337), so with both pipeline stages and
    data ranks a stage's EP group is strided over the whole replica."""
    if layout.expert and layout.pipeline > 1 and layout.data > 1:
        return layout.gpus > nvlink_gpus
    return expert_group(layout) > nvlink_gpus


def check_megamoe(moe: str, layout: Layout, nvlink_gpus: int) -> None:
    """Rule 1, for a MoE backend the user chose."""
    if moe == MEGA_MOE and expert_group_crosses(layout, nvlink_gpus):
        raise PlanningError(
            INVALID_SPEC,
            f"moe backend {MEGA_MOE} maps every expert-parallel peer's memory (DeepGEMM's symmetric buffer), "
            f"so its expert group must stay inside one NVLink domain: EP{expert_group(layout)} spans "
            f"{-(-expert_group(layout) // nvlink_gpus)} domains of {nvlink_gpus} GPUs; use {RDMA_MOE} with "
            "all2all deepep_v2, or keep tensor x data within the NVLink domain")


def check_nvlink_all2all(all2all: str, layout: Layout, nvlink_gpus: int) -> None:
    if all2all in NVLINK_ONLY_ALL2ALL and expert_group_crosses(layout, nvlink_gpus):
        raise PlanningError(
            INVALID_SPEC,
            f"all2all backend {all2all} reaches peers over NVLink only: EP{expert_group(layout)} spans more than "
            f"one NVLink domain of {nvlink_gpus} GPUs; use deepep_v2 across RDMA")


def expert_dispatch(layout: Layout, all2all: str | None, moe: str) -> str | None:
    """MegaMoE dispatches and combines inside its own kernel whatever --all2all-backend says (the
    K3 model never builds a FusedMoE layer for it, model.py:516-540); otherwise the all-to-all
    backend moves the tokens, when there is one."""
    if moe == MEGA_MOE and layout.expert:
        return MEGA_MOE
    return all2all


def check_interconnect(pool: Pool, gpu: GpuSpec) -> None:
    """Rule 3's vendor half, for GPUs read from the nodes (the CRD refuses an explicit product)."""
    owner = {"NVLink": "NVIDIA", "xGMI": "AMD"}.get(pool.interconnect)
    if owner and gpu.interconnect != pool.interconnect:
        raise PlanningError(INVALID_SPEC, f"pool {pool.name}: interconnect {pool.interconnect} is "
                                           f"{owner}'s fabric but the nodes carry {gpu.product}")


def check_pinned_layout(layout: Layout, nvlink_gpus: int, per_node: int, multi_node: bool) -> None:
    """Rule 3: with NVLink/xGMI asked for, no tensor or expert group may cross RDMA."""
    where = (f"one NVLink clique ({nvlink_gpus} GPUs)" if multi_node
             else f"one node ({per_node} GPUs; HGX NVLink ends at the board)")
    if layout.tensor > nvlink_gpus:
        raise PlanningError(INVALID_SPEC, f"interconnect NVLink keeps tensor groups inside {where}: "
                                           f"tensor parallel size {layout.tensor} would cross RDMA")
    if expert_group_crosses(layout, nvlink_gpus):
        raise PlanningError(
            INVALID_SPEC,
            f"interconnect NVLink keeps expert groups inside {where}: EP{expert_group(layout)} (tensor "
            f"{layout.tensor} x data {layout.data}) would cross RDMA; use pipeline stages across nodes, "
            "or interconnect Auto/RDMA for DEP over RDMA")


def rdma_plan(pool: Pool, facts: PoolFacts, gpus_per_node: int) -> RdmaPlan:
    """Rule 5: the spec's pools[].rdma over what the nodes advertise."""
    spec = pool.rdma
    resource = (spec.resource if spec and spec.resource else None) or facts.rdma_resource
    per_node = facts.rdma_per_node if resource == facts.rdma_resource else None
    if spec and spec.nics_per_gpu:
        per_gpu, shared = spec.nics_per_gpu, False
    elif per_node and gpus_per_node and per_node % gpus_per_node == 0 \
            and per_node // gpus_per_node <= MAX_NICS_PER_GPU:
        per_gpu, shared = per_node // gpus_per_node, False
    else:
        per_gpu, shared = 1, per_node is not None
    return RdmaPlan(resource=resource, nics_per_gpu=per_gpu, shared=shared,
                    hcas=tuple(spec.hcas) if spec else (), gid_index=spec.gid_index if spec else None,
                    env=tuple((e.name, e.value) for e in spec.env) if spec else ())


def _single_clique(facts: PoolFacts) -> str | None:
    """The one clique every node of the pool sits in, if there is one."""
    if len(facts.cliques) == 1 and sum(facts.cliques.values()) == len(facts.nodes):
        return next(iter(facts.cliques))
    return None


def kv_transport(pools: tuple[PoolPlan, ...], spec_pools: Mapping[str, Pool],
                 facts: Mapping[str, PoolFacts]) -> str | None:
    """Rule 4: NVLink or RDMA for every prefill/decode pair of the deployment; None without one."""
    paired = [p for p in pools if any(r.role in PD_ROLES for r in p.roles)]
    if not paired:
        return None
    on_racks = all(p.gpu_product and CATALOG[p.gpu_product].multi_node_nvlink
                   and spec_pools[p.name].interconnect != "RDMA" for p in paired)
    known = [facts.get(p.name, PoolFacts()) for p in paired]
    if not on_racks:
        return "RDMA"
    if not any(f.nodes for f in known):
        return "NVLink" if len(paired) == 1 else "RDMA"
    cliques = {_single_clique(f) for f in known}
    return "NVLink" if len(cliques) == 1 and None not in cliques else "RDMA"


def with_kv_transport(pools: tuple[PoolPlan, ...], spec_pools: Mapping[str, Pool],
                      facts: Mapping[str, PoolFacts]) -> tuple[PoolPlan, ...]:
    """Each prefill/decode role with its KV transport, a shared ComputeDomain over NVLink, and the
    NICs of every role whose traffic leaves its NVLink domain; RdmaUnavailable when such a role's
    nodes have none."""
    transport = kv_transport(pools, spec_pools, facts)
    out = []
    for pool in pools:
        roles = []
        for role in pool.roles:
            if role.role in PD_ROLES and transport:
                role = dataclasses.replace(role, kv_transport=transport)
                if transport == "NVLink":
                    role = dataclasses.replace(role, compute_domain=True, shared_compute_domain=True)
            roles.append(_with_nics(pool, role, facts.get(pool.name, PoolFacts())))
        out.append(dataclasses.replace(pool, roles=tuple(roles)))
    return tuple(out)


def _with_nics(pool: PoolPlan, role: RolePlan, facts: PoolFacts) -> RolePlan:
    if not role.uses_rdma:
        return role
    if pool.rdma.resource is None:
        if facts.nodes:
            why = ("its replica spans nodes over RDMA" if role.crosses_rdma
                   else "its KV cache goes to the paired role over RDMA (not one NVLink domain)")
            raise PlanningError(
                RDMA_UNAVAILABLE,
                f"pool {pool.name} role {role.role}: {why}, but the pool's nodes advertise no RDMA device "
                "resource (rdma/*, nvidia.com/rdma*, mellanox.com/*); install the RDMA device plugin or "
                "set pools[].rdma.resource", depends_on_nodes=True)
        return role  # planned ahead of the nodes: the resource is learnt from them
    return dataclasses.replace(role, rdma_nics=pool.rdma.nics(role.gpus_per_pod), rdma_resource=pool.rdma.resource)
