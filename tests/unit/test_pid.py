"""Scaling PID: sign, clamps, slew, anti-windup, step response, validation."""

from __future__ import annotations

import json
import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controllers.errors import ParameterError
from controllers.pid import PidMeasurement, PidParams, PidState, step

DT = 30.0


def run(params: PidParams, eps_seq: list[float], replicas: int = 10, state: PidState | None = None):
    """Drive the controller with a violation-rate sequence; actuator follows target."""
    st_ = state or PidState()
    outs = []
    for eps in eps_seq:
        st_, out = step(params, st_, PidMeasurement(eps, replicas_current=replicas), DT)
        replicas = out.target_replicas
        outs.append(out)
    return st_, outs


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


@pytest.mark.parametrize(
    ("eps", "reason", "error_sign", "level_sign", "target"),
    [
        # violations above the reference grow the fleet at once (Correction)
        (0.30, "scale_up", +1, +1, 12),
        (1.00, "scale_up", +1, +1, 13),  # saturating error: slew-limited to a = 1.3
        # exactly at the reference, and inside the deadband (|e| <= 0.015): nothing moves
        (0.02, "hold", 0, 0, 10),
        (0.03, "hold", 0, 0, 10),
        # below the reference: the continuous level falls on the first step, but the
        # integer target only follows once the level has moved half a replica
        # (test_scale_down_follows_the_falling_level), so the first step still holds
        (0.00, "hold", -1, -1, 10),
        (0.004, "hold", -1, -1, 10),  # just outside the deadband on the low side
    ],
)
def test_sign_convention_first_step(eps: float, reason: str, error_sign: int, level_sign: int, target: int) -> None:
    params = PidParams(kp=0.5, ki=0.02, deadband=0.015, max_replicas=100)
    st, out = step(params, PidState(), PidMeasurement(eps, replicas_current=10), DT)
    assert out.reason == reason
    assert _sign(out.error) == error_sign
    assert st.level is not None and _sign(st.level - 10) == level_sign
    assert _sign(out.multiplier - 1.0) == level_sign  # level = base * multiplier
    assert out.target_replicas == target


def test_scale_down_follows_the_falling_level() -> None:
    """No violations: within a few periods the integer target steps below the
    current count with reason scale_down, and it never moves up meanwhile."""
    params = PidParams(kp=0.5, ki=0.02, deadband=0.015, max_replicas=100)
    _, outs = run(params, [0.0] * 5)
    targets = [o.target_replicas for o in outs]
    assert targets == sorted(targets, reverse=True) and targets[-1] < 10, targets
    downs = [o for o in outs if o.reason == "scale_down"]
    assert downs, [o.reason for o in outs]
    first = downs[0]
    assert first.multiplier < 1.0 and first.error < 0 and first.target_replicas < 10
    assert all(o.reason == "hold" and o.target_replicas == 10 for o in outs[: outs.index(first)])


def test_first_step_has_no_proportional_or_derivative_kick() -> None:
    params = PidParams(kp=5.0, ki=0.0, kd=5.0, deadband=0.0)
    _, out = step(params, PidState(), PidMeasurement(0.5, replicas_current=10), DT)
    assert out.p_term == 0.0 and out.d_term == 0.0 and out.multiplier == 1.0


def test_clamp_and_slew_ramp_to_a_max() -> None:
    """Huge error: exp(delta) >> 3, so a is clamped to 3.0 but slewed 1.0 -> 1.3 -> ... 3.0."""
    params = PidParams(ki=0.1, max_replicas=10**9)
    _, outs = run(params, [1.0] * 10, replicas=1)
    mults = [o.multiplier for o in outs]
    assert mults[0] == pytest.approx(1.3) and outs[0].slew_limited and outs[0].saturated
    assert mults[:7] == pytest.approx([1.3, 1.6, 1.9, 2.2, 2.5, 2.8, 3.0])
    assert all(m == 3.0 for m in mults[6:])
    assert not outs[-1].slew_limited and outs[-1].saturated


