"""The SLO scaler's decision for one role (pure; reconcile/autoscaler.py runs it every interval).

A replica is a whole multi-node group that loads 1.6 TB before it serves, so the scaler is slow
to move and quick to explain itself: it adds replicas when the load per replica passes the target
or a latency target stays missed for `breach_seconds`, and ahead of time when the load's
trend says the target will be passed before a replica added now could be Ready (the lead time is the
role's predicted cold start, cold_start.py: a replica asked for only once the load is there arrives
tens of minutes late); it removes one at a time, only when the
remaining replicas would still run under the scale-down threshold and latency is comfortably
under target, and only once that has held for the scale-down cooldown (the HPA's scale-down
stabilization window, which render/autoscalers.py sets to the same value: one dip of a load that
sits on a replica line is not a reason to drop a group that took minutes to load); it waits for
the replicas it asked for to become Ready before it asks again; and it never asks for more than
the pool's free GPUs hold (capacity.py), saying so instead.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from .scaling import RoleScaling, ScalingSettings

SCALE_DOWN_HEADROOM = 0.8
"""A replica is removed only if the rest would carry at most this share of their target: the gap
to the scale-up threshold is the hysteresis that keeps a steady load from flapping."""
LATENCY_COMFORT = 0.8
"""Latency must be under this share of its target before a replica may go."""
TREND_WINDOWS = 5
"""The shortest range the load's trend is measured over, in windows (5 min by default)."""
TREND_SHARE_OF_LEAD = 3
"""The trend's range is at least a third of the lead it is extrapolated over: the slope of a short
range, projected half an hour ahead, turns a 60 s average's wobble into whole replicas (a replay of a
flat, noisy load: five groups added in six hours over 5 min ranges, none over 10 min)."""
TREND_MAX_SECONDS = 3600


def trend_range(lead_seconds: float, window_seconds: int) -> int:
    """Seconds of each of the two ranges the load's slope is measured over. Twice, over the last
    range and the one before it, and the smaller slope counts: a step in the load (a new tenant,
    a burst that stays) lifts the slope of one range only, noise rarely lifts both, a ramp lifts
    both, so only a ramp is extrapolated over a cold start."""
    return min(TREND_MAX_SECONDS, max(TREND_WINDOWS * window_seconds, math.ceil(lead_seconds / TREND_SHARE_OF_LEAD)))


@dataclass(frozen=True)
class Observation:
    """What Prometheus said about one role over the window (None: no data, e.g. no engine yet)."""

    load: float | None
    latency: Mapping[str, float | None]
    """Per latency target name (ttft | itl): the window's p90 in seconds."""
    trend: float | None = None
    """How fast `load` has been changing, per second: the smaller of its slopes (Prometheus' deriv)
    over the last trend_range() and the one before it."""


@dataclass(frozen=True)
class Memory:
    """What the scaler remembers of a role between decisions (kept in status, so a restart or a
    new leader carries on): when it last scaled, and since when each latency target is missed."""

    last_scale: float | None = None
    breach_since: float | None = None
    calm_since: float | None = None
    """Since when every decision found one replica fewer enough (cleared by any other finding)."""


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str
    memory: Memory
    capacity_limited: str | None = None
    """Set when the pool's free GPUs held fewer replicas than wanted: the numbers, for the condition."""

    @property
    def direction(self) -> str:
        return self.reason.split(":", 1)[0]


