"""Canary controller (docs/model.md §14 (canary)): stages, holds, rollback rules, abort, exposure."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from controllers.canary import (
    CanaryParams,
    CanaryState,
    VersionObs,
    abort,
    exceedances,
    expected_exposure,
    start,
    step,
    traffic_share,
)
from controllers.errors import ParameterError

DT = 10.0
P = CanaryParams(hold_s=60.0, min_requests_per_stage=100)


def healthy(n: int = 1000) -> VersionObs:
    return VersionObs(n, 0, 300.0)


def run(params: CanaryParams, windows: list[tuple[VersionObs, VersionObs]], t0: float = 0.0):
    """Start at t0 and feed one (canary, stable) pair per DT; return state and outputs."""
    s, outs, t = start(params, t0), [], t0
    for canary, stable in windows:
        t += DT
        s, out = step(params, s, canary, stable, t)
        outs.append(out)
    return s, outs


@pytest.mark.parametrize(
    ("canary", "rolls_back"),
    [
        (VersionObs(1000, 10, 300.0), True),  # 1 % errors at the 1 % stage: 0.01 > 0.008
        (VersionObs(1000, 8, 300.0), False),  # exactly 0.8 % is not above the limit
        (VersionObs(1000, 9, 300.0), True),  # 0.9 %
        (VersionObs(100, 1, 300.0), False),  # 1 error in 100: judged 1/250 = 0.4 %
        (VersionObs(100, 3, 300.0), True),  # 3 errors: 3/250 = 1.2 % even before 250 requests
        (VersionObs(100, 0, 900.0), True),  # p99 900 ms > 800 ms
        (VersionObs(100, 0, 800.0), False),  # p99 exactly 800 ms is allowed
        (VersionObs(10, 0, 2000.0), False),  # p99 of 10 requests (< 20) is not judged
        (VersionObs(0, 0, None), False),  # an empty window says nothing
    ],
)
def test_rollback_rules_at_the_first_stage(canary, rolls_back) -> None:
    s, (out,) = run(P, [(canary, healthy(99_000))])
    assert (out.state_name == "rolled_back") is rolls_back
    assert out.traffic_share == (0.0 if rolls_back else 0.01)
    if rolls_back:
        assert out.changed and s.stage == 0 and "rolled back at 1%" in out.reason


def test_errors_accumulate_over_the_stage() -> None:
    """Two windows of 150 with 1 and 2 errors: 3/300 = 1 % > 0.8 %, caught in the second."""
    s, outs = run(P, [(VersionObs(150, 1, 300.0), healthy()), (VersionObs(150, 2, 300.0), healthy())])
    assert [o.state_name for o in outs] == ["running", "rolled_back"]


def test_healthy_version_promotes_through_all_stages_in_the_sum_of_holds() -> None:
    p = CanaryParams(hold_s=(30.0, 40.0, 50.0, 60.0), min_requests_per_stage=100)
    s, outs = run(p, [(healthy(), healthy())] * 30)
    promoted_at = next(i for i, o in enumerate(outs) if o.state_name == "promoted")
    assert (promoted_at + 1) * DT == 30.0 + 40.0 + 50.0 + 60.0
    shares = [o.traffic_share for o in outs]
    assert shares[:3] == [0.01, 0.01, 0.05]  # 1 % held 30 s, then 5 %
    changes = [(i + 1) * DT for i, o in enumerate(outs) if o.changed]
    assert changes == [30.0, 70.0, 120.0, 180.0]  # stage ends at the cumulative holds
    assert s.name == "promoted" and traffic_share(p, s) == 1.0
    assert outs[-1].traffic_share == 1.0 and not outs[-1].changed


def test_promotion_waits_for_enough_requests() -> None:
    """The hold elapsed but only 40 canary requests of 100: keep holding."""
    s, outs = run(P, [(VersionObs(5, 0, 300.0), healthy())] * 8)
    assert all(o.state_name == "running" and o.stage == 0 for o in outs)
    assert "40/100 requests" in outs[-1].reason


def test_rollback_at_a_later_stage() -> None:
    bad = VersionObs(1000, 0, 950.0)
    s, outs = run(P, [(healthy(), healthy())] * 6 + [(bad, healthy())])
    assert outs[5].reason == "promote to 5%"
    assert outs[-1].state_name == "rolled_back" and s.stage == 1
    assert "rolled back at 5%: p99 950 ms > 800 ms" == outs[-1].reason


@pytest.mark.parametrize(
    ("kwargs", "canary", "stable", "rolls_back"),
    [
        # canary 0.6 % vs stable 0.1 %: within 0.8 % but 0.5 points worse than stable > 0.3
        ({"max_error_rate_delta": 0.003}, VersionObs(1000, 6, 300.0), VersionObs(1000, 1, 300.0), True),
        # 0.6 % vs 0.4 %: 0.2 points worse, within the 0.3 margin
        ({"max_error_rate_delta": 0.003}, VersionObs(1000, 6, 300.0), VersionObs(1000, 4, 300.0), False),
        # p99 600 vs stable 300: under 800 ms but 2x > 1.5x stable
        ({"max_p99_ratio": 1.5}, VersionObs(100, 0, 600.0), VersionObs(100, 0, 300.0), True),
        # p99 400 vs 300: 1.33x, within 1.5x
        ({"max_p99_ratio": 1.5}, VersionObs(100, 0, 400.0), VersionObs(100, 0, 300.0), False),
        # relative rules off by default: 0.6 % vs 0.1 % alone does not roll back
        ({}, VersionObs(1000, 6, 300.0), VersionObs(1000, 1, 300.0), False),
    ],
)
def test_relative_to_stable(kwargs, canary, stable, rolls_back) -> None:
    p = CanaryParams(hold_s=60.0, **kwargs)
    _, (out,) = run(p, [(canary, stable)])
    assert (out.state_name == "rolled_back") is rolls_back


def test_pending_does_nothing_and_terminal_states_stay() -> None:
    s, out = step(P, CanaryState(), healthy(), healthy(), 10.0)
    assert out.state_name == "pending" and out.traffic_share == 0.0 and s == CanaryState()
    s, _ = run(P, [(VersionObs(1000, 50, 300.0), healthy())])
    s2, out = step(P, s, healthy(), healthy(), 999.0)
    assert s2 == s and out.state_name == "rolled_back" and not out.changed


def test_abort() -> None:
    s = abort(start(P, 0.0), "operator")
    assert s.name == "aborted" and s.reason == "aborted: operator" and traffic_share(P, s) == 0.0
    s, _ = run(P, [(healthy(), healthy())] * 30)
    assert abort(s, "late").name == "promoted"  # a finished rollout is left alone


def test_stalled_stage_aborts() -> None:
    p = CanaryParams(hold_s=60.0, min_requests_per_stage=100, max_stage_s=90.0)
    _, outs = run(p, [(VersionObs(1, 0, 300.0), healthy())] * 10)
    assert outs[8].state_name == "running"  # 90 s: not yet over max_stage_s
    assert outs[9].state_name == "aborted" and "stalled at 1%" in outs[9].reason


# -- sequential latency tests ------------------------------------------------------------
STABLE = VersionObs(400, 0, 150.0, 80.0, 120.0)  # 400 requests, TTFT P95 120 ms: threshold 2 x 120


def window(p50: float, p95: float, p99: float, n: int = 4) -> VersionObs:
    return VersionObs(n, 0, p99, p50, p95)


@pytest.mark.parametrize(
    ("obs", "threshold", "count"),
    [
        (window(300.0, 400.0, 500.0), 240.0, 2),  # median of 4 over: rank 1.5 -> the 2 largest
        (window(200.0, 300.0, 350.0), 240.0, 1),  # only P95 over: rank 2.85 -> the largest
        (window(200.0, 230.0, 239.0), 240.0, 0),  # nothing over
        (window(100.0, 200.0, 900.0, n=100), 800.0, 1),  # P99 of 100: rank 98.01 -> 1
        (window(100.0, 900.0, 950.0, n=100), 800.0, 5),  # P95 of 100: rank 94.05 -> 5
        (window(900.0, 900.0, 900.0, n=1), 800.0, 1),  # a single request over
        (VersionObs(4, 0, 900.0), 800.0, 1),  # only a P99 known
        (VersionObs(0, 0, None), 800.0, 0),  # an empty window
    ],
)
def test_exceedances_are_rank_bounds_of_the_quantiles(obs, threshold, count) -> None:
    assert exceedances(obs, threshold) == count


def test_exceedance_bound_holds_on_samples() -> None:
    """Oracle: on random samples the bound never exceeds the true count."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        xs = rng.lognormal(5.0, 0.8, size=int(rng.integers(1, 60)))
        thr = float(rng.uniform(50, 600))
        obs = VersionObs(len(xs), 0, *(float(np.percentile(xs, q)) for q in (99, 50, 95)))
        assert exceedances(obs, thr) <= int((xs > thr).sum())


