"""PodDisruptionBudgets: a node drain takes at most one serving group of a role, or one router pod,
at a time.

What a budget guards is an eviction (the Eviction API that `kubectl drain`, the cluster autoscaler
and node upgrades use); a rollout's or a scale-in's deletes go around it, so it never slows the
operator's own changes.

- **A serving role** (one LeaderWorkerSet): the budget selects every pod of it, leaders and workers
  of every revision (`leaderworkerset.sigs.k8s.io/name`), so no pod of a group can be evicted
  unguarded. `maxUnavailable: 1` pod: the first eviction takes one pod, and LeaderWorkerSet's
  `RecreateGroupOnPodRestart` then restarts that pod's whole group, whose pods count as unavailable
  until the group is Ready again; no further eviction of the role is allowed until then. A role
  of R groups keeps R - 1 through a drain, when the cluster has room to bring the evicted group
  back (else the drain waits, which is the point). A role of one group has no floor to keep: the
  budget lets its drain through, as a Deployment of one replica's would.
- **A router**: its pods of every revision (the router Service's selector), `maxUnavailable: 1`.
- `unhealthyPodEvictionPolicy: AlwaysAllow`: a pod that is not Ready serves nothing, so evicting it
  costs nothing, and a group that never becomes Ready (crash loop, no capacity) must not block
  node maintenance forever (policy/v1 PodDisruptionBudgetSpec; the default IfHealthyBudget would).

The disruption controller derives the expected pod count from each pod's controller's /scale (the
LeaderWorkerSet's StatefulSets, the router's ReplicaSets), so an autoscaled role needs nothing more.
"""

from __future__ import annotations

from typing import Any

from ..contract.kinds import POD_DISRUPTION_BUDGET
from ..planner import PoolPlan, RolePlan
from .names import Owner, object_meta, workload_name
from .workloads import LWS_NAME_LABEL


def budget(meta: dict[str, Any], selector: dict[str, str]) -> dict[str, Any]:
    """For the pods `selector` finds (a router's: its Service's metadata and selector)."""
    return {
        **POD_DISRUPTION_BUDGET.type_meta(),
        "metadata": meta,
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def role_budget(owner: Owner, pool: PoolPlan, role: RolePlan) -> dict[str, Any]:
    """Named like the role's LeaderWorkerSet (a name is unique per kind)."""
    name = workload_name(owner, pool.name, role.role)
    return budget(object_meta(owner, name, pool.name, role.role), {LWS_NAME_LABEL: name})
