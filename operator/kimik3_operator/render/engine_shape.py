"""The per-role shaping flags of a `vllm serve` command line (planner/shaping.py decides them).

Spellings are vLLM 0.33.0's: --max-num-seqs and --max-num-batched-tokens (engine/arg_utils.py:
1742-1756), --long-prefill-token-threshold (:1773), --max-cudagraph-capture-size (:1826-1828),
--enable-eplb and --eplb-config (:1352-1353, a JSON EPLBConfig: config/parallel.py:60-100). Every
rank of a replica gets them: headless workers run their own data-parallel schedulers, and the
compilation and EPLB settings must agree across the expert group.
"""

from __future__ import annotations

import json

from ..planner import RolePlan


def shape_args(role: RolePlan) -> list[str]:
    shape = role.shape
    if shape is None:
        return []
    args = ["--max-num-seqs", str(shape.max_num_seqs),
            "--max-num-batched-tokens", str(shape.max_num_batched_tokens)]
    if shape.max_cudagraph_capture_size is not None:
        args += ["--max-cudagraph-capture-size", str(shape.max_cudagraph_capture_size)]
    if shape.long_prefill_token_threshold is not None:
        args += ["--long-prefill-token-threshold", str(shape.long_prefill_token_threshold)]
    if shape.eplb_redundant_experts is not None:
        config = {"num_redundant_experts": shape.eplb_redundant_experts}
        args += ["--enable-eplb", "--eplb-config", json.dumps(config, separators=(",", ":"))]
    return args