errors = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(
    eps_seq=errors,
    kp=st.floats(0.0, 5.0),
    ki=st.floats(0.0, 0.5),
    kd=st.floats(0.0, 50.0),
    pending=st.lists(st.integers(0, 2), min_size=60, max_size=60),
    start=st.integers(0, 300),
)
def test_limits_never_exceeded(eps_seq, kp, ki, kd, pending, start) -> None:
    params = PidParams(kp=kp, ki=ki, kd=kd, min_replicas=2, max_replicas=200)
    state, replicas, a_prev = PidState(), start, 1.0
    for eps, pend in zip(eps_seq, pending, strict=False):
        state, out = step(params, state, PidMeasurement(eps, replicas, pend), DT)
        assert 0.5 <= out.multiplier <= 3.0
        assert abs(out.multiplier - a_prev) <= 0.3 + 1e-12
        assert 2 <= out.target_replicas <= 200
        if out.held_pending:
            assert out.target_replicas <= max(replicas, 2)  # base == replicas here
        a_prev, replicas = out.multiplier, out.target_replicas


def naive_positional_log_target(eps_seq: list[float], params: PidParams, r0: int) -> float:
    """Reference: positional PID on log(replicas) with an unclamped integral.

    log R_k = log r0 + kp e_k + ki sum(e dt) + kd de/dt; only the *output* is
    clamped.  Returns the unclamped desired replica count of the last step.
    """
    integral, e_prev, u = 0.0, None, 0.0
    for eps in eps_seq:
        e = eps - params.eps_ref
        integral += e * DT
        d = 0.0 if e_prev is None else (e - e_prev) / DT
        u = params.kp * e + params.ki * integral + params.kd * d
        e_prev = e
    return r0 * math.exp(u)


def test_anti_windup_scale_down_immediately_after_long_saturation() -> None:
    """After 50 steps pinned at max_replicas with eps = 1.0, a single eps = 0
    step must already scale down (multiplier < 1, target < max).

    Contrast: a naive positional PID integrates e = 0.98 for 50 periods; its
    integral ~ 1470 s keeps the desired count astronomically above
    max_replicas, so one good period changes nothing and it keeps asking to
    scale up (the classic wind-up).  Here the integrator is the clamped
    replica count and the slew state is back-calculated at the bound.
    """
    params = PidParams(kp=0.5, ki=0.1, max_replicas=40)
    state, outs = run(params, [1.0] * 50, replicas=10)
    assert outs[-1].target_replicas == 40 and outs[-1].at_bound
    state, out = step(params, state, PidMeasurement(0.0, replicas_current=40), DT)
    assert out.multiplier < 1.0 and out.target_replicas < 40 and out.reason == "scale_down"

    naive = naive_positional_log_target([1.0] * 50 + [0.0], params, r0=10)
    assert naive > 1e6 * params.max_replicas  # still (far) asking to scale up


def test_pending_replicas_hold_scale_up_but_not_scale_down() -> None:
    params = PidParams(ki=0.05)
    _, out = step(params, PidState(), PidMeasurement(0.5, 10, replicas_pending=3), DT)
    assert out.held_pending and out.target_replicas == 10 and out.reason == "hold"
    assert out.multiplier == 1.0
    st, out = step(params, PidState(), PidMeasurement(0.0, 10, replicas_pending=3), DT)
    assert not out.held_pending and out.multiplier < 1.0 and st.level is not None and st.level < 10
    no_hold = PidParams(ki=0.05, hold_while_pending=False)
    _, out = step(no_hold, PidState(), PidMeasurement(0.5, 10, replicas_pending=3), DT)
    assert out.target_replicas > 10 and not out.held_pending


def test_base_is_last_target_not_current() -> None:
    """The actuator lags: base is the last commanded target once there is one."""
    params = PidParams()
    state = PidState(last_target=20)
    _, out = step(params, state, PidMeasurement(0.02, replicas_current=5), DT)
    assert out.target_replicas == 20


def test_scale_up_from_zero_replicas() -> None:
    params = PidParams(min_replicas=0)
    _, out = step(params, PidState(), PidMeasurement(0.9, replicas_current=0), DT)
    assert out.target_replicas == 1


