"""Fractional PID: GL operator against closed forms, pid.py equivalence at
alpha = 1, bounded memory, adaptive order, sign, clamps, slew, validation."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controllers import pid
from controllers.errors import ParameterError
from controllers.fpid import FpidParams, FpidState, gl_differintegral, gl_weights, step
from controllers.pid import PidMeasurement, PidParams, PidState

DT = 30.0
T_END = 1.0


def run(params: FpidParams, eps_seq: list[float], replicas: int = 10, state: FpidState | None = None):
    """Drive the controller; the actuator follows the target at once."""
    st_ = state or FpidState()
    outs = []
    for eps in eps_seq:
        st_, out = step(params, st_, PidMeasurement(eps, replicas_current=replicas), DT)
        replicas = out.target_replicas
        outs.append(out)
    return st_, outs


# (order, f, exact value at T_END, error bound as a multiple of h); measured
# constants: 0.141, 0.423, 1.000, 0.846, 1.000 (first order, O(h))
CLOSED_FORMS = [
    (0.5, lambda t: t, 2.0 * math.sqrt(T_END / math.pi), 0.15),  # half-derivative of t
    (-0.5, lambda t: np.ones_like(t), 2.0 * math.sqrt(T_END / math.pi), 0.43),  # half-integral of 1
    (1.0, lambda t: t**2, 2.0 * T_END, 1.0 + 1e-6),  # D^1 t^2 = 2t; GL error exactly h
    # D^1.5 t^2 = 2 t^0.5 / Gamma(1.5)
    (1.5, lambda t: t**2, 4.0 * math.sqrt(T_END / math.pi), 0.85),
    (-1.0, lambda t: np.ones_like(t), T_END, 1.0 + 1e-6),  # I^1 of 1 = t; GL gives t + h
]


@pytest.mark.parametrize(("order", "f", "exact", "c_h"), CLOSED_FORMS)
def test_gl_matches_closed_forms_with_error_shrinking_in_h(order, f, exact, c_h) -> None:
    errs = []
    for n in (100, 1_000, 10_000):
        h = T_END / n
        t = np.linspace(0.0, T_END, n + 1)
        errs.append(abs(gl_differintegral(order, f(t), h) - exact))
        assert errs[-1] <= c_h * h, (n, errs[-1])
    assert errs[0] > errs[1] > errs[2]  # first-order convergence: ~10x per decade
    assert errs[0] / errs[2] > 50


def test_order_zero_is_the_identity() -> None:
    # w^(0) = (1, 0, 0, ...): the value at the last sample, exactly, for any h
    rng = np.random.default_rng(1)
    v = rng.normal(size=50)
    assert gl_differintegral(0.0, v, 0.37) == v[-1]


@pytest.mark.parametrize(
    ("order", "n"),
    [(0.5, 200), (-0.5, 200), (1.3, 500), (-1.7, 64)],  # derivative, integral, both ranges
)
def test_gl_matches_differint(order: float, n: int) -> None:
    differint = pytest.importorskip("differint.differint")
    t = np.linspace(0.0, 2.0, n)
    f = np.sqrt(t) + np.sin(3.0 * t)
    # differint.GL convolves circularly; its last element is the GL value at t = 2
    ref = differint.GL(order, f, 0.0, 2.0, n)[-1]
    ours = gl_differintegral(order, f, 2.0 / (n - 1))
    assert ours == pytest.approx(ref, rel=1e-9, abs=1e-9)


def test_gl_weight_recursion() -> None:
    # w_j = w_{j-1} (1 - (order + 1) / j) equals (-1)^j binom(order, j)
    order = 0.7
    w = gl_weights(order, 6)
    binom = [math.gamma(order + 1) / (math.gamma(j + 1) * math.gamma(order - j + 1)) for j in range(6)]
    assert w.tolist() == pytest.approx([(-1) ** j * b for j, b in enumerate(binom)], rel=1e-12)


def test_memory_truncation_ignores_older_samples() -> None:
    rng = np.random.default_rng(2)
    v = rng.normal(size=100)
    w = v.copy()
    w[:40] = 1e6  # older than the last 60 samples
    assert gl_differintegral(0.6, v, 0.1, memory=60) == gl_differintegral(0.6, w, 0.1, memory=60)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=120), st.integers(3, 40))
def test_state_memory_is_bounded(eps_seq: list[float], memory: int) -> None:
    st_, _ = run(FpidParams(memory=memory), eps_seq)
    assert len(st_.errors) == min(len(eps_seq), memory)
    assert st_.steps == len(eps_seq)


gains = st.tuples(st.floats(0.01, 2.0), st.floats(0.0, 0.49), st.floats(0.0, 5.0))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40),
    gains,
    st.integers(0, 3),
    st.booleans(),
)
def test_alpha_one_is_pid_py(eps_seq, g, pending, hold) -> None:
    """At alpha = 1 with no adaptation the law is pid.py's velocity PID, exactly (per-direction gains too)."""
    kp, ratio, kd = g
    common = {"kp": kp, "ki": ratio * kp, "kd": kd, "ki_down": 0.5 * ratio * kp, "hold_while_pending": hold,
              "max_replicas": 500}  # fmt: skip
    fp, pp = FpidParams(alpha=1.0, eta=0.0, memory=8, **common), PidParams(**common)
    fs, ps, replicas = FpidState(), PidState(), 10
    for eps in eps_seq:
        meas = PidMeasurement(eps, replicas_current=replicas, replicas_pending=min(pending, replicas))
        fs, fo = step(fp, fs, meas, DT)
        ps, po = pid.step(pp, ps, meas, DT)
        assert fo.target_replicas == po.target_replicas and fo.reason == po.reason
        assert fo.multiplier == pytest.approx(po.multiplier, rel=1e-12)
        assert fo.delta == pytest.approx(po.delta, rel=1e-9, abs=1e-12)
        assert fs.level == pytest.approx(ps.level, rel=1e-12)
        replicas = fo.target_replicas


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=60),
    st.floats(0.1, 1.9),
    st.floats(0.0, 5.0),
    st.floats(0.0, 5.0),
    st.floats(0.0, 5.0),
)
def test_adaptive_alpha_and_outputs_stay_inside_bounds(eps_seq, alpha, eta, gamma, beta) -> None:
    kp, ki = 1.0, 0.04  # alpha_floor = 0.08 -> 0.1 binds
    params = FpidParams(
        kp=kp,
        ki=ki,
        kd=0.5,
        alpha=alpha,
        eta=eta,
        gamma=gamma,
        beta=beta,
        memory=16,
        max_replicas=1000,
    )
    st_, a_prev = FpidState(), 1.0
    for eps in eps_seq:
        st_, out = step(params, st_, PidMeasurement(eps, replicas_current=20), DT)
        assert st_.alpha is not None and 0.1 <= st_.alpha <= 1.9
        assert ki / kp < 0.5 * st_.alpha
        assert 0.5 - 1e-12 <= out.multiplier <= 3.0 + 1e-12
        assert abs(out.multiplier - a_prev) <= 0.3 + 1e-12
        assert params.min_replicas <= out.target_replicas <= params.max_replicas
        a_prev = out.multiplier


