"""The SLO scaler's decisions: whole replicas, cooldowns, hysteresis, breach duration, capacity."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from kimik3_operator.planner.scaling import RoleScaling, ScalingSettings
from kimik3_operator.planner.slo_scaler import Memory, Observation, decide, trend_range, within_ratio

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
    calm = Memory(calm_since=NOW - 300)
    # 4 replicas carrying 23: 3 would carry 7.7 each, under 80% of 10: one goes.
    d = run(load=23, current=4, memory=calm)
    assert (d.replicas, d.direction) == (3, "down")
    assert d.memory == Memory(last_scale=NOW, calm_since=NOW - 300)  # the next one waits the cooldown only
    # 3 carrying 17: 2 would carry 8.5 each, over 80%: hold (the band that keeps it from flapping).
    assert run(load=17, current=3, memory=calm).direction == "hold"
    assert run(load=23, current=4, itl=0.035, memory=calm).direction == "hold"  # over 80% of the ITL target
    assert run(load=23, current=4, memory=Memory(last_scale=NOW - 100, calm_since=NOW - 300)).direction == "hold"
    assert run(load=0, current=1, memory=calm).direction == "hold"  # minReplicas


def test_scale_down_waits_until_the_load_has_fit_fewer_replicas_for_the_whole_cooldown() -> None:
    first = run(load=23, current=4)
    assert first.direction == "hold" and first.memory.calm_since == NOW and "for 0 of 300 s" in first.reason
    assert run(load=23, current=4, memory=Memory(calm_since=NOW - 299)).direction == "hold"
    # Any finding that would keep the replica clears the calm: the window starts again.
    for busy in (run(load=31, current=4, memory=Memory(calm_since=NOW - 299)),
                 run(load=23, itl=0.035, current=4, memory=Memory(calm_since=NOW - 299)),
                 run(load=None, current=4, memory=Memory(calm_since=NOW - 299)),
                 run(load=41, current=4, memory=Memory(calm_since=NOW - 299))):
        assert busy.memory.calm_since is None, busy


def test_a_load_on_a_replica_line_does_not_flip_a_replica_away_and_back() -> None:
    # 14 in flight at 4 per replica sits between 3 replicas' threshold (9.6) and their capacity (12):
    # the engines see 9.5 one decision, 12.1 the next. A dip alone must not take the fourth replica.
    scaling = RoleScaling(mode="SLO", min_replicas=2, max_replicas=4, metric="RequestsInFlight", target=4.0,
                          target_source="spec", latency_targets=(("itl", 0.100),))
    fast = ScalingSettings(interval_seconds=2, window_seconds=10, breach_seconds=0, scale_up_cooldown_seconds=4,
                           scale_down_cooldown_seconds=12, prometheus_url=None, ratio=None)
    replicas, memory, seen = 4, Memory(last_scale=NOW - 60), []
    for step in range(60):
        load = (9.5, 12.1, 14.0, 9.0, 13.0)[step % 5]
        d = decide(scaling, fast, now=NOW + 2 * step, current=replicas, ready=replicas,
                   observed=Observation(load=load, latency={"itl": 0.02}), memory=memory, fits=99)
        replicas, memory = d.replicas, d.memory
        seen.append(replicas)
    assert set(seen) == {4}
    # Once the load is gone, replicas go one per cooldown.
    for step in range(60, 90):
        d = decide(scaling, fast, now=NOW + 2 * step, current=replicas, ready=replicas,
                   observed=Observation(load=0.0, latency={"itl": None}), memory=memory, fits=99)
        replicas, memory = d.replicas, d.memory
        seen.append(replicas)
    assert seen[60:].count(3) == 6 and seen[-1] == 2, seen[60:]


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


def test_replicas_waiting_in_a_kueue_queue_are_no_capacity() -> None:
    # 3 replicas, 1 waits in the queue: 25 in flight needs 3 at 10 each, the 2 admitted are short.
    held = decide(DECODE, SETTINGS, now=NOW, current=3, ready=2, observed=Observation(load=25, latency={"itl": 0.02}),
                  memory=FRESH, fits=99, queued=1)
    assert (held.replicas, held.direction) == (3, "hold")
    assert "1 of 3 replica(s) wait in the Kueue queue" in held.reason
    assert held.capacity_limited and "Kueue has admitted 2 of 3" in held.capacity_limited
    # More load than the 3 carry: asking for a 4th would only queue it while one already waits.
    more = decide(DECODE, SETTINGS, now=NOW, current=3, ready=2, observed=Observation(load=41, latency={"itl": 0.02}),
                  memory=FRESH, fits=99, queued=1)
    assert more.replicas == 3 and more.capacity_limited and "wants 5 replicas" in more.capacity_limited
    # Without the queue the same 3 would count: the load fits them, no capacity is missing.
    counted = decide(DECODE, SETTINGS, now=NOW, current=3, ready=3,
                     observed=Observation(load=25, latency={"itl": 0.02}), memory=FRESH, fits=99)
    assert counted.direction == "hold" and counted.capacity_limited is None
    # A load the admitted replicas carry is no reason to hold for the queue.
    light = decide(DECODE, SETTINGS, now=NOW, current=3, ready=2, observed=Observation(load=12, latency={"itl": 0.02}),
                   memory=Memory(calm_since=NOW - 300), fits=99, queued=1)
    assert light.capacity_limited is None and (light.replicas, light.direction) == (2, "down")


def lead(load: float, trend: float, lead_seconds: float, *, current: int = 2, ready: int | None = None,
         memory: Memory = FRESH):
    return decide(DECODE, SETTINGS, now=NOW, current=current, ready=current if ready is None else ready,
                  observed=Observation(load=load, latency={"itl": 0.020}, trend=trend), memory=memory, fits=99,
                  lead_seconds=lead_seconds)


def test_a_rising_load_adds_one_replica_a_cold_start_ahead_of_need() -> None:
    # 15 in flight on 2 replicas (target 10 each), rising 0.01/s: in 900 s, 24, which needs 3.
    d = lead(15, 0.01, 900)
    assert (d.replicas, d.direction) == (3, "up")
    assert "rising 0.01/s reaches 24 in 900 s, the predicted time to Ready, and needs 3 replicas" in d.reason
    # The same slope with a short cold start is not a reason yet, nor is a falling or flat load.
    assert lead(15, 0.01, 60).direction == "hold"
    assert lead(15, -0.05, 900).direction == "hold" and lead(15, 0.0, 900).direction == "hold"
    # One group per decision, however steep the slope; replicas on their way count, without
    # waiting for them: once the projection is covered it asks for nothing more.
    assert lead(15, 1.0, 900).replicas == 3
    assert lead(15, 0.03, 900, current=3, ready=2).replicas == 4  # 42 needs 5: one more than those coming
    assert lead(15, 0.03, 900, current=5, ready=2).direction == "hold"  # 42 fits 5


def test_load_already_past_the_target_is_served_by_the_load_rule() -> None:
    for trend in (0.0005, 0.02):
        d = lead(41, trend, 900)
        assert (d.replicas, d.direction) == (5, "up") and "RequestsInFlight 41 needs 5 replicas at 10 each" in d.reason


def test_non_finite_readings_are_no_data_instead_of_a_failed_pass() -> None:
    for load, trend in ((15.0, math.inf), (15.0, math.nan), (math.inf, 0.01), (math.nan, 0.01)):
        assert lead(load, trend, 900).direction == "hold"
    assert "no load data" in lead(math.inf, 0.01, 900).reason


def test_no_replica_goes_while_the_trend_says_it_will_be_needed_within_a_cold_start() -> None:
    calm = Memory(calm_since=NOW - 300)
    # 4 replicas carrying 23: 3 would do now, but 23 + 0.01 x 900 = 32 would not fit 3 under 80%.
    held = lead(23, 0.01, 900, current=4, memory=calm)
    assert held.direction == "hold" and "rising" in held.reason and "more than 3 replicas carry" in held.reason
    assert lead(23, -0.01, 900, current=4, memory=calm).direction == "down"


def _slope(load_at: Callable[[float], float], start: float, end: float) -> float:
    """Prometheus' deriv(): the least-squares slope of the samples every 15 s in [start, end)."""
    ts = [start + 15 * i for i in range(int((end - start) / 15))]
    mean_t, mean_v = sum(ts) / len(ts), sum(load_at(t) for t in ts) / len(ts)
    return (sum((t - mean_t) * (load_at(t) - mean_v) for t in ts) / sum((t - mean_t) ** 2 for t in ts))


