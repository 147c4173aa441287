"""Feedforward sizing and the leading violation signal (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controllers.errors import ParameterError
from controllers.feedforward import (
    FeedforwardMeasurement,
    FeedforwardParams,
    FeedforwardState,
    arrival_rps,
    headroom_error,
    leading_violation_rate,
    lifts,
    step,
)


@pytest.mark.parametrize(
    ("count", "eps", "queued", "rate", "slo_ms", "expected"),
    [
        (100, 0.10, 0.0, 10.0, 1000.0, 0.10),  # no queue: the measured rate as is
        (100, 0.00, 5.0, 10.0, 1000.0, 0.0),  # 5 waiting, 10 served per SLO: none doomed
        (100, 0.00, 300.0, 10.0, 1000.0, 290 / 400),  # 290 of 300 wait longer than 1 s
        (0, 0.00, 50.0, 0.0, 1000.0, 1.0),  # nothing completes: every waiting request misses
        (100, 0.50, 20.0, 10.0, 1000.0, (50 + 10) / 120),  # finished and doomed add up
    ],
)
def test_leading_violation_rate(count, eps, queued, rate, slo_ms, expected) -> None:
    assert leading_violation_rate(count, eps, queued, rate, slo_ms) == pytest.approx(expected)


@given(st.integers(0, 10_000), st.floats(0, 1), st.floats(0, 1e5), st.floats(0, 1e4), st.floats(1, 1e5))
def test_leading_violation_rate_is_a_rate_and_never_below_measured(count, eps, queued, rate, slo) -> None:
    v = leading_violation_rate(count, eps, queued, rate, slo)
    assert 0.0 <= v <= 1.0
    if queued == 0:
        assert v == eps


def test_arrival_rate_includes_queue_growth() -> None:
    """A saturated zone completes at capacity; the queue's growth is the rest of demand."""
    p = FeedforwardParams(capacity_rps=2.0, target_util=1.0, horizon_s=0.0, drain_s=1e9, alpha=1.0, beta=1.0)
    s, _ = step(p, FeedforwardState(), FeedforwardMeasurement(rate_rps=10.0, queued=0.0), 10.0)
    s, out = step(p, s, FeedforwardMeasurement(rate_rps=10.0, queued=200.0), 10.0)
    assert out.demand_rps == pytest.approx(30.0)  # 10 completed + 200 queued in 10 s
    assert out.replicas == pytest.approx(15.0)


def test_ramp_is_forecast_ahead_and_sized_before_it_arrives() -> None:
    p = FeedforwardParams(capacity_rps=1.0, target_util=1.0, horizon_s=30.0, alpha=0.8, beta=0.8)
    s = FeedforwardState()
    for k in range(20):
        s, out = step(p, s, FeedforwardMeasurement(rate_rps=10.0 + k, queued=0.0), 10.0)
    # rate now 29 and rising 1 per 10 s: three periods ahead is ~32
    assert out.forecast_rps == pytest.approx(32.0, abs=0.5)
    assert out.replicas > 29.0 and out.burst is False


def test_a_jump_is_not_projected_again_over_the_horizon() -> None:
    """10 -> 30 req/s in one window (a 3x burst): a trend fitted across the jump projects it again
    over the horizon (here to 70); the forecast counts at most max_ahead (1.25) x what is seen, an
    external one (River's, as the scaler passes it) too, while a gentle ramp (above) is still met ahead."""
    kw = {"capacity_rps": 1.0, "target_util": 1.0, "horizon_s": 40.0, "alpha": 0.8, "beta": 0.8}
    out = {}
    for name, p in (("bounded", FeedforwardParams(**kw)), ("unbounded", FeedforwardParams(**kw, max_ahead=100.0))):
        s = FeedforwardState()
        for _ in range(5):
            s, _ = step(p, s, FeedforwardMeasurement(rate_rps=10.0, queued=0.0), 10.0)
        _, out[name] = step(p, s, FeedforwardMeasurement(rate_rps=30.0, queued=0.0), 10.0)
        _, out[name + " external"] = step(p, s, FeedforwardMeasurement(30.0, 0.0, forecast_rps=90.0), 10.0)
    assert out["unbounded"].forecast_rps > 60.0 and out["unbounded external"].forecast_rps == 90.0
    assert out["bounded"].forecast_rps == pytest.approx(37.5)
    assert out["bounded external"].forecast_rps == pytest.approx(37.5)