def decide(scaling: RoleScaling, settings: ScalingSettings, *, now: float, current: int, ready: int,
           observed: Observation, memory: Memory, fits: int, queued: int = 0, lead_seconds: float = 0.0) -> Decision:
    """The next replica count of one role, and why. `fits` is how many replicas of the role the pool
    could hold now (its current ones included); `queued` how many of the current ones Kueue has not
    admitted (planner/queueing.py): they serve nothing and hold no GPU, so they are no capacity,
    and asking for more while some wait would only queue more. `lead_seconds`: how long a replica
    added now takes to be Ready (the role's predicted cold start).

    The lead rule: when the load has been rising steadily (`trend`), its value `lead_seconds` from
    now (load + trend x lead) is what a replica added now will meet. If that needs more replicas
    than there are, counting those still starting, one is added, without waiting for the ones on
    their way: the projection, unlike the load, already counts them (a summed load does not fall
    when replicas join), and one per decision, after the scale-up cooldown, keeps pace with any
    ramp a cold start can follow while a wrong slope costs one group, not maxReplicas. While the
    load is projected above what one replica fewer would carry, none goes."""
    def hold(reason: str, mem: Memory = memory) -> Decision:
        return Decision(current, f"hold: {reason}", mem)

    if observed.load is not None and not math.isfinite(observed.load):
        observed = dataclasses.replace(observed, load=None)  # Prometheus can answer NaN or +Inf: no data

    missed = [(name, seen, want) for name, want in scaling.latency_targets
              if (seen := observed.latency.get(name)) is not None and seen > want]
    breach_since = (memory.breach_since if memory.breach_since is not None else now) if missed else None
    mem = Memory(memory.last_scale, breach_since)  # any finding but a calm one clears calm_since
    since_scale = math.inf if memory.last_scale is None else now - memory.last_scale

    by_load = None if observed.load is None else math.ceil(observed.load / scaling.target - 1e-9)
    want = current
    why = ""
    if by_load is not None and by_load > current:
        want = by_load
        why = f"{scaling.metric} {observed.load:.3g} needs {by_load} replicas at {scaling.target:.3g} each"
    ahead = _ahead(scaling, observed, lead_seconds)
    by_trend = ahead is not None and by_load is not None and ahead[0] > max(current, by_load)
    if by_trend and want == current:
        assert ahead is not None and observed.load is not None
        want = current + 1
        why = (f"{scaling.metric} {observed.load:.3g} rising {ahead[1]:.3g}/s reaches {ahead[2]:.3g} in "
               f"{lead_seconds:.0f} s, the predicted time to Ready, and needs {ahead[0]} replicas at "
               f"{scaling.target:.3g} each")
    breached_for = 0.0 if breach_since is None else now - breach_since
    if missed and breached_for >= settings.breach_seconds and want <= current:
        name, seen, target = missed[0]
        want = current + 1
        why = f"{name} p90 {_seconds(seen)} > {_seconds(target)} for {breached_for:.0f} s"
    if current < scaling.min_replicas:
        want, why = scaling.min_replicas, f"below minReplicas {scaling.min_replicas}"
    admitted = current - queued
    if queued > 0 and current <= scaling.max_replicas and (
            want > current or (by_load is not None and by_load > admitted)):
        needs = max(want, by_load or 0)
        why = why or f"{scaling.metric} {observed.load:.3g} needs {needs} replicas at {scaling.target:.3g} each"
        return Decision(current, f"hold: {queued} of {current} replica(s) wait in the Kueue queue", mem,
                        capacity_limited=f"wants {max(needs, admitted + 1)} replicas ({why}); Kueue has admitted "
                                         f"{admitted} of {current}, {queued} wait in its queue holding no GPU")
    if current > scaling.max_replicas:
        return Decision(scaling.max_replicas, f"down: above maxReplicas {scaling.max_replicas}",
                        Memory(now, breach_since))
    if want > current:
        want = min(want, scaling.max_replicas)
        if want == current:
            return hold(f"at maxReplicas {scaling.max_replicas} ({why})", mem)
        # What the nodes hold is said whether or not this decision may act, so the condition
        # does not come and go with the cooldown.
        limited = None
        if want > fits:
            limited = f"wants {want} replicas ({why}), the pool's free GPUs hold {fits}"
            want = max(current, fits)
        if want == current:
            return Decision(current, f"hold: {limited}", mem, capacity_limited=limited)
        if ready < current and not by_trend:
            # A projection already counts the replicas on their way (they are in `current`); the
            # load does not, until they serve.
            return Decision(current, f"hold: {current - ready} replica(s) asked for are not Ready yet", mem,
                            capacity_limited=limited)
        if since_scale < settings.scale_up_cooldown_seconds and current >= scaling.min_replicas:
            return Decision(current, f"hold: scale-up cooldown ({since_scale:.0f} of "
                                     f"{settings.scale_up_cooldown_seconds} s)", mem, capacity_limited=limited)
        return Decision(want, f"up: {why}", Memory(now, breach_since), capacity_limited=limited)

    # Scale down: one replica at a time, only if the rest stay under the threshold and latency is comfortable.
    if by_load is None or current <= scaling.min_replicas:
        return hold("no load data" if by_load is None else f"at minReplicas {scaling.min_replicas}", mem)
    fewer = current - 1
    if observed.load is not None and observed.load > fewer * scaling.target * SCALE_DOWN_HEADROOM:
        return hold(f"{scaling.metric} {observed.load:.3g} within capacity of {current} replicas", mem)
    if ahead is not None and ahead[2] > fewer * scaling.target * SCALE_DOWN_HEADROOM:
        return hold(f"{scaling.metric} {observed.load:.3g} rising {ahead[1]:.3g}/s reaches {ahead[2]:.3g} within "
                    f"{lead_seconds:.0f} s, the predicted time to Ready, more than {fewer} replicas carry", mem)
    warm = [(name, seen, want_s) for name, want_s in scaling.latency_targets
            if (seen := observed.latency.get(name)) is not None and seen > want_s * LATENCY_COMFORT]
    if warm:
        name, seen, target = warm[0]
        return hold(f"{name} p90 {_seconds(seen)} is not under {LATENCY_COMFORT:.0%} of {_seconds(target)}", mem)
    calm_since = memory.calm_since if memory.calm_since is not None else now
    calm = Memory(memory.last_scale, breach_since, calm_since)
    window = settings.scale_down_cooldown_seconds
    if since_scale < window:
        return hold(f"scale-down cooldown ({since_scale:.0f} of {window} s)", calm)
    if now - calm_since < window:
        return hold(f"{scaling.metric} {observed.load:.3g} fits {fewer} replicas for {now - calm_since:.0f} of "
                    f"{window} s", calm)
    return Decision(fewer, f"down: {scaling.metric} {observed.load:.3g} fits {fewer} replicas "
                           f"under {SCALE_DOWN_HEADROOM:.0%} of {scaling.target:.3g} each",
                    Memory(now, None, calm_since))