def test_adaptation_clips_alpha_to_keep_ki_over_kp_below_half_alpha() -> None:
    # ki/kp = 0.4 -> alpha must stay > 0.8; a persistent negative error drives alpha down
    params = FpidParams(kp=0.5, ki=0.2, alpha=1.5, eta=0.5, deadband=0.0)
    st_, _ = run(params, [0.0] * 200, replicas=50)
    assert st_.alpha == params.alpha_floor and 0.2 / 0.5 < 0.5 * st_.alpha
    assert st_.alpha == pytest.approx(0.8)


@pytest.mark.parametrize(
    ("eps", "direction"),
    [
        (0.50, +1),  # violations above the reference raise alpha (e > 0)
        (0.00, -1),  # below the reference lower it (deadband 0, so e = -0.02)
        (0.02, 0),  # at the reference nothing moves
    ],
)
def test_adaptation_direction_follows_the_error(eps: float, direction: int) -> None:
    params = FpidParams(alpha=1.0, eta=0.1, deadband=0.0)
    st_, _ = run(params, [eps] * 3)
    assert st_.alpha is not None
    assert np.sign(round(st_.alpha - 1.0, 12)) == direction


@pytest.mark.parametrize(
    ("eps", "direction", "alpha"),
    [
        (0.30, +1, 0.6),  # violations above the reference grow the fleet
        (1.00, +1, 1.7),  # also at a high order
        (0.00, -1, 0.6),  # no violations shrink it (deadband 0 here)
        (0.00, -1, 1.7),  # also at a high order
        (0.02, 0, 0.6),  # at the reference: hold
    ],
)
def test_sign_convention(eps: float, direction: int, alpha: float) -> None:
    params = FpidParams(kp=0.5, ki=0.1, ki_down=None, alpha=alpha, deadband=0.0)  # one gain both ways
    st_, outs = run(params, [eps] * 30)
    assert np.sign(round(outs[0].multiplier - 1.0, 12)) == direction
    assert np.sign(round(outs[0].i_term, 12)) == direction
    assert st_.level is not None and np.sign(round(st_.level - 10.0, 9)) == direction
    if direction:
        assert np.sign(outs[-1].target_replicas - 10) == direction


