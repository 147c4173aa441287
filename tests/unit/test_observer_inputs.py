"""The Kalman observer's known inputs in the scaling law (issue 36 item 7): the replica capacity
learned online once learned (the profile until then), and the load forecast over the loop delay
as the input its prediction relaxes to (design source §5: the forecast is injected into the observer)."""

from __future__ import annotations

import copy
import math

import pytest

from controllers import capacity_learn as cap
from controllers import observer as obs
from controllers import scaling_law as law
from controllers import zone_capacity as zc
from core.settings import ModelSpec, Settings
from tests.unit.test_scaler_driver import _window

SPEC = ModelSpec("m", ttft_slo_ms=1000.0, itl_slo_ms=150.0, min_replicas=1, max_replicas=100, replica_capacity_rps=3.0)
P = law.params_for(Settings(models=(SPEC,), window_s=10.0, zones=("az-a",), observer=True), "m")
WINDOW = _window(5, rate=10.0, queue=0.5, ready=4)  # 10 req/s on 4 ready replicas of 3 req/s (profile)
TAU_S = 60.0  # the start-up hint: no command measured yet


def _eps(s: law.ScalingState) -> float:
    """The violation rate the feedback steps on (the observer's prediction over the loop delay)."""
    return law.decide(P, s, zc.ZoneCapacityState(), WINDOW)[2].violation_rate


def _learned(rps: float) -> law.ScalingState:
    s = P.new_state()
    s.capacity = cap.CapacityState(log_k=math.log(rps / 3.0))
    return s


def _forecasting(values: list[float]) -> law.ScalingState:
    s = P.new_state()
    assert s.forecaster is not None
    for v in values:
        s.forecaster.learn(v)
    assert s.forecaster.ready
    return s


def test_the_observer_predicts_with_the_learned_capacity() -> None:
    """Learned 2.7 req/s a replica (the profile's 3 is optimistic): the same window predicts a longer
    queue, so a higher violation rate, than with the profile."""
    assert _eps(_learned(2.7)) > _eps(P.new_state()) + 0.1
    assert _eps(_learned(3.0)) == _eps(P.new_state())  # nothing learned yet: the profile


def test_the_observer_inputs_size_the_fleet_by_the_learned_capacity() -> None:
    steady, ahead = law.observer_inputs(P, _learned(2.7), 10.0, 4, TAU_S, 10.0)
    assert steady == ahead == pytest.approx(obs.load_steady_state(10.0, 2.7 * 4))
    profile, _ = law.observer_inputs(P, P.new_state(), 10.0, 4, TAU_S, 10.0)
    assert profile == pytest.approx(obs.load_steady_state(10.0, 3.0 * 4))
    prior = law.params_for(Settings(models=(SPEC,), window_s=10.0, observer=True, learn_capacity=False), "m")
    assert law.observer_inputs(prior, _learned(2.7), 10.0, 4, TAU_S, 10.0)[0] == profile  # learning off: the profile
    assert law.observer_inputs(P, P.new_state(), 10.0, 0, TAU_S, 10.0) == (None, None)  # no ready replica


def test_the_forecast_moves_the_observers_prediction() -> None:
    """Two states alike but for their forecaster: arrivals rising to 10 req/s, or flat at 10.  The
    rising one forecasts more over the loop delay, and the prediction -- what the feedback steps on --
    shows the queue that load builds before it is measured."""
    warm = P.new_state().forecaster
    assert warm is not None
    n = warm.warmup_steps + 4
    rising = _forecasting([10.0 * (0.8 + 0.2 * k / (n - 1)) for k in range(n)])
    flat = _forecasting([10.0] * n)
    steady_r, ahead_r = law.observer_inputs(P, rising, 10.0, 4, TAU_S, 10.0)
    steady_f, ahead_f = law.observer_inputs(P, flat, 10.0, 4, TAU_S, 10.0)
    assert steady_r == steady_f  # the update relaxes to the load measured now either way
    assert ahead_f == pytest.approx(steady_f)
    assert ahead_r is not None and ahead_f is not None
    q_r, q_f = ahead_r[1], ahead_f[1]
    assert q_r is not None and q_f is not None and q_r > q_f  # a longer queue ahead
    assert _eps(rising) > P.eps_ref >= _eps(flat)  # the forecast turns a hold into a scale-up
    # bounded as the feedforward bounds its forecast: at most max_ahead x the demand seen now
    assert P.feedforward is not None
    capped = obs.load_steady_state(P.feedforward.max_ahead * 10.0, 3.0 * 4)
    steep = _forecasting([1.0 + 3.0 * k for k in range(n)])
    assert law.observer_inputs(P, steep, 10.0, 4, TAU_S, 10.0)[1] == pytest.approx(capped)


def test_a_cold_forecaster_leaves_the_prediction_on_the_measured_load() -> None:
    s = P.new_state()
    assert s.forecaster is not None and not s.forecaster.ready
    steady, ahead = law.observer_inputs(P, copy.deepcopy(s), 10.0, 4, TAU_S, 10.0)
    assert ahead == steady