def _ahead(scaling: RoleScaling, observed: Observation, lead_seconds: float) -> tuple[int, float, float] | None:
    """(replicas needed, trend, projected load) `lead_seconds` ahead on a rising load; None otherwise."""
    load, trend = observed.load, observed.trend  # decide() has made a non-finite load None
    if load is None or trend is None or not math.isfinite(trend) or trend <= 0 or lead_seconds <= 0:
        return None
    projected = load + trend * lead_seconds
    return math.ceil(projected / scaling.target - 1e-9), trend, projected


def within_ratio(prefill: int, decode: int, ratio: tuple[float, float] | None) -> tuple[int, str]:
    """Prefill replicas moved into the P:D band, and why (empty: already inside)."""
    if ratio is None or decode <= 0:
        return prefill, ""
    low, high = math.ceil(ratio[0] * decode - 1e-9), math.floor(ratio[1] * decode + 1e-9)
    if prefill < low:
        return low, f"prefill:decode {prefill}:{decode} below the ratio band's {ratio[0]:g}"
    if prefill > max(high, 1):
        return max(high, 1), f"prefill:decode {prefill}:{decode} above the ratio band's {ratio[1]:g}"
    return prefill, ""


def _seconds(value: float) -> str:
    return f"{value * 1e3:.0f} ms" if value < 10 else f"{value:.1f} s"
