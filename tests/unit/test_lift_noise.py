"""The feedforward lift needs evidence beyond one window's counting noise (loop.scaler_driver).

A Mooncake-like zone (1.75 req/s, 0.2 req/s a replica) sees its measured rate scatter by
one sd (0.42 req/s) from window to window.  The level rises at once on a lift and falls a
tenth of the gap a window, so lifting on every window that reads one sd high rides the
noise's upper envelope; a 3x surge is 8 sd and must still lift in its first window.
"""

from __future__ import annotations

import pytest

from controllers.errors import ParameterError
from core.settings import ModelSpec, Settings
from core.vocab import DEFAULT_PID_GAINS
from loop.scaler_driver import Scaler
from tests.unit.test_scaler_driver import MODEL, _window

MEAN, SD = 1.75, (1.75 / 10.0) ** 0.5
NOISY = [MEAN + d * SD for d in (0, 1, -1, 1.2, 0, -1, 1, 0, -1.2, 1)] * 4  # a stationary rate, +-1 sd


def _scaler(lift_z: float | None = None) -> Scaler:
    """The shipped controller; ``lift_z`` as an operator sets it: the gain ``ff_lift_z`` of GOVERNOR_PID_GAINS."""
    spec = ModelSpec(MODEL, ttft_slo_ms=6000.0, itl_slo_ms=150.0, min_replicas=1, max_replicas=200,
                     replica_capacity_rps=0.2, replica_headroom=1.0)  # fmt: skip
    gains = dict(DEFAULT_PID_GAINS) if lift_z is None else {**DEFAULT_PID_GAINS, "ff_lift_z": lift_z}
    s = Scaler(Settings(models=(spec,), window_s=10.0, zones=("az-a",), learn_capacity=False, pid_gains=gains))
    ffp = s.laws[MODEL].feedforward
    assert ffp is not None and ffp.lift_z == (2.0 if lift_z is None else lift_z)
    return s


def test_a_negative_lift_z_gain_is_refused_by_name() -> None:
    with pytest.raises(ParameterError, match="lift_z"):
        _scaler(lift_z=-1.0)


def _levels(s: Scaler, rates: list[float]) -> list[int]:
    ready, out = 9, []
    for k, rate in enumerate(rates):
        for cmd in s.on_window(_window(k, rate=rate, ready=ready), (k + 1) * 10_000):
            ready = cmd.target_replicas  # the fleet follows at once
        out.append(ready)
    return out


def test_a_stationary_noisy_rate_does_not_ratchet_the_fleet_up() -> None:
    gated, tolerance_only = _levels(_scaler(), NOISY), _levels(_scaler(lift_z=0.0), NOISY)
    # Before the forecaster is warm (and its error margin counts) the requirement is the rate:
    # the tolerance alone lifts on the first window one sd high and holds it; the gate does not.
    assert max(tolerance_only[:15]) >= 11 and max(gated[:15]) <= 9, (gated, tolerance_only)
    assert sum(gated) < sum(tolerance_only)  # replica-windows over the whole stationary run


def test_a_surge_lifts_in_its_first_window() -> None:
    s = _scaler()
    before = _levels(s, NOISY[:20])[-1]
    ready = before
    (cmd,) = s.on_window(_window(20, rate=3 * MEAN, ready=ready), 21 * 10_000)
    # The fleet here turns ready within the window it is ordered in: the measured start-up (half a window)
    # shortens the margin's horizon, so the surge's requirement (26.25) rounds to 26.
    assert cmd.target_replicas >= round(3 * MEAN / 0.2), (before, cmd.target_replicas)
