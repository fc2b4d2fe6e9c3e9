"""How a role's engines read the weights, and how many bytes each pod reads that way.

vLLM 0.33.0 has many `--load-format`s; two are right for Kimi K3 from the operator's cache volume
(a POSIX path: the stager copies hf:// and s3:// checkpoints there, and pvc:// is one already).
docs/loading.md has the whole survey, with the vLLM lines each choice rests on; in short:
- **safetensors**, lazily memory-mapped (the default): each rank reads the tensors it asks for,
  whole, on any POSIX file system.
- **instanttensor** (a core dependency of vLLM 0.33.0, NVIDIA only: model_loader/weight_utils.py:
  1394-1410), by choice: direct I/O with pipelined prefetch. Without a tensor filter it loads
  collectively over the replica's ranks (weight_utils.py:1412-1418): each byte of the checkpoint is
  read once per replica, spread over its pods.
Safetensors reads only the experts a rank holds with `--enable-ep-weight-filter` (config/parallel.py:
199-205; default off) under expert parallelism, except with EPLB, whose redundant slots need every
expert (model_loader/default_loader.py:445-450). The filter skips the packed expert weights of other
ranks but reads every expert's scales (model_loader/ep_weight_filter.py:68-85). The lazy strategy is
named explicitly under it: vLLM otherwise prefetches whole files on NFS and Lustre (weight_utils.py:
1136-1182), which reads what the filter skips. instanttensor never gets the filter: with it, it loads
per rank with O_DIRECT instead of collectively (weight_utils.py:1431-1443), and O_DIRECT reads share
no page cache, so each rank would read the dense weights and every expert's scales itself.
Not chosen: fastsafetensors (no EP filter, and no GPUDirect Storage past one rank: weight_utils.py:
1340-1343), runai_streamer (no EP filter; only needed for s3:// straight from the engine, and the
stager stages instead), sharded_state and tensorizer (files per TP and PP rank only, no DP or EP rank:
sharded_state_loader.py:38-39, tensorizer_loader.py:123-129).
No loader skips other pipeline stages before reading (the model drops them after: models/kimi_k3/
nvidia/model.py:1349), so pipeline parallelism does not shrink a pod's read.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..api.reasons import INVALID_SPEC
from ..kimi_k3 import BF16_WEIGHT_BYTES, ROUTED_EXPERT_BYTES
from .errors import PlanningError
from .parallel_layout import Layout

EXPERT_SCALE_BYTES = ROUTED_EXPERT_BYTES * 0.25 / 4.25
"""The E8M0 scales of the MXFP4 experts: one byte per 32 four-bit values, 0.25 of every 4.25 bits."""
CHECKPOINT_BYTES = ROUTED_EXPERT_BYTES + BF16_WEIGHT_BYTES


@dataclass(frozen=True)
class Loader:
    """One way of reading the weights: a row of LOADERS."""

    name: str
    """What spec.model.loading calls it."""
    load_format: str
    """vLLM's --load-format."""
    vendors: tuple[str, ...]
    """GPU vendors it runs on."""
    collective: bool
    """Without a tensor filter, the replica's ranks share the reads (each byte once per replica)."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment every rank needs for it."""


LOADERS = {row.name: row for row in (
    # instanttensor 0.2.2 reads with O_DIRECT through io_uring by default, which registers its
    # pinned staging buffer against RLIMIT_MEMLOCK: a pod without IPC_LOCK (every pod that does no
    # RDMA) fails there, with no fallback. libaio reads the same way without registering it.
    Loader("InstantTensor", "instanttensor", ("nvidia",), collective=True, env=(("INSTANTTENSOR_BACKEND", "AIO"),)),
    Loader("Safetensors", "safetensors", ("nvidia", "amd"), collective=False),
)}
AUTO = "Safetensors"
"""What Auto picks: the loader valid on every GPU and every POSIX file system. InstantTensor is
faster where it works, but it needs O_DIRECT from the cache volume's file system and fails at
start where it has none (FUSE mounts, for one), which the operator cannot see from a
StorageClass: it is the user's choice (docs/loading.md)."""


@dataclass(frozen=True)
class Loading:
    """The loader of one role, and whether it reads only the ranks' own experts."""

    loader: Loader
    source: str
    """spec | auto."""
    expert_filter: bool

    def args(self) -> list[str]:
        """The `vllm serve` arguments, for every rank (each loads its own share). Memory-mapped
        safetensors without the filter is what vLLM's default (`auto`) loads a safetensors
        checkpoint with (model_loader/default_loader.py:170-208): nothing to render, so those
        deployments keep the command line they had."""
        if self.loader.load_format == "safetensors" and not self.expert_filter:
            return []
        args = ["--load-format", self.loader.load_format]
        if self.expert_filter:
            args.append("--enable-ep-weight-filter")
            if self.loader.load_format == "safetensors":
                args += ["--safetensors-load-strategy", "lazy"]
        return args

    def pod_read_bytes(self, layout: Layout, gpus_per_pod: int) -> float:
        """Distinct bytes one pod reads (ranks of a pod share the node's page cache, so a tensor
        several of them read is read once)."""
        if self.expert_filter:
            ep_size = layout.tensor * layout.data
            own = (ROUTED_EXPERT_BYTES - EXPERT_SCALE_BYTES) * min(1.0, gpus_per_pod / ep_size)
            return own + EXPERT_SCALE_BYTES + BF16_WEIGHT_BYTES
        if self.loader.collective:
            return CHECKPOINT_BYTES * min(1.0, gpus_per_pod / layout.gpus)
        return CHECKPOINT_BYTES


def loading(choice: str, vendor: str, layout: Layout, eplb: bool, where: str, *, vendor_from_nodes: bool) -> Loading:
    """The role's loading from spec.model.loading (`Auto` or a LOADERS name); `vendor_from_nodes`:
    the GPU was read off the nodes' labels, so a refusal may lift when they change."""
    name = AUTO if choice == "Auto" else choice
    loader = LOADERS[name]
    if vendor not in loader.vendors:
        raise PlanningError(INVALID_SPEC, f"{where}: model.loading {name} needs an NVIDIA GPU (vLLM 0.33.0's "
                                          f"instanttensor loader is CUDA-only); use Auto or Safetensors",
                            depends_on_nodes=vendor_from_nodes)
    # The filter turns instanttensor's collective load into one O_DIRECT read per rank (weight_utils.py:
    # 1437-1443), which shares no page cache: every rank of a node then reads the dense weights and
    # all the expert scales itself, more than the collective load's share. So it goes with safetensors.
    return Loading(loader, "auto" if choice == "Auto" else "spec",
                   expert_filter=layout.expert and not eplb and not loader.collective)
