"""The per-role engine settings of a `vllm serve` command line (api/role_settings.py has one row per
setting with its spelling; planner/shaping.py decides the values).

Spellings are vLLM 0.33.0's: --max-num-seqs and --max-num-batched-tokens (engine/arg_utils.py:
1742-1756), --long-prefill-token-threshold (:1773), --max-cudagraph-capture-size (:1826-1828),
--enable-eplb and --eplb-config (:1352-1353, a JSON EPLBConfig: config/parallel.py:60-100). Every
rank of a replica gets them: headless workers run their own data-parallel schedulers, and the
compilation and EPLB settings must agree across the expert group.
"""

from __future__ import annotations

from ..api.role_settings import ROLE_SETTINGS
from ..planner import RolePlan


def shape_args(role: RolePlan) -> list[str]:
    shape = role.shape
    if shape is None:
        return []
    return [arg for s in ROLE_SETTINGS for arg in s.args(getattr(shape, s.status_field))]
