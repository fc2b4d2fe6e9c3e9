"""The autoscaling part of a plan: per role what it follows, and the scalers' shared settings."""

from __future__ import annotations

from dataclasses import dataclass

from ..api.spec import ScalingMetric


@dataclass(frozen=True)
class RoleScaling:
    """How one autoscaled role scales (resolved from its spec and the perf model)."""

    mode: str
    min_replicas: int
    max_replicas: int
    metric: ScalingMetric
    target: float
    """The metric's value per replica."""
    target_source: str
    """spec | perf model | default."""
    latency_targets: tuple[tuple[str, float], ...] = ()
    """(ttft | itl, seconds) this role's SLO scaler follows."""


@dataclass(frozen=True)
class ScalingSettings:
    """Deployment-wide settings of the scalers."""

    interval_seconds: int
    window_seconds: int
    breach_seconds: int
    scale_up_cooldown_seconds: int
    scale_down_cooldown_seconds: int
    prometheus_url: str | None
    ratio: tuple[float, float] | None
    """(min, max) prefill replicas per decode replica."""
    accepted_issues: frozenset[str] = frozenset()
    """spec.experimental.acceptKnownIssues: the traps (traps.py) a scaler may still step into."""
