"""Adaptive circuit breaker (docs/model.md §13 (breaker)): trip rule, cool-down, probes, backoff, attainment."""

from __future__ import annotations

import json
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controllers.breaker import (
    AttainmentHistory,
    BreakerObs,
    BreakerParams,
    BreakerState,
    rolling_attainment,
    step,
    threshold,
)
from controllers.errors import ParameterError

P = BreakerParams()


@pytest.mark.parametrize(
    ("requests", "errors", "attainment", "opens"),
    [
        (1000, 500, 1.0, False),  # 1,000 requests never opens: the window needs > 1,000
        (1000, 1000, 0.0, False),  # ... not even with every request failing
        (1001, 6, 0.9, True),  # thr 0.005*(1+0.5*0.1)=0.00525; 6/1001=0.005994 > thr
        (1001, 5, 0.9, False),  # 5/1001=0.004995 <= 0.00525
        (1001, 6, 1.0, True),  # perfect attainment: thr 0.005; 0.005994 > 0.005
        (1001, 7, 0.0, False),  # zero attainment: thr 0.0075; 7/1001=0.006993 tolerated
        (1001, 8, 0.0, True),  # 8/1001=0.007992 > 0.0075
        (2000, 10, 1.0, False),  # exactly at the threshold: 0.005 is not > 0.005
        (2000, 11, 1.0, True),  # 0.0055 > 0.005
    ],
)
def test_trip_rule(requests, errors, attainment, opens) -> None:
    s, out = step(P, BreakerState(), BreakerObs(requests, errors, attainment), 10.0)
    assert (out.state_name == "open") is opens
    assert out.changed is opens
    assert s.name == out.state_name


@pytest.mark.parametrize(
    ("attainment", "expected"),
    [(1.0, 0.005), (0.9, 0.00525), (0.5, 0.00625), (0.0, 0.0075)],  # 0.005*(1+0.5*(1-a))
)
def test_threshold_values(attainment, expected) -> None:
    assert threshold(P, attainment) == pytest.approx(expected)


def test_window_slides_over_the_latest_thousand_plus_requests() -> None:
    """Small windows accumulate until > 1,000; then the oldest ones slide out."""
    s = BreakerState()
    s, out = step(P, s, BreakerObs(600, 6, 1.0), 10.0)  # 600 requests: not enough
    assert out.state_name == "closed" and out.window_requests == 600
    s, out = step(P, s, BreakerObs(401, 0, 1.0), 20.0)  # 1,001 requests, 6 errors: trips
    assert out.state_name == "open" and out.window_requests == 1001
    assert out.error_ratio == pytest.approx(6 / 1001)


def test_old_windows_slide_out() -> None:
    s = BreakerState()
    s, _ = step(P, s, BreakerObs(600, 6, 1.0), 10.0)
    s, _ = step(P, s, BreakerObs(600, 0, 1.0), 20.0)  # 1,200: ratio 0.005, not above
    s, out = step(P, s, BreakerObs(600, 0, 1.0), 30.0)  # the first 600 drop out (1,200 remain)
    assert out.state_name == "closed" and out.window_requests == 1200 and out.error_ratio == 0.0


def test_windows_older_than_max_age_are_dropped() -> None:
    s, _ = step(P, BreakerState(), BreakerObs(900, 9, 1.0), 0.0)
    s, out = step(P, s, BreakerObs(200, 0, 1.0), 121.0)  # 121 s later: the 900 are too old
    assert out.state_name == "closed" and out.window_requests == 200


def _open(now: float = 0.0) -> BreakerState:
    s, out = step(P, BreakerState(), BreakerObs(1001, 100, 1.0), now)
    assert out.state_name == "open"
    return s


def test_open_until_open_s_then_half_open() -> None:
    s = _open(0.0)
    s, out = step(P, s, BreakerObs(50, 50, 1.0), 29.9)  # still open; traffic ignored
    assert out.state_name == "open" and not out.changed
    s, out = step(P, s, BreakerObs(0, 0, 1.0), 30.0)  # 30 s elapsed
    assert out.state_name == "half_open" and out.changed and out.probe_budget == 20


@pytest.mark.parametrize(
    ("probes", "final", "reopen_s"),
    [
        ([(20, 0)], "closed", None),  # 20 clean probes: 0 < 0.005, close
        ([(10, 0), (10, 0)], "closed", None),  # probes accumulate across windows
        ([(20, 1)], "open", 60.0),  # 1/20 = 0.05 >= 0.005: re-open for 2 x 30 s
        ([(10, 1)], "half_open", None),  # only 10 of 20 probes seen: keep probing
        ([(400, 1)], "closed", None),  # a large window: 1/400 = 0.0025 < 0.005, close
    ],
)
def test_half_open_probes(probes, final, reopen_s) -> None:
    s = _open(0.0)
    s, _ = step(P, s, BreakerObs(0, 0, 1.0), 30.0)
    t = 30.0
    for n, e in probes:
        t += 10.0
        s, out = step(P, s, BreakerObs(n, e, 1.0), t)
    assert out.state_name == final
    if reopen_s is not None:
        assert s.open_for_s == reopen_s and s.opened_at_s == t