def test_slower_than_stable_rolls_back_on_the_third_small_window() -> None:
    """Canary median 300 ms > 2 x stable's P95 (240 ms): 2 of 4 over per window.

    llr after w windows: w (2 ln 10 + 2 ln(0.5 / 0.95)) = 3.32 w; ln(1/0.001) = 6.91
    is crossed at w = 3 (6.64 after two).  No window has 20 requests, so no P99 is judged.
    """
    s, outs = run(P, [(window(300.0, 400.0, 500.0), STABLE)] * 3)
    assert [o.state_name for o in outs] == ["running", "running", "rolled_back"]
    assert (s.stage_slow, s.stage_ref_requests) == (6, 12)
    assert "6/12 requests over 2 x stable's p95" in outs[-1].reason


@pytest.mark.parametrize(
    ("params", "canary", "stable"),
    [
        (P, window(150.0, 200.0, 230.0), STABLE),  # 1.9x stable's P95 at most: within k = 2
        (P, window(300.0, 400.0, 500.0), VersionObs(99, 0, 150.0, 80.0, 120.0)),  # stable < 100
        (P, window(300.0, 400.0, 500.0), VersionObs(400, 0, 150.0)),  # stable P95 unknown
        (
            CanaryParams(hold_s=60.0, min_requests_per_stage=100, max_slowdown=None),
            window(300.0, 400.0, 500.0),
            STABLE,
        ),  # the relative rule off
    ],
)
def test_no_relative_rollback_without_a_reference_or_within_k(params, canary, stable) -> None:
    s, outs = run(params, [(canary, stable)] * 20)
    assert all(o.state_name == "running" for o in outs)