def test_deadband_holds() -> None:
    # |eps - eps_ref| <= deadband: error zero, no term moves, alpha does not adapt
    params = FpidParams(kp=0.5, ki=0.1, kd=0.3, alpha=1.3, eta=0.5)
    st_, outs = run(params, [0.03, 0.01, 0.034] * 4)
    assert all(o.multiplier == 1.0 and o.target_replicas == 10 and o.error == 0.0 for o in outs)
    assert st_.alpha == 1.3


def test_clamp_and_slew_ramp_to_a_max() -> None:
    """Huge error: exp(delta) >> 3, so a is clamped to 3.0 and slewed 1.0 -> 1.3 -> ... 3.0."""
    params = FpidParams(kp=1.0, ki=0.4, alpha=1.5, max_replicas=10**9)
    _, outs = run(params, [1.0] * 10, replicas=1)
    mults = [o.multiplier for o in outs]
    assert mults[:7] == pytest.approx([1.3, 1.6, 1.9, 2.2, 2.5, 2.8, 3.0])
    assert outs[0].slew_limited and outs[0].saturated and not outs[-1].slew_limited


def test_max_replicas_bound_and_back_calculation() -> None:
    params = FpidParams(kp=0.2, ki=0.05, alpha=1.3, max_replicas=12, time_scale_s=DT)
    st_, outs = run(params, [1.0] * 10)
    assert outs[-1].target_replicas == 12 and outs[-1].at_bound
    _, outs = run(params, [0.0], replicas=12, state=st_)
    assert outs[0].multiplier < 1.0  # scales down at once after a long stay at the bound


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"alpha": 0.05}, "alpha=0.05"),  # below 0.1
        ({"alpha": 2.0}, "alpha=2.0"),  # above 1.9
        ({"kp": 0.1, "ki": 0.05}, "ki=0.05"),  # ki/kp = 0.5 >= 0.5 * alpha(1.0)
        ({"kp": 0.0, "ki": 0.01}, "ki=0.01"),  # integral-only: ratio infinite
        ({"memory": 2}, "memory=2"),  # too short for the second difference
        ({"memory": 8.0}, "memory=8.0"),  # not an int
        ({"eta": -0.1}, "eta=-0.1"),  # negative adaptation rate
        ({"time_scale_s": 0.0}, "time_scale_s=0.0"),  # time unit must be positive
        ({"a_min": 1.5}, "a_min=1.5"),  # shared limiter field, pid.py's message
        ({"kd": float("nan")}, "kd=nan"),  # not finite
    ],
)
def test_parameter_validation(kwargs: dict, needle: str) -> None:
    with pytest.raises(ParameterError, match=needle.replace(".", r"\.")):
        FpidParams(**kwargs)


def test_integral_only_without_integral_is_allowed() -> None:
    # ki = 0 satisfies ki/kp < 0.5 alpha for any kp, including kp = 0 (the down gain as well)
    assert FpidParams(kp=0.0, ki=0.0, kd=1.0, ki_down=0.0).alpha_floor == 0.1


def test_state_round_trips_json_and_pickle() -> None:
    st_, _ = run(FpidParams(eta=0.2, memory=5), [0.3, 0.1, 0.0, 0.5, 0.2, 0.9, 0.0])
    assert FpidState.from_dict(json.loads(json.dumps(st_.to_dict()))) == st_
    assert pickle.loads(pickle.dumps(st_)) == st_
    p = FpidParams(alpha=1.4)
    assert pickle.loads(pickle.dumps(p)) == p


def test_state_validation() -> None:
    with pytest.raises(ParameterError, match="alpha"):
        FpidState(alpha=2.5)
    with pytest.raises(ParameterError, match="a_prev"):
        FpidState(a_prev=0.0)
    with pytest.raises(ParameterError, match="dt_s"):
        step(FpidParams(), FpidState(), PidMeasurement(0.1, replicas_current=3), 0.0)