def test_probe_ratio_equal_to_threshold_reopens() -> None:
    """Closing needs the probe ratio strictly below the threshold: 2/400 = 0.005 re-opens."""
    s = _open(0.0)
    s, _ = step(P, s, BreakerObs(0, 0, 1.0), 30.0)
    s, out = step(P, s, BreakerObs(400, 2, 1.0), 40.0)
    assert out.state_name == "open"


def test_backoff_doubles_and_is_capped() -> None:
    p = BreakerParams(open_s=30.0, backoff=2.0, max_open_s=100.0)
    s, _ = step(p, BreakerState(), BreakerObs(1001, 100, 1.0), 0.0)
    t, spans = 0.0, []
    for _ in range(4):
        t += s.open_for_s  # wait out the cool-down
        s, out = step(p, s, BreakerObs(0, 0, 1.0), t)
        assert out.state_name == "half_open"
        s, out = step(p, s, BreakerObs(20, 20, 1.0), t)  # probes fail
        assert out.state_name == "open"
        spans.append(s.open_for_s)
    assert spans == [60.0, 100.0, 100.0, 100.0]  # 30 -> 60 -> 120 capped at 100
    assert s.trips == 5


def test_closing_resets_backoff_and_window() -> None:
    s = _open(0.0)
    s, _ = step(P, s, BreakerObs(0, 0, 1.0), 30.0)
    s, _ = step(P, s, BreakerObs(20, 1, 1.0), 31.0)  # fail: open 60 s
    s, _ = step(P, s, BreakerObs(0, 0, 1.0), 91.0)
    s, out = step(P, s, BreakerObs(20, 0, 1.0), 92.0)  # pass
    assert out.state_name == "closed" and s == BreakerState()
    s, _ = step(P, s, BreakerObs(1001, 100, 1.0), 93.0)
    assert s.open_for_s == 30.0  # a fresh trip starts from open_s again


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"base_error_ratio": 0.0}, "base_error_ratio"),
        ({"min_requests": -1}, "min_requests"),
        ({"open_s": 0.0}, "open_s"),
        ({"backoff": 0.5}, "backoff"),
        ({"probe_requests": 0}, "probe_requests"),
        ({"max_open_s": 10.0}, "max_open_s"),
    ],
)
def test_params_are_validated(kwargs, name) -> None:
    with pytest.raises(ParameterError, match=name):
        BreakerParams(**kwargs)


@pytest.mark.parametrize(
    ("args", "name"),
    [((10, 11, 1.0), "errors"), ((-1, 0, 1.0), "requests"), ((10, 1, 1.5), "slo_attainment_5min")],
)
def test_observations_are_validated(args, name) -> None:
    with pytest.raises(ParameterError, match=name):
        BreakerObs(*args)


@given(st.floats(0, 1), st.floats(0, 1))
def test_threshold_is_non_increasing_in_attainment(a, b) -> None:
    lo, hi = sorted((a, b))
    assert threshold(P, hi) <= threshold(P, lo)
    assert 0.005 <= threshold(P, hi) <= 0.0075


@given(st.lists(st.tuples(st.integers(0, 600), st.integers(0, 10), st.floats(0, 1)), max_size=30))
def test_never_opens_on_a_window_of_at_most_min_requests(windows) -> None:
    s, total = BreakerState(), 0
    for i, (n, e, a) in enumerate(windows):
        e = min(e, n)
        total += n
        s, out = step(P, s, BreakerObs(n, e, a), float(i))
        if out.state_name == "open" and out.changed:
            assert out.window_requests > 1000 and out.error_ratio > out.threshold
        if total <= 1000:
            assert s.name == "closed"


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        ([], 1.0),  # no requests: no evidence of violations
        ([(100, 90)], 0.9),  # one window
        ([(100, 90), (300, 300)], 0.975),  # weighted by count, not averaged per window
        ([(0, 0), (10, 5)], 0.5),  # empty windows do not count
    ],
)
def test_rolling_attainment(pairs, expected) -> None:
    assert rolling_attainment(pairs) == pytest.approx(expected)


def test_attainment_history_keeps_five_minutes() -> None:
    h = AttainmentHistory(window_s=10.0)
    assert h.max_windows == 30
    h = h.add(100, 0)  # a bad window ...
    for _ in range(29):
        h = h.add(100, 100)
    assert h.attainment() == pytest.approx(2900 / 3000)
    h = h.add(100, 100)  # ... leaves after 30 more windows
    assert h.attainment() == 1.0


def test_attainment_history_validates() -> None:
    with pytest.raises(ParameterError, match="ok"):
        AttainmentHistory().add(10, 11)


def test_state_round_trips_through_json_and_pickle() -> None:
    s, _ = step(P, BreakerState(), BreakerObs(600, 3, 1.0), 5.0)
    assert BreakerState.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert pickle.loads(pickle.dumps(s)) == s
    h = AttainmentHistory().add(10, 9)
    assert AttainmentHistory.from_dict(json.loads(json.dumps(h.to_dict()))) == h
