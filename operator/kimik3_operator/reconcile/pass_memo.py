"""What one pass works out that the next pass of any deployment may reuse, keyed by what it
depends on, so a fleet's passes do not each redo the cluster-wide part.

- node facts (node_memo.FactsMemo): by node version and by (selector, node store revision);
- GPU usage per node and per deployment: by the revision of the store of every active pod. Each
  pass needs the GPUs other pods hold; walked per pass, that is every pod of the cluster for every
  pass of every deployment (bench/control_plane.py: a seventh of the operator's CPU at 100
  deployments on 1,000 nodes);
- the validated spec and its plan: by (uid, generation, node store revision, Prometheus URL). The
  generation of a resource with a status subresource moves with every spec change and only then
  (the API server's rule for custom resources), and the plan is a pure function of the spec and
  the pools' facts (planner.plan_deployment), which the node store's revision pins.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..api import KimiK3Deployment
from ..planner import Plan
from ..planner.capacity import GpuUsage
from .node_memo import FactsMemo

MAX_PLANS = 4096
"""Deployments whose plan is kept before the memo starts over."""

PlanKey = tuple[str, int, int, str | None]


class UsageMemo:
    """GpuUsage of the active pods at one store revision (the newest asked for)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at: tuple[int, GpuUsage] | None = None

    def used_except(self, pods: Sequence[Mapping[str, Any]], revision: int | None,
                    owner_of: Callable[[Mapping[str, Any]], Hashable], owner: Hashable) -> dict[str, int]:
        if revision is None:
            return GpuUsage(pods, owner_of).used_except(owner)  # not from a store: nothing to key on
        with self._lock:
            at = self._at
        if at is None or at[0] != revision:
            at = (revision, GpuUsage(pods, owner_of))
            with self._lock:
                if self._at is None or self._at[0] < revision:
                    self._at = at
        return at[1].used_except(owner)


class PlanMemo:
    """Per deployment (uid), the validated deployment and its plan at the newest PlanKey asked for.
    Only plans are kept: a spec the planner refuses is refused again each pass (its status says
    why, and a spec that fails is no fleet's steady state)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plans: dict[str, tuple[PlanKey, KimiK3Deployment, Plan]] = {}

    def get(self, key: PlanKey | None) -> tuple[KimiK3Deployment, Plan] | None:
        if key is None:
            return None
        with self._lock:
            found = self._plans.get(key[0])
        return (found[1], found[2]) if found is not None and found[0] == key else None

    def put(self, key: PlanKey | None, cr: KimiK3Deployment, plan: Plan) -> None:
        if key is None:
            return
        with self._lock:
            if len(self._plans) >= MAX_PLANS and key[0] not in self._plans:
                self._plans.clear()  # deployments come and go: start over rather than track who left
            self._plans[key[0]] = (key, cr, plan)


@dataclass
class PassMemo:
    """Everything passes remember between them; one per operator process, shared by its workers."""

    facts: FactsMemo = field(default_factory=FactsMemo)
    usage: UsageMemo = field(default_factory=UsageMemo)
    plans: PlanMemo = field(default_factory=PlanMemo)