def test_backlog_adds_drain_capacity() -> None:
    p = FeedforwardParams(capacity_rps=2.0, target_util=0.5, horizon_s=0.0, drain_s=60.0)
    _, out = step(p, FeedforwardState(), FeedforwardMeasurement(rate_rps=4.0, queued=120.0), 10.0)
    assert out.backlog_rps == pytest.approx(2.0)
    assert out.replicas == pytest.approx((4.0 + 2.0) / 1.0)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"capacity_rps": 0.0}, "capacity_rps"),
        ({"capacity_rps": 1.0, "target_util": 2.5}, "target_util"),
        ({"capacity_rps": 1.0, "drain_s": -1.0}, "drain_s"),
        ({"capacity_rps": 1.0, "decay_per_step": 2.0}, "decay_per_step"),
        ({"capacity_rps": 1.0, "max_ahead": 0.5}, "max_ahead"),
        ({"capacity_rps": 1.0, "lift_z": -1.0}, "lift_z"),
        ({"capacity_rps": 1.0, "error_margin": -0.5}, "error_margin"),
        ({"capacity_rps": 1.0, "tolerance": float("nan")}, "tolerance"),
    ],
)
def test_parameters_are_validated(kwargs, name) -> None:
    with pytest.raises(ParameterError, match=name):
        FeedforwardParams(**kwargs)


def test_state_round_trips() -> None:
    s = FeedforwardState(level=3.0, trend=0.5, steps=4, queued=7.0, in_system=31.0)
    assert FeedforwardState.from_dict(s.to_dict()) == s


def test_a_surge_into_the_running_batches_is_demand_before_any_queue() -> None:
    """Continuous batching takes a burst into service before a queue forms (Azure, 3x burst: the
    running count went from 81 to 117 in one window with the queue empty).  Counting what the
    system gained sizes for it in that window; the queue's growth alone reads only completions."""
    p = FeedforwardParams(capacity_rps=3.0, target_util=0.8, horizon_s=0.0, alpha=1.0, beta=1.0)

    def two(running: float | None, running_after: float | None) -> float:
        s, _ = step(p, FeedforwardState(), FeedforwardMeasurement(rate_rps=8.0, queued=0.0, running=running), 10.0)
        _, out = step(p, s, FeedforwardMeasurement(rate_rps=8.6, queued=0.0, running=running_after), 10.0)
        return out.arrival_rps

    assert two(81.0, 117.0) == pytest.approx(8.6 + 3.6)
    assert two(None, None) == pytest.approx(8.6)  # no running count: queue growth only
    assert two(81.0, None) == pytest.approx(8.6)  # reported once only: no difference to take


def test_a_draining_batch_is_not_read_as_new_demand() -> None:
    """After a burst the batches drain: completions run at 28 req/s for a window while 8 req/s
    arrive.  Counting the queue alone reads 28; conservation reads what arrived."""
    assert arrival_rps(28.0, 0.0, 0.0, 40.0, 240.0, 10.0) == pytest.approx(8.0)
    assert arrival_rps(28.0, 0.0, 0.0, None, None, 10.0) == pytest.approx(28.0)
    assert arrival_rps(1.0, 0.0, 0.0, 0.0, 500.0, 10.0) == 0.0  # never negative
    with pytest.raises(ParameterError, match="dt_s"):
        arrival_rps(1.0, 0.0, 0.0, 0.0, 1.0, 0.0)


