"""The SLO scaler's decisions: whole replicas, cooldowns, hysteresis, breach duration, capacity."""

from __future__ import annotations

import pytest

from kimik3_operator.planner.scaling import RoleScaling, ScalingSettings
from kimik3_operator.planner.slo_scaler import Memory, Observation, decide, within_ratio

DECODE = RoleScaling(mode="SLO", min_replicas=1, max_replicas=6, metric="RequestsInFlight", target=10.0,
                     target_source="spec", latency_targets=(("itl", 0.040),))
SETTINGS = ScalingSettings(interval_seconds=15, window_seconds=60, breach_seconds=30, scale_up_cooldown_seconds=60,
                           scale_down_cooldown_seconds=300, prometheus_url=None, ratio=None)
NOW = 10_000.0
FRESH = Memory()


def run(load: float | None, itl: float | None = 0.020, *, current: int = 2, ready: int | None = None,
        memory: Memory = FRESH, fits: int = 99, scaling: RoleScaling = DECODE):
    return decide(scaling, SETTINGS, now=NOW, current=current, ready=current if ready is None else ready,
                  observed=Observation(load=load, latency={"itl": itl}), memory=memory, fits=fits)


def test_load_beyond_the_target_adds_the_replicas_it_needs_at_once() -> None:
    d = run(load=41)  # 41 in flight at 10 per replica: 5 replicas
    assert (d.replicas, d.direction) == (5, "up")
    assert "RequestsInFlight 41 needs 5 replicas" in d.reason
    assert d.memory.last_scale == NOW


def test_up_is_capped_by_max_replicas_and_by_what_the_pool_holds() -> None:
    assert run(load=1000).replicas == DECODE.max_replicas
    limited = run(load=41, fits=3)
    assert limited.replicas == 3 and limited.capacity_limited
    assert "wants 5 replicas" in limited.capacity_limited and "hold 3" in limited.capacity_limited
    held = run(load=41, fits=2)
    assert held.replicas == 2 and held.direction == "hold" and held.capacity_limited


def test_a_latency_breach_adds_one_replica_only_after_breach_seconds() -> None:
    started = run(load=5, itl=0.055)
    assert started.direction == "hold" and started.memory.breach_since == NOW
    later = run(load=5, itl=0.055, memory=Memory(breach_since=NOW - 31))
    assert (later.replicas, later.direction) == (3, "up")
    assert "itl p90 55 ms > 40 ms for 31 s" in later.reason
    assert run(load=5, itl=0.020, memory=Memory(breach_since=NOW - 31)).memory.breach_since is None


def test_no_scale_up_while_asked_replicas_are_not_ready_or_within_the_cooldown() -> None:
    assert run(load=41, current=3, ready=2).direction == "hold"
    cooling = run(load=41, memory=Memory(last_scale=NOW - 10))
    assert cooling.direction == "hold" and "cooldown" in cooling.reason


def test_scale_down_is_one_replica_with_hysteresis_comfortable_latency_and_cooldown() -> None:
    # 4 replicas carrying 23: 3 would carry 7.7 each, under 80% of 10: one goes.
    d = run(load=23, current=4)
    assert (d.replicas, d.direction) == (3, "down")
    # 3 carrying 17: 2 would carry 8.5 each, over 80%: hold (the band that keeps it from flapping).
    assert run(load=17, current=3).direction == "hold"
    assert run(load=23, current=4, itl=0.035).direction == "hold"  # over 80% of the ITL target
    assert run(load=23, current=4, memory=Memory(last_scale=NOW - 100)).direction == "hold"
    assert run(load=0, current=1).direction == "hold"  # minReplicas


def test_no_data_never_scales_down() -> None:
    assert run(load=None, itl=None, current=4).direction == "hold"


def test_steady_load_does_not_oscillate() -> None:
    replicas, memory, seen = 2, Memory(), []
    for step in range(60):
        now = NOW + step * 15
        d = decide(DECODE, SETTINGS, now=now, current=replicas, ready=replicas,
                   observed=Observation(load=27, latency={"itl": 0.02}), memory=memory, fits=99)
        replicas, memory = d.replicas, d.memory
        seen.append(replicas)
    assert seen[0] == 3 and set(seen) == {3}


@pytest.mark.parametrize(("prefill", "decode", "band", "want"), [
    (1, 8, (0.25, 2.0), 2), (9, 4, (0.25, 2.0), 8), (2, 4, (0.25, 2.0), 2), (1, 1, None, 1)])
def test_the_prefill_decode_ratio_band(prefill: int, decode: int, band: tuple[float, float] | None,
                                       want: int) -> None:
    assert within_ratio(prefill, decode, band)[0] == want
