"""How long a new replica of a role takes from its pods being scheduled to its leader being Ready.

A Kimi K3 replica does not serve until every pod of its group has read its share of ~1.6 TB and the
engine has compiled and captured its CUDA graphs, so "add a replica" is a decision about the
future: the SLO scaler needs the lead time (slo_scaler.py), the start-up deadlines are this
estimate with margins (timeouts.py), and users see it per role in status and `kimik3 plan`.

The prediction is the sum of what happens one after another on the group's slowest pod:
- the serving image reaching a node that has not run it yet (IMAGE_PULL_S);
- reading the pod's distinct share of the weights (loading.py: what its loader reads for its
  layout, each tensor once per node) at the storage's per-node throughput,
  `spec.model.readThroughput` (STORAGE_BYTES_PER_S when not given);
- compiling: vLLM keeps torch.compile's and the JIT kernels' artifacts on the deployment's
  compile-cache claim, so a scale-up or a restart loads them (COMPILE_CACHED_S) and only a
  deployment's first start, or a change of what is compiled, compiles from scratch (COMPILE_COLD_S);
- capturing one CUDA graph per batch size of vLLM's capture grid up to the role's
  max_cudagraph_capture_size (shaping.capture_grid; config/vllm.py:2573-2590 in vLLM 0.33.0).

The DSpark draft is not counted: its size is known only once it is staged, and it is far smaller than
the target (docs/perf-model.md §2.1). The constants are planning figures, not measurements of this
model on this hardware; docs/cold-start.md says how to read the real ones from an engine's log.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

STORAGE_BYTES_PER_S = 1.0e9
"""What one node reads from the weights claim, planned low: the per-client ceiling of the common
ReadWriteMany network file systems is about 1-1.5 GB/s (an NFS mount over one 10-25 GbE path;
Amazon EFS's per-client throughput limit, docs.aws.amazon.com/efs/latest/ug/performance.html).
Parallel file systems (Lustre, Weka, VAST, GPFS) give a client 10+ GB/s; then the budget is loose,
never short."""
IMAGE_PULL_S = 120
"""A ~20 GB serving image (CUDA, PyTorch, vLLM, DeepEP) pulled and unpacked on a node that does not
have it, at ~170 MB/s: a node that ran the image before starts at once, a fresh one does not."""
COMPILE_CACHED_S = 60
"""torch.compile's graphs and the DeepGEMM/FlashInfer/Triton kernels loaded from the compile cache."""
COMPILE_COLD_S = 600
"""The same compiled from nothing: the first start of a deployment, or after its engine changes."""
GRAPH_CAPTURE_S_PER_SIZE = 1.0
"""One CUDA graph of a 92-layer MoE step, in full and piecewise mode."""


@dataclass(frozen=True)
class ColdStart:
    """The predicted time to Ready of one new replica, and its parts (seconds, rounded up)."""

    pod_read_bytes: int
    """Distinct bytes each pod reads from the weights."""
    read_bytes_per_s: int
    """What one node reads the weights at."""
    read_source: str
    """spec (spec.model.readThroughput) | default (STORAGE_BYTES_PER_S)."""
    image_pull_seconds: int
    load_seconds: int
    compile_seconds: int
    """With the compile cache warm (every start after the deployment's first)."""
    first_compile_seconds: int
    """With the compile cache empty (the deployment's first start)."""
    graph_capture_seconds: int

    @property
    def ready_seconds(self) -> int:
        """A scale-up or a restart: the lead time the SLO scaler plans with."""
        return self.image_pull_seconds + self.load_seconds + self.compile_seconds + self.graph_capture_seconds

    @property
    def first_ready_seconds(self) -> int:
        """The deployment's first start, compile cache empty."""
        return self.ready_seconds - self.compile_seconds + self.first_compile_seconds

    def fields(self) -> dict[str, object]:
        """What status and `kimik3 plan` show, by ColdStartStatus's wire names."""
        return {"readySeconds": self.ready_seconds, "firstReadySeconds": self.first_ready_seconds,
                "podReadBytes": self.pod_read_bytes, "readBytesPerSecond": self.read_bytes_per_s,
                "readSource": self.read_source, "imagePullSeconds": self.image_pull_seconds,
                "loadSeconds": self.load_seconds, "compileSeconds": self.compile_seconds,
                "firstCompileSeconds": self.first_compile_seconds,
                "graphCaptureSeconds": self.graph_capture_seconds}


def capture_sizes(ceiling: int) -> int:
    """How many batch sizes vLLM captures a graph for up to `ceiling`: 1, 2, 4, multiples of 8
    below 256, multiples of 16 from 256 (config/vllm.py:2573-2590)."""
    small = sum(1 for s in (1, 2, 4) if s <= ceiling)
    eights = min(ceiling, 255) // 8
    sixteens = (ceiling - 256) // 16 + 1 if ceiling >= 256 else 0
    return small + eights + sixteens


def predict(pod_read_bytes: float, capture_ceiling: int, read_bytes_per_s: float | None = None) -> ColdStart:
    """The cold start of a replica whose pods each read `pod_read_bytes` (loading.py) and capture
    CUDA graphs up to `capture_ceiling`."""
    throughput = read_bytes_per_s or STORAGE_BYTES_PER_S
    return ColdStart(
        pod_read_bytes=math.ceil(pod_read_bytes), read_bytes_per_s=math.ceil(throughput),
        read_source="spec" if read_bytes_per_s else "default",
        image_pull_seconds=IMAGE_PULL_S, load_seconds=math.ceil(pod_read_bytes / throughput),
        compile_seconds=COMPILE_CACHED_S, first_compile_seconds=COMPILE_COLD_S,
        graph_capture_seconds=math.ceil(capture_sizes(capture_ceiling) * GRAPH_CAPTURE_S_PER_SIZE))
