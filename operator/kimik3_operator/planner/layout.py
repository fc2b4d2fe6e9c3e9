"""Parallel layout of one replica: choose it, or check the one the user gave.

Rules (docs/model.md, docs/perf-model.md §2.3, docs/vllm-facts.md §1.4 and §2):
- GPUs per replica is the smallest count whose layout fits weights plus a KV/KDA floor
  (memory.py): 8 for GB300/B300/MI355X, 16 for B200/GB200/H200, 32 for H100 at full context.
- Tensor parallelism divides the 96 KDA (and MLA) heads and never leaves an NVLink domain: the
  node on HGX/OAM boards, the clique on NVL72 racks.
- Expert parallelism spans tensor x data ranks and must divide the 896 experts.
- Disaggregated roles never use pipeline parallelism: NIXL cannot move KDA state between
  pipeline stages. Beyond one NVLink domain they scale with data-parallel ranks (DEP).
- Shapes by role: aggregated and decode use tensor parallelism inside the NVLink domain
  (pipeline stages across HGX nodes for aggregated, DEP for decode); prefill uses DEP with the
  smallest tensor-parallel size that fits, so most GPUs run their own attention batch, unless it
  must share its decodes' tensor size for vLLM's NIXL handshake (with_tensor; handoff.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..api.reasons import HARDWARE_UNSUPPORTED, INSUFFICIENT_MEMORY, INVALID_SPEC
from ..kimi_k3 import KDA_HEADS, NUM_EXPERTS
from .catalog import GpuSpec
from .fabric import check_pinned_layout, expert_group_crosses
from .memory import MemoryFit, gb, memory_fit
from .plan import Layout, PlanningError

MAX_GPUS_PER_REPLICA = 128


@dataclass(frozen=True)
class Fabric:
    """Where a pool's GPUs can talk over NVLink (or xGMI) rather than RDMA."""

    gpu: GpuSpec
    gpus_per_node: int
    nvlink_gpus: int
    """GPUs in one NVLink domain: the node on HGX, the clique (trays x GPUs) on NVL72."""
    pinned: bool = False
    """interconnect NVLink/xGMI: no tensor or expert group may leave the NVLink domain (fabric.py)."""

    def allows(self, layout: Layout) -> bool:
        return not (self.pinned and expert_group_crosses(layout, self.nvlink_gpus))


@dataclass(frozen=True)
class MemoryInputs:
    max_model_len: int | None
    kv_dtype: str
    spec_tokens: int
    ssm_dtype: str = "float32"


def describe(layout: Layout) -> str:
    parts = [f"TP{layout.tensor}"]
    if layout.pipeline > 1:
        parts.append(f"PP{layout.pipeline}")
    if layout.data > 1:
        parts.append(f"DP{layout.data}")
    text = " x ".join(parts)
    return f"{text}, EP{layout.tensor * layout.data}" if layout.expert else text


def fit(fabric: Fabric, layout: Layout, mem: MemoryInputs) -> MemoryFit:
    return memory_fit(fabric.gpu, layout.tensor, layout.pipeline, layout.data, layout.expert,
                      max_model_len=mem.max_model_len, kv_dtype=mem.kv_dtype, spec_tokens=mem.spec_tokens,
                      ssm_dtype=mem.ssm_dtype)


def _divisors_of_heads(limit: int) -> list[int]:
    return [t for t in range(1, min(limit, KDA_HEADS) + 1) if KDA_HEADS % t == 0]