def plant_violation_rate(load_rps: float, replicas: int, capacity_rps: float = 10.0) -> float:
    """Tiny plant: violation rate is a logistic of utilisation (monotone).

    ~0 below 65 % utilisation, 50 % at 80 %, ~1 past 95 %.
    """
    util = load_rps / (max(replicas, 1) * capacity_rps)
    return 1.0 / (1.0 + math.exp(-(util - 0.8) / 0.04))


@pytest.mark.parametrize("load_step", [2.0, 3.0, 5.0])
def test_step_response_converges_without_sustained_oscillation(load_step: float) -> None:
    params = PidParams(max_replicas=500)  # defaults: integral-only, deadband 0.015
    replicas, state, history = 10, PidState(), []
    for k in range(80):
        load = 60.0 if k < 5 else 60.0 * load_step
        eps = plant_violation_rate(load, replicas)
        history.append((replicas, eps))
        state, out = step(params, state, PidMeasurement(eps, replicas), DT)
        replicas = out.target_replicas
    counts = [r for r, _ in history]
    moves = [b - a for a, b in zip(counts, counts[1:], strict=False) if b != a]
    reversals = sum(1 for a, b in zip(moves, moves[1:], strict=False) if (a > 0) != (b > 0))
    assert reversals <= 2, counts
    # settled: the last 20 periods hold one count with eps at or below ref + deadband
    tail = history[-20:]
    assert len({r for r, _ in tail}) == 1, counts
    assert tail[-1][1] <= params.eps_ref + params.deadband
    # and not grossly over-provisioned: one replica fewer would violate the band
    assert plant_violation_rate(60.0 * load_step, tail[-1][0] - 1) > params.eps_ref - params.deadband


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"kp": -1.0}, "kp"),
        ({"ki": float("nan")}, "ki"),
        ({"kd": -0.1}, "kd"),
        ({"eps_ref": 0.0}, "eps_ref"),
        ({"eps_ref": 1.0}, "eps_ref"),
        ({"a_min": 0.0}, "a_min"),
        ({"a_min": 1.2}, "a_min"),
        ({"a_max": 0.9}, "a_max"),
        ({"slew": 0.0}, "slew"),
        ({"min_replicas": -1}, "min_replicas"),
        ({"min_replicas": 5, "max_replicas": 4}, "min_replicas"),
        ({"max_replicas": 2.5}, "max_replicas"),
        ({"hold_while_pending": 1}, "hold_while_pending"),
        ({"deadband": -0.01}, "deadband"),
    ],
)
def test_params_validation_names_parameter(kwargs, name) -> None:
    with pytest.raises(ParameterError, match=name):
        PidParams(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"violation_rate": -0.1, "replicas_current": 1}, "violation_rate"),
        ({"violation_rate": 1.1, "replicas_current": 1}, "violation_rate"),
        ({"violation_rate": float("nan"), "replicas_current": 1}, "violation_rate"),
        ({"violation_rate": 0.1, "replicas_current": -1}, "replicas_current"),
        (
            {"violation_rate": 0.1, "replicas_current": 1, "replicas_pending": -2},
            "replicas_pending",
        ),
    ],
)
def test_measurement_validation_names_parameter(kwargs, name) -> None:
    with pytest.raises(ValueError, match=name):
        PidMeasurement(**kwargs)


@pytest.mark.parametrize("dt_s", [0.0, -1.0, float("inf")])
def test_dt_must_be_positive(dt_s: float) -> None:
    with pytest.raises(ParameterError, match="dt_s"):
        step(PidParams(), PidState(), PidMeasurement(0.1, 1), dt_s)


def test_state_round_trips_and_step_is_pure() -> None:
    params = PidParams(kp=0.3)
    state, _ = run(params, [0.5, 0.1, 0.0])
    assert PidState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
    assert pickle.loads(pickle.dumps(state)) == state
    meas = PidMeasurement(0.4, 12)
    assert step(params, state, meas, DT) == step(params, state, meas, DT)
    _, out = step(params, state, meas, DT)
    json.dumps(out.to_dict(), allow_nan=False)