def test_tail_over_the_p99_limit_rolls_back_sequentially() -> None:
    """One request of 4 over 800 ms per window (25 %, P99 limit allows 1 %).

    llr per window: ln 5 + 3 ln(0.95 / 0.99) = 1.486; crosses 6.91 in window 5.
    Stable has no P95, so only the absolute rule can fire.
    """
    s, outs = run(P, [(window(300.0, 900.0, 950.0), healthy())] * 5)
    assert [o.state_name for o in outs] == ["running"] * 4 + ["rolled_back"]
    assert s.stage_over_limit == 5 and "5/20 requests over 800 ms" in outs[-1].reason


def test_sequential_counts_restart_at_each_stage() -> None:
    """4 slow windows spread over two stages (2 + 2) never reach the bound."""
    p = CanaryParams(hold_s=20.0, min_requests_per_stage=8)
    slow = window(300.0, 400.0, 500.0)
    s, outs = run(p, [(slow, STABLE), (slow, STABLE), (slow, STABLE)])
    assert outs[1].reason == "promote to 5%" and outs[2].state_name == "running"
    assert (s.stage, s.stage_slow, s.stage_ref_requests) == (1, 2, 4)


@pytest.mark.parametrize(
    ("p_over", "max_rollbacks", "min_rollbacks"),
    [
        (0.01, 0.05 + 0.035, 0.0),  # H0 at its boundary: <= alpha (+3 sigma)
        (0.10, 1.0, 0.95),
    ],
)  # 10x the allowed tail: caught
def test_false_rollbacks_stay_under_alpha_over_many_windows(p_over, max_rollbacks, min_rollbacks) -> None:
    """Monte Carlo over 200 one-request windows: Ville's bound, and power."""
    p = CanaryParams(hold_s=1e9, sequential_alpha=0.05, max_slowdown=None)
    rng = np.random.default_rng(11)
    runs, rolled = 300, 0
    for _ in range(runs):
        over = rng.random(200) < p_over
        _, outs = run(p, [(window(*[900.0 if o else 100.0] * 3, n=1), healthy()) for o in over])
        rolled += outs[-1].state_name == "rolled_back"
    assert min_rollbacks <= rolled / runs <= max_rollbacks