@given(st.floats(0, 50), st.floats(0, 100), st.floats(0.1, 2.0), st.floats(0, 30), st.floats(1, 300))
def test_headroom_error_is_at_most_the_error_and_falls_with_slack(mae, rate, util, slack, horizon) -> None:
    e = headroom_error(mae, rate, util, slack, horizon)
    assert 0.0 <= e <= mae + 1e-12
    assert headroom_error(mae, rate, util, slack + 1.0, horizon) <= e
    assert headroom_error(mae, rate, util, 0.0, horizon) >= e


def test_slack_of_a_loose_slo_absorbs_what_a_tight_one_must_cover() -> None:
    """The same forecast error: with Azure's 1 s TTFT SLO (0.9 s slack) nearly all of it needs
    replicas; with Mooncake's 6 s (4.5 s slack at its rate) a quarter less; the margin follows."""
    p = FeedforwardParams(capacity_rps=0.2, target_util=0.8, horizon_s=40.0, error_margin=1.5)
    tight = headroom_error(1.0, 2.0, 0.8, 0.9, 40.0)
    loose = headroom_error(1.0, 2.0, 0.8, 4.5, 40.0)
    assert tight == pytest.approx(0.984 - 0.05625, abs=1e-3) and loose == pytest.approx(0.984 - 0.28125, abs=1e-3)

    def demand(slack: float | None) -> float:
        meas = FeedforwardMeasurement(rate_rps=2.0, queued=0.0, forecast_rps=2.0, forecast_error_rps=1.0, slack_s=slack)
        return step(p, FeedforwardState(), meas, 10.0)[1].demand_rps

    assert demand(None) == pytest.approx(2.0 + 1.5 * 0.984, abs=2e-3)  # no P50: nothing absorbed
    assert demand(4.5) == pytest.approx(2.0 + 1.5 * loose)


@pytest.mark.parametrize(("field", "value"), [("running", -1.0), ("slack_s", -0.5), ("running", float("nan"))])
def test_measurement_rejects_bad_running_and_slack(field: str, value: float) -> None:
    with pytest.raises(ParameterError, match=field):
        FeedforwardMeasurement(rate_rps=1.0, queued=0.0, **{field: value})


@pytest.mark.parametrize(
    ("rate", "capacity", "util", "level", "needs_beyond"),
    [
        (1.75, 0.2, 1.0, 10.0, 2.0 * (1.75 / 10) ** 0.5 / 0.2),  # Mooncake-like: the counting noise decides
        (10.0, 2.5, 0.8, 5.0, 2.0 * (10.0 / 10) ** 0.5 / 2.0),  # Azure replay-like: noise (1 replica) over 10 %
        (100.0, 2.5, 0.8, 50.0, 5.0),  # a step's 100 req/s: 1.6 replicas of noise, the 10 % tolerance decides
        (0.0, 1.0, 1.0, 3.0, 0.3),  # no traffic: no noise, the tolerance alone
    ],
)
def test_a_lift_needs_the_larger_of_tolerance_and_counting_noise(rate, capacity, util, level, needs_beyond) -> None:
    p = FeedforwardParams(capacity_rps=capacity, target_util=util)
    assert not lifts(p, level, level + needs_beyond * 0.99, rate, 10.0)
    assert lifts(p, level, level + needs_beyond * 1.01, rate, 10.0)


def test_without_the_noise_term_the_tolerance_alone_decides() -> None:
    p = FeedforwardParams(capacity_rps=0.2, target_util=1.0, lift_z=0.0)
    assert lifts(p, 10.0, 11.01, 1.75, 10.0) and not lifts(p, 10.0, 10.99, 1.75, 10.0)


def test_a_burst_lifts_in_its_first_window_at_a_low_rate() -> None:
    """3x a Mooncake zone's 1.75 req/s is 8 sd of one window's counting noise: no waiting for evidence."""
    p = FeedforwardParams(capacity_rps=0.2, target_util=1.0)
    assert lifts(p, 8.75, 3 * 8.75, 3 * 1.75, 10.0)