def _replay(load_at: Callable[[float], float], lead_seconds: float, *, seconds: float, cold: float = 900.0,
            replicas: int = 2) -> tuple[float, int, int]:
    """Decide every 15 s on `load_at(t)`, its trend measured as the scaler does (the smaller
    least-squares slope of the last trend_range() and the one before), a replica Ready `cold` s
    after it is asked for; return (seconds with more load than Ready capacity, scale-ups, most
    replicas)."""
    ready_at, memory, short, ups, most = [0.0] * replicas, Memory(), 0.0, 0, replicas
    for step in range(int(seconds / 15)):
        t = step * 15.0
        ready = sum(1 for r in ready_at if r <= t)
        load = load_at(t)
        if load > ready * DECODE.target:
            short += 15
        span = trend_range(lead_seconds, SETTINGS.window_seconds)
        trend = min(_slope(load_at, t - span, t), _slope(load_at, t - 2 * span, t - span))
        d = decide(DECODE, SETTINGS, now=NOW + t, current=replicas, ready=ready,
                   observed=Observation(load=load, latency={"itl": 0.020}, trend=trend), memory=memory,
                   fits=99, lead_seconds=lead_seconds)
        memory = d.memory
        ups += d.replicas > replicas
        ready_at = (ready_at + [t + cold] * (d.replicas - replicas)) if d.replicas >= replicas \
            else sorted(ready_at)[:d.replicas]
        replicas = d.replicas
        most = max(most, replicas)
    return short, ups, most


