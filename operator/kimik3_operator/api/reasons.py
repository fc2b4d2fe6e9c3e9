"""The reasons a KimiK3Deployment's conditions and events give: stable CamelCase words that users,
alerts and scripts key on, so they are spelled once, here, and nowhere else."""

from __future__ import annotations

# ---- the spec cannot be served as written, or not on today's nodes (the planner says why) -----
INVALID_SPEC = "InvalidSpec"
HARDWARE_UNSUPPORTED = "HardwareUnsupported"
INSUFFICIENT_MEMORY = "InsufficientMemory"
KNOWN_ISSUE = "KnownIssue"
PD_INCOMPATIBLE = "PDIncompatible"
NO_MATCHING_NODES = "NoMatchingNodes"
SLO_UNATTAINABLE = "SLOUnattainable"
AUTOSCALING_TARGET_UNKNOWN = "AutoscalingTargetUnknown"
AUTOSCALING_UNCONFIGURED = "AutoscalingUnconfigured"
RDMA_UNAVAILABLE = "RdmaUnavailable"
"""Traffic of a role must leave its NVLink domain (a replica over RDMA, or P/D KV between cliques or
HGX nodes) but the pool's nodes advertise no RDMA NIC and pools[].rdma.resource names none."""

PLANNING = frozenset({INVALID_SPEC, HARDWARE_UNSUPPORTED, INSUFFICIENT_MEMORY, KNOWN_ISSUE, PD_INCOMPATIBLE,
                      NO_MATCHING_NODES, SLO_UNATTAINABLE, AUTOSCALING_TARGET_UNKNOWN, AUTOSCALING_UNCONFIGURED,
                      RDMA_UNAVAILABLE})
"""What planning a deployment may fail with."""

# ---- the cluster refused or lacks what the plan needs -------------------------------------------
MISSING_DEPENDENCY = "MissingDependency"
CHAT_TEMPLATE_INVALID = "ChatTemplateInvalid"
"""engine.chatTemplate names a ConfigMap or key that is not there, or a template that does not compile."""
APPLY_REJECTED = "ApplyRejected"

PASS_ERRORS = PLANNING | {MISSING_DEPENDENCY, CHAT_TEMPLATE_INVALID, APPLY_REJECTED}
"""What a reconcile pass may end with (PlanningError's reasons): the operator's error counter has a
series for each from the start (metrics.py)."""

# ---- how far a planned deployment got ----------------------------------------------------------
WEIGHTS_STAGING = "WeightsStaging"
WEIGHTS_FAILED = "WeightsFailed"
INSUFFICIENT_CAPACITY = "InsufficientCapacity"
PODS_NOT_READY = "PodsNotReady"
ROUTER_NOT_READY = "RouterNotReady"
UPDATING = "Updating"
ALL_REPLICAS_READY = "AllReplicasReady"
STABLE = "Stable"
AS_EXPECTED = "AsExpected"

# ---- a replica or router pod fails, with no change of the spec (reconcile/failing.py) -------------
CRASH_LOOP = "CrashLoopBackOff"
OOM_KILLED = "OOMKilled"
CONTAINER_EXITED = "ContainerExited"
"""A container exited with an error (its exit code in the message), or cannot be created or run."""
IMAGE_PULL = "ImagePullBackOff"
UNSCHEDULABLE = "Unschedulable"
"""A replica that was Ready lost a pod the scheduler cannot place again."""
ENGINE_NOT_READY = "EngineNotReady"
"""An engine that was Ready fails its readiness probe, its container running (hung, overloaded)."""
FAILING = frozenset({CRASH_LOOP, OOM_KILLED, CONTAINER_EXITED, IMAGE_PULL, UNSCHEDULABLE, ENGINE_NOT_READY})
"""The Degraded reasons of a failing replica: the chart's KimiK3ReplicaFailing alert keys on them."""

GROUP_RESTARTED = "GroupRestarted"
"""The event of a failing group restarted for a scale-in (reconcile/scale_in.py)."""

# ---- events of the operator's SLO scaler ---------------------------------------------------------
SCALED_UP = "ScaledUp"
SCALED_DOWN = "ScaledDown"

# ---- the Disaggregating condition: does decode receive its prompts' KV, or recompute them? ------
PROMPTS_TRANSFERRED = "PromptsTransferred"
"""True: the decode engines receive most prompt tokens over NIXL from prefill."""
DECODE_RECOMPUTES_PROMPTS = "DecodeRecomputesPrompts"
"""False: KV arrives from prefill, but the decode engines compute most prompt tokens themselves."""
NO_KV_TRANSFERS = "NoKvTransfers"
"""False: the decode engines prefill, and no prompt token arrived from prefill."""
NO_TRAFFIC = "NoTraffic"
"""False: no prompt reached the decode engines in the window; nothing to judge by."""
NO_METRICS = "NoMetrics"
"""Unknown: Prometheus has none of the decode engines' series (not scraped?), or no Prometheus is set."""
METRICS_UNAVAILABLE = "MetricsUnavailable"
"""Unknown: Prometheus did not answer."""

# ---- the Admitted condition: has Kueue admitted the queued roles' groups? -------------------------
# False takes Kueue's own reason from the waiting Workload's QuotaReserved condition (Pending,
# Inadmissible, ...); these are the operator's for what Kueue cannot say.
ADMITTED = "Admitted"
"""True: Kueue admitted every group of every queued role (Kueue's reason for its own Admitted)."""
KUEUE_MISSING = "KueueMissing"
"""False: a role names a queue, but the cluster serves no Kueue Workloads; its groups run unqueued."""
NO_WORKLOAD = "NoWorkload"
"""False: a group has no Workload yet (Kueue has not seen the LeaderWorkerSet, or does not manage it)."""
KUEUE_UNAVAILABLE = "KueueUnavailable"
"""Unknown: reading the Workloads failed."""