def candidates(role: str, count: int, fabric: Fabric) -> Iterator[Layout]:
    """Layouts of `count` GPUs for a role, best first, before the memory check."""
    node, domain = fabric.gpus_per_node, fabric.nvlink_gpus
    if count > node and count % node:
        return  # a replica spans whole nodes
    if role == "prefill":
        if NUM_EXPERTS % count == 0:
            for tp in _divisors_of_heads(min(count, domain)):
                if count % tp == 0:
                    yield Layout(tensor=tp, data=count // tp, expert=True)
        return
    if count <= domain and KDA_HEADS % count == 0:
        yield Layout(tensor=count)
        return
    tp = min(node, domain)
    if KDA_HEADS % tp or count % tp:
        return
    if role == "aggregated":
        yield Layout(tensor=tp, pipeline=count // tp)
    if NUM_EXPERTS % count == 0:
        yield Layout(tensor=tp, data=count // tp, expert=True)


def with_tensor(role: str, count: int, fabric: Fabric, tensor: int) -> Iterator[Layout]:
    """Layouts of `count` GPUs whose tensor-parallel size is `tensor` (a prefill/decode pair must
    share it: handoff.py): the role's own candidates of that size, else, for prefill and decode,
    DEP with that tensor size (expert parallelism over tensor x data ranks)."""
    own = [c for c in candidates(role, count, fabric) if c.tensor == tensor]
    yield from own
    if (not own and role != "aggregated" and count % tensor == 0 and tensor <= fabric.nvlink_gpus
            and KDA_HEADS % tensor == 0 and NUM_EXPERTS % count == 0
            and (count <= fabric.gpus_per_node or count % fabric.gpus_per_node == 0)):
        yield Layout(tensor=tensor, data=count // tensor, expert=True)


def choose_layout(role: str, fabric: Fabric, mem: MemoryInputs, tensor: int | None = None) -> Layout:
    """The smallest layout that fits (of tensor size `tensor` when given); PlanningError naming the
    shortfall when none does."""
    smallest: tuple[Layout, MemoryFit] | None = None
    for count in range(8, MAX_GPUS_PER_REPLICA + 1, 8):
        found = candidates(role, count, fabric) if tensor is None else with_tensor(role, count, fabric, tensor)
        for layout in filter(fabric.allows, found):
            result = fit(fabric, layout, mem)
            if result.fits:
                return layout
            smallest = smallest or (layout, result)
    pinned = (f"; interconnect NVLink keeps every expert group inside one NVLink domain of {fabric.nvlink_gpus} "
              "GPUs (Auto or RDMA allows DEP over RDMA)") if fabric.pinned else ""
    if smallest is None:
        size = f" with tensor parallel size {tensor}" if tensor is not None else ""
        raise PlanningError(HARDWARE_UNSUPPORTED,
                            f"no {role} layout{size} of whole {fabric.gpus_per_node}-GPU nodes suits "
                            f"{fabric.gpu.product}{pinned}")
    layout, result = smallest
    raise PlanningError(
        HARDWARE_UNSUPPORTED,
        f"Kimi K3 does not fit {fabric.gpu.product} at up to {MAX_GPUS_PER_REPLICA} GPUs per replica: "
        f"{shortfall_text(fabric, layout, result)}{pinned}",
    )


def shortfall_text(fabric: Fabric, layout: Layout, result: MemoryFit) -> str:
    return (f"{layout.gpus} x {fabric.gpu.product} ({describe(layout)}) needs {gb(result.weights)} of weights "
            f"+ {gb(result.floor)} KV/KDA floor per GPU but has {gb(result.budget)} usable: "
            f"{gb(result.shortfall)} short")


def check_layout(role: str, disaggregated: bool, layout: Layout, fabric: Fabric, mem: MemoryInputs) -> None:
    """Reject an explicit layout that vLLM would refuse or that cannot fit; say why."""
    node, domain = fabric.gpus_per_node, fabric.nvlink_gpus
    if fabric.pinned:
        check_pinned_layout(layout, domain, node, multi_node=domain > node)
    if layout.tensor > domain:
        raise PlanningError(
            INVALID_SPEC,
            f"tensor parallel size {layout.tensor} would span the RDMA boundary: {fabric.gpu.product} NVLink "
            f"reaches {domain} GPUs; use tensor <= {domain} with pipeline or data parallelism")
    if layout.gpus > node and layout.gpus % node:
        raise PlanningError(INVALID_SPEC,
                            f"{layout.gpus} GPUs per replica do not fill whole {node}-GPU nodes")
    if layout.expert and NUM_EXPERTS % (layout.tensor * layout.data):
        raise PlanningError(
            INVALID_SPEC,
            f"expert parallel size {layout.tensor * layout.data} (tensor x data) must divide the {NUM_EXPERTS} experts")
    if disaggregated and layout.pipeline > 1:
        raise PlanningError(
            INVALID_SPEC,
            f"{role} with pipeline parallel size {layout.pipeline}: NIXL cannot transfer KDA state between "
            "pipeline stages; use data parallelism with expert parallelism (DEP) instead")
    result = fit(fabric, layout, mem)
    if not result.fits:
        try:
            smallest = choose_layout(role, fabric, mem)
            needed = f"; the smallest {role} layout that fits is {describe(smallest)} ({smallest.gpus} GPUs)"
        except PlanningError:
            needed = ""
        raise PlanningError(INSUFFICIENT_MEMORY, shortfall_text(fabric, layout, result) + needed)