def test_with_the_lead_rule_capacity_is_there_when_a_ramp_arrives_and_without_it_it_is_late() -> None:
    """Two replicas at half their target, then a ramp to four replicas' worth over two hours, where
    a replica asked for is Ready 900 s later: with the lead rule no moment has more load than Ready
    capacity; a scaler that waits for the load lacks capacity for about a cold start at each
    replica it adds."""
    def ramp(t: float) -> float:
        return 10.0 + 30.0 * min(1.0, max(0.0, (t - 600) / 7200))

    assert _replay(ramp, 900.0, seconds=9000)[0] == 0
    assert _replay(ramp, 0.0, seconds=9000)[0] >= 2 * 900


def test_a_step_in_the_load_is_not_extrapolated() -> None:
    """15 in flight, then 21 from t = 600 s on (3 replicas' worth): the load rule adds the one
    it needs; the lead rule adds nothing to it, since the step lifts only one of the two slopes."""
    def step(t: float) -> float:
        return 15.0 if t < 600 else 21.0

    assert _replay(step, 1800.0, seconds=3600)[1:] == _replay(step, 0.0, seconds=3600)[1:] == (1, 3)


def test_noise_on_a_flat_load_adds_no_group() -> None:
    """A flat 15 in flight on 2 replicas with the wobble of a 60 s average (sd 2) for six hours."""
    rng = random.Random(7)
    wobble = {t: rng.gauss(0, 2) for t in range(-3600, 6 * 3600, 15)}

    def noisy(t: float) -> float:
        return 15.0 + wobble[int(t) - int(t) % 15]

    with_lead, without = _replay(noisy, 1800.0, seconds=6 * 3600), _replay(noisy, 0.0, seconds=6 * 3600)
    assert with_lead[1:] == without[1:], (with_lead, without)
