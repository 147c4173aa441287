"""Observer: Kalman filter against an independent numpy reference, RK4 against
the closed form, loop-delay EWMA, round trips and validation."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controllers.errors import ParameterError
from controllers.observer import (
    KalmanParams,
    KalmanState,
    LoopDelay,
    load_steady_state,
    predict_ahead,
    update,
)

TRUTH = np.array([0.65, 4.0, 0.03])


def reference_kf(params, x0, p0, zs, dt, steady):
    """Textbook KF (standard covariance update, explicit inverse), written apart."""
    x, p = np.array(x0, float), np.array(p0, float)
    r = np.diag(params.r_diag)
    out = []
    for z in zs:
        f_diag, q_diag = [], []
        for i in range(3):
            if steady[i] is None:
                f_diag.append(1.0)
                q_diag.append(params.q_diag[i] * dt)
            else:
                a = math.exp(-dt / params.lag_s[i])
                f_diag.append(a)
                q_diag.append(params.q_diag[i] * params.lag_s[i] * (1 - a * a) / 2)
        f = np.diag(f_diag)
        u = np.array([0.0 if s is None else (1 - f_diag[i]) * s for i, s in enumerate(steady)])
        x = f @ x + u
        p = f @ p @ f.T + np.diag(q_diag)
        k = p @ np.linalg.inv(p + r)
        x = x + k @ (np.asarray(z) - x)
        p = (np.eye(3) - k) @ p
        out.append((x.copy(), p.copy()))
    return out


@pytest.mark.parametrize(
    "steady",
    [
        (None, None, None),  # random walk: the filter is a smoother of a constant
        (0.65, 4.0, 0.03),  # lag toward the true level on every component
        (0.65, None, 0.03),  # mixed: queue as a random walk
    ],
)
def test_filter_matches_reference_and_converges_under_noise(steady) -> None:
    # small process noise: the truth is constant, so the filter should average
    params = KalmanParams(q_diag=(1e-8, 1e-6, 1e-10))
    rng = np.random.default_rng(7)
    zs = TRUTH + rng.normal(size=(400, 3)) * np.sqrt(params.r_diag)
    x0, p0 = (0.2, 0.0, 0.2), np.diag([1.0, 100.0, 1.0])
    state = KalmanState.initial(x0, var=np.diag(p0))
    ref = reference_kf(params, x0, p0, zs, 10.0, steady)
    worst = 0.0
    for z, (x_ref, p_ref) in zip(zs, ref, strict=True):
        state = update(params, state, tuple(z), 10.0, steady=steady)
        worst = max(worst, float(np.max(np.abs(np.array(state.x) - x_ref) / np.abs(x_ref))))
        assert np.allclose(state.p, p_ref, rtol=1e-6, atol=1e-15)
    assert worst < 1e-9  # Joseph form vs textbook form: rounding only (measured 6e-14)
    sd = np.sqrt(np.diag(state.p))
    err = np.abs(np.array(state.x) - TRUTH)
    assert np.all(err < 4 * sd)  # consistent with its own covariance
    # much tighter than one raw measurement
    assert np.all(err < 0.2 * np.sqrt(params.r_diag))


def test_missing_signal_is_skipped() -> None:
    params = KalmanParams()
    s0 = KalmanState.initial((0.5, 2.0, 0.02))
    s1 = update(params, s0, (0.6, None, 0.03), 10.0)
    assert s1.x[1] == 2.0  # random walk, not observed: unchanged
    assert s1.p[1][1] == pytest.approx(100.0 + params.q_diag[1] * 10.0)  # variance grows
    assert s1.x[0] != 0.5 and s1.p[0][0] < 1.0
    s2 = update(params, s0, (None, None, None), 10.0)  # no data: prediction only
    assert s2.x == s0.x and s2.p[0][0] > s0.p[0][0]


@pytest.mark.parametrize("steady", [None, (0.6, 3.2, None)], ids=["random-walk", "steady-state"])
def test_a_step_beyond_the_noises_is_tracked_in_the_window_it_is_measured(steady) -> None:
    # Heavy violations and a queue for 6 windows, then both gone (the fleet caught up): the estimate a delay
    # compensation starts from must be the measurement's, not trail it for windows (docs/model.md §9).
    params = KalmanParams()
    state = KalmanState.initial((0.95, 30.0, 0.8))
    for _ in range(6):
        state = update(params, state, (0.95, 30.0, 0.8), 10.0, steady=steady)
    state = update(params, state, (0.5, 0.0, 0.0), 10.0, steady=steady)
    assert abs(state.x[1]) < 0.05 and abs(state.x[2]) < 1e-3, state.x  # within r / |innovation|
    assert predict_ahead(params, state, 0.02, steady=steady)[2] < 1e-3  # §3.1's 20 ms delay
    # A plain filter (no covariance matching) trails it: the bug of bench design-source §3.1.
    plain = KalmanParams(innovation_gate=math.inf)
    lagging = KalmanState.initial((0.95, 30.0, 0.8))
    for _ in range(6):
        lagging = update(plain, lagging, (0.95, 30.0, 0.8), 10.0, steady=steady)
    lagging = update(plain, lagging, (0.5, 0.0, 0.0), 10.0, steady=steady)
    assert lagging.x[2] > 0.5 and lagging.x[1] > 10.0, lagging.x
    # Within the noises the filter still smooths: a 1-sigma step moves the estimate part of the way.
    small = update(params, state, (0.5, 0.0, 0.01), 10.0, steady=steady)
    assert 0.0 < small.x[2] < 0.009, small.x


def test_what_the_model_cannot_predict_is_predicted_as_measured() -> None:
    # A random walk predicts no change: its prediction is its current value, which the window measured and a
    # filter with no model for it only trails (docs/model.md §9). A component with a steady state is
    # predicted from the filter's estimate, toward it.
    params = KalmanParams(innovation_gate=math.inf)  # a trailing estimate, to tell the two apart
    state = KalmanState.initial((0.9, 20.0, 0.5))
    state = update(params, state, (0.9, 20.0, 0.5), 10.0)
    z = (0.88, 19.0, 0.45)  # within the noises: the filter moves only part of the way
    state = update(params, state, z, 10.0)
    assert state.x[2] > 0.46 and state.x[1] > 19.0
    u, q, eps = predict_ahead(params, state, 30.0, steady=(0.5, 0.5, None), measured=z)
    assert eps == 0.45  # as measured
    assert q == pytest.approx(predict_ahead(params, state, 30.0, steady=(0.5, 0.5, None))[1])  # the model's
    assert predict_ahead(params, state, 30.0, measured=(None, None, None)) == state.x  # nothing measured


def test_prediction_with_zero_delay_is_the_estimate() -> None:
    params = KalmanParams()
    state = update(params, KalmanState.initial((0.3, 1.0, 0.01)), (0.5, 2.0, 0.04), 5.0)
    assert predict_ahead(params, state, 0.0, steady=(0.9, 9.0, 0.5)) == state.x


@pytest.mark.parametrize(
    ("lag_s", "tau_s", "x0", "s"),
    [
        (
            (30.0, 30.0, 60.0),
            0.02,
            (0.2, 1.0, 0.0),
            (0.9, 5.0, 0.1),
        ),  # 20 ms: the design source's short delay (docs/model.md §9 (observer))
        ((30.0, 30.0, 60.0), 45.0, (0.2, 1.0, 0.0), (0.9, 5.0, 0.1)),  # replica start-up delay
        ((1.0, 2.0, 5.0), 10.0, (1.0, 8.0, 0.5), (0.1, 0.0, 0.01)),  # many time constants, decay
    ],
)
def test_rk4_matches_closed_form(lag_s, tau_s, x0, s) -> None:
    params = KalmanParams(lag_s=lag_s)
    state = KalmanState.initial(x0)
    got = np.array(predict_ahead(params, state, tau_s, steady=s))
    exact = np.array(s) + (np.array(x0) - np.array(s)) * np.exp(-tau_s / np.array(lag_s))
    # default step lag/20: measured <= 1.8e-8 relative (local error ~ (h/lag)^5 / 120)
    assert np.allclose(got, exact, rtol=5e-8, atol=1e-12)


def test_rk4_is_fourth_order() -> None:
    params = KalmanParams(lag_s=(10.0, 10.0, 10.0))
    state, s = KalmanState.initial((0.0, 0.0, 0.0)), (1.0, 1.0, 1.0)
    exact = 1.0 - math.exp(-3.0)
    e1 = abs(predict_ahead(params, state, 30.0, s, max_step_s=2.0)[0] - exact)
    e2 = abs(predict_ahead(params, state, 30.0, s, max_step_s=1.0)[0] - exact)
    assert 12.0 < e1 / e2 < 20.0  # halving h divides the error by ~16


def test_random_walk_components_do_not_move_ahead() -> None:
    params = KalmanParams()
    state = KalmanState.initial((0.4, 3.0, 0.05))
    assert predict_ahead(params, state, 120.0) == state.x


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 50.0), st.floats(0.0, 1.0)),
        min_size=1,
        max_size=30,
    ),
    st.floats(0.1, 120.0),
)
def test_covariance_stays_symmetric_positive_definite(zs, dt) -> None:
    params, state = KalmanParams(), KalmanState.initial((0.5, 1.0, 0.0))
    for z in zs:
        state = update(params, state, z, dt, steady=(0.5, None, 0.02))
        p = np.array(state.p)
        assert np.array_equal(p, p.T) and np.all(np.linalg.eigvalsh(p) > 0.0)


def test_state_round_trips_json_and_pickle() -> None:
    state = update(KalmanParams(), KalmanState.initial((0.5, 1.0, 0.0)), (0.6, 2.0, 0.1), 10.0)
    assert KalmanState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    assert pickle.loads(pickle.dumps(state)) == state
    d = LoopDelay().observe(1.0, 1.1, 30.0, basis_at_s=0.5)
    assert pickle.loads(pickle.dumps(d)) == d


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: KalmanParams(q_diag=(1e-4, -1.0, 1e-5)), "q_diag"),  # negative noise
        (lambda: KalmanParams(lag_s=(30.0, 30.0)), "lag_s"),  # two values, not three
        (lambda: KalmanParams(r_diag=(1e-3, float("inf"), 1e-4)), "r_diag"),  # not finite
        (lambda: KalmanParams(innovation_gate=0.5), "innovation_gate"),  # below one standard deviation
        (lambda: KalmanParams(innovation_gate=float("nan")), "innovation_gate"),
        (lambda: KalmanState(x=(0, 0, 0), p=((1, 2, 0), (0, 1, 0), (0, 0, 1))), "symmetric"),
        (lambda: KalmanState.initial((0, 0, 0), var=(1, 0, 1)), "var"),  # zero variance
        (lambda: update(KalmanParams(), KalmanState.initial((0, 0, 0)), (1, 2), 1.0), "z="),
        (lambda: update(KalmanParams(), KalmanState.initial((0, 0, 0)), (1, 2, 3), -1.0), "dt_s"),
        (lambda: predict_ahead(KalmanParams(), KalmanState.initial((0, 0, 0)), -0.1), "tau_s"),
        (lambda: predict_ahead(KalmanParams(), KalmanState.initial((0, 0, 0)), 1.0, measured=(1, 2)), "measured"),
        (
            lambda: predict_ahead(KalmanParams(), KalmanState.initial((0, 0, 0)), 1.0, measured=(0, 0, math.nan)),
            "measured",
        ),
        (lambda: LoopDelay(weight=0.0), "weight"),  # EWMA weight in (0, 1]
        (lambda: LoopDelay().observe(10.0, 9.0, 12.0), "applied_at_s"),  # applied before issued
        (lambda: LoopDelay().observe(10.0, 11.0, 12.0, basis_at_s=10.5), "issued_at_s"),
        (lambda: load_steady_state(10.0, 0.0), "capacity_rps"),  # no capacity
    ],
)
def test_validation(build, needle: str) -> None:
    with pytest.raises(ParameterError, match=needle):
        build()


@pytest.mark.parametrize(
    ("load", "cap", "expected"),
    [
        (0.0, 10.0, (0.0, 0.0, None)),  # idle
        (50.0, 100.0, (0.5, 0.5, None)),  # rho = 0.5: M/M/1 queue 0.5
        (90.0, 100.0, (0.9, 8.1, None)),  # rho = 0.9: 0.81 / 0.1
        (150.0, 100.0, (1.0, 1e3, None)),  # overload: no steady state, capped queue
    ],
)
def test_load_steady_state(load, cap, expected) -> None:
    got = load_steady_state(load, cap)
    assert got is not None and got[2] is None
    assert got[0] == pytest.approx(expected[0]) and got[1] == pytest.approx(expected[1])


def test_loop_delay_converges_and_matches_ewma_reference() -> None:
    rng = np.random.default_rng(3)
    net = rng.gamma(4.0, 0.005, size=500)  # mean 20 ms
    act = 40.0 + rng.normal(0.0, 2.0, size=500)  # replica start-up ~40 s
    ctrl = rng.uniform(0.05, 0.15, size=500)  # mean 100 ms
    d, ref = LoopDelay(weight=0.05), None
    for i in range(500):
        basis = 100.0 * i
        issued = basis + ctrl[i]
        d = d.observe(issued, issued + net[i], issued + net[i] + act[i], basis_at_s=basis)
        tau = ctrl[i] + net[i] + act[i]
        ref = tau if ref is None else ref + 0.05 * (tau - ref)
    assert d.tau_s == pytest.approx(ref, rel=1e-9)  # EWMA of the sum = sum of the EWMAs
    assert d.tau_net_s == pytest.approx(0.02, rel=0.35)
    assert d.tau_ctrl_s == pytest.approx(0.10, rel=0.2)
    assert d.tau_s == pytest.approx(40.12, rel=0.05)
    assert d.n == d.n_ctrl == 500


def test_loop_delay_without_basis_leaves_ctrl_at_zero() -> None:
    d = LoopDelay().observe(5.0, 5.5, 9.0)
    assert (d.tau_ctrl_s, d.tau_net_s, d.tau_act_s, d.tau_s) == (0.0, 0.5, 3.5, 4.0)
