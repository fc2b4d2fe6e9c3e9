"""Known vLLM 0.33.0 traps for Kimi K3, encoded as planning rules.

Each trap is a layout that vLLM accepts but serves wrongly; the planner refuses it with the
upstream reference, unless the spec explicitly accepts that known issue
(`experimental.acceptKnownIssues`), for users who run a patched engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..api.reasons import KNOWN_ISSUE
from .plan import PlanningError, PoolPlan


@dataclass(frozen=True)
class Trap:
    issue: str
    applies: Callable[[tuple[PoolPlan, ...]], bool]
    message: str


def _replicas(pools: tuple[PoolPlan, ...], role: str) -> int:
    return sum(r.replicas for p in pools for r in p.roles if r.role == role)


TRAPS: tuple[Trap, ...] = (
    Trap(
        issue="vllm#52627",
        applies=lambda pools: _replicas(pools, "prefill") == 1 and _replicas(pools, "decode") == 1,
        message="one prefill and one decode replica (1P1D) over NIXL silently corrupts Kimi K3 output in "
                "vLLM 0.33.0 (vllm#52627); run at least two decode replicas, or serve aggregated",
    ),
)


def check_traps(pools: tuple[PoolPlan, ...], accepted: frozenset[str]) -> None:
    for trap in TRAPS:
        if trap.issue not in accepted and trap.applies(pools):
            raise PlanningError(KNOWN_ISSUE, f"{trap.message} (accept with experimental.acceptKnownIssues: "
                                              f"[\"{trap.issue}\"])")