@pytest.mark.parametrize(
    ("stage", "elapsed", "expected"),
    [
        (0, None, 0.01),  # caught during the 1 % stage: 1 % of requests
        (1, 60.0, (0.6 + 3.0) / 120),  # a full 5 % stage after a full 1 % stage
        (2, 30.0, (0.6 + 3.0 + 6.0) / 150),  # half way through 20 %: 6.4 %
        (3, 60.0, (0.6 + 3.0 + 12.0 + 60.0) / 240),  # the whole rollout
    ],
)
def test_expected_exposure(stage, elapsed, expected) -> None:
    assert expected_exposure(P, stage, elapsed) == pytest.approx(expected)


def test_measured_exposure() -> None:
    s, _ = run(P, [(VersionObs(10, 0, 300.0), VersionObs(990, 0, 300.0))] * 3)
    assert s.exposure == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"stages": (0.2, 0.1)}, "stages"),
        ({"stages": ()}, "stages"),
        ({"stages": (0.0, 1.0)}, "stages"),
        ({"hold_s": (10.0, 10.0)}, "hold_s"),
        ({"max_error_rate": 0.0}, "max_error_rate"),
        ({"max_p99_ms": 0.0}, "max_p99_ms"),
        ({"max_p99_ratio": 0.5}, "max_p99_ratio"),
        ({"min_requests_per_stage": -1}, "min_requests_per_stage"),
        ({"max_stage_s": 10.0}, "max_stage_s"),
        ({"sequential_alpha": 0.0}, "sequential_alpha"),
        ({"limit_p1": 0.01}, "limit_p1"),
        ({"slowdown_p1": 0.04}, "slowdown_p1"),
        ({"max_slowdown": 0.5}, "max_slowdown"),
        ({"min_ref_requests": -1}, "min_ref_requests"),
    ],
)
def test_params_are_validated(kwargs, name) -> None:
    with pytest.raises(ParameterError, match=name):
        CanaryParams(**kwargs)


def test_observations_are_validated() -> None:
    with pytest.raises(ParameterError, match="errors"):
        VersionObs(5, 6, 100.0)


def test_state_round_trips() -> None:
    s, _ = run(P, [(healthy(), healthy())] * 7)
    assert CanaryState.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert pickle.loads(pickle.dumps(s)) == s


obs = st.builds(
    lambda n, e, p: VersionObs(n, min(e, n), p),
    st.integers(0, 2000),
    st.integers(0, 30),
    st.one_of(st.none(), st.floats(0, 2000)),
)


@given(st.lists(st.tuples(obs, obs, st.booleans()), max_size=40))
def test_traffic_share_is_always_a_stage_value_or_zero_or_one(windows) -> None:
    p = CanaryParams(hold_s=20.0, min_requests_per_stage=50)
    allowed = set(p.stages) | {0.0, 1.0}
    s, t = start(p, 0.0), 0.0
    for canary, stable, aborting in windows:
        t += DT
        s = abort(s, "x") if aborting and t > 300 else s
        s, out = step(p, s, canary, stable, t)
        assert out.traffic_share in allowed
        assert out.traffic_share == traffic_share(p, s)
        assert (out.traffic_share == 0.0) == (s.name in ("rolled_back", "aborted"))
