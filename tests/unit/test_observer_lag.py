"""The Kalman observer as the scaling law uses it (controllers/scaling_law.py ``_observe``) lags a falling
violation rate instead of predicting it, which is why ``bench design-source``'s §3.1 overshoots more with
the compensation on at a 20-50 ms delay than with it off.

The filter models eps (the violation rate) as a random walk: no steady state is ever supplied for it
(scaling_law.py 555-558: ``steady = (u, q, None)``, and no steady state at all without a profiled
capacity), so :func:`controllers.observer.predict_ahead` leaves it where the filter has it (observer.py
163: the derivative is 0 for a component without a steady state) whatever the loop delay; with its
noises (observer.py 97-98: eps process noise 1e-6 /s, measurement noise 1e-4) the filter's gain is about
0.27 a 10 s window, so its estimate falls by a quarter a window after the measurement fell to 0.  The law
then takes the larger of that estimate and the current leading signal (scaling_law.py 567:
``max(0.0, eps_pred, lead)``): a rise passes at once, a fall reaches the PID windows late, and the loop
keeps scaling up after the fleet is already large enough (§3.1 at 20 ms from 4 replicas of the 8 needed:
up to 24 with it, 14 without; with the fix described below, 14 either way).  The first test pins the
scenario on the plain law; the xfail ones state what a delay compensation owes the loop, for the feedback
loop alone (§3.1's) and with a profiled capacity, and fail until the observer is fixed (its inputs are being
changed on another branch: docs/model.md §9; each reason says the fix)."""

from __future__ import annotations

import pytest

from controllers import scaling_law as law
from controllers import zone_capacity as zc
from controllers.window_record import WindowRecord
from core.settings import ModelSpec, Settings

MODEL, ZONE = "m", "az-a"
T0_MS = 1_700_000_000_000
READY = 10  # a steady fleet, no command in flight: nothing for a compensation to wait for


def _window(k: int, violation_rate: float, queue_per_replica: float) -> WindowRecord:
    return WindowRecord(
        scope="zone", model=MODEL, zone=ZONE, window_end_ms=T0_MS + 10_000 * k, window_s=10.0,
        ttft_slo_ms=1000.0, count=200, rate_rps=20.0, violation_rate=violation_rate,
        ttft_p50_ms=300.0 + 2000.0 * violation_rate, queue_len_mean=queue_per_replica, running_mean=2.0,
        gpu_util_mean=0.95, replicas_ready=READY, nodes=READY,
    )  # fmt: skip


def _signals(observer: bool, capacity_rps: float | None) -> list[float]:
    """The violation signal the feedback steps on, window by window: 6 windows of heavy violations with a
    queue, then 6 where the measurement and the queue are 0 (the fleet caught up)."""
    spec = ModelSpec(MODEL, min_replicas=1, max_replicas=64, replica_capacity_rps=capacity_rps)
    settings = Settings(models=(spec,), zones=(ZONE,), observer=observer, startup_hint_s=0.0)
    p = law.params_for(settings, MODEL)
    state, zones, out = p.new_state(), zc.ZoneCapacityState(), []
    windows = [_window(k, 0.8, 30.0) for k in range(6)] + [_window(k, 0.0, 0.0) for k in range(6, 12)]
    for w in windows:
        state, zones, d = law.decide(p, state, zones, w)
        out.append(d.violation_rate)
    return out


@pytest.mark.parametrize("capacity_rps", [None, 2.5], ids=["feedback-alone", "profiled-capacity"])
def test_without_the_observer_the_fall_reaches_the_loop_at_once(capacity_rps: float | None) -> None:
    signals = _signals(False, capacity_rps)
    assert min(signals[:6]) > 0.5  # the violations are seen ...
    assert max(signals[6:]) <= 0.02  # ... and so is their end, in the first window without them


@pytest.mark.xfail(
    strict=True,
    reason=(
        "the observer lags a fall of the violation rate: eps is a random walk in the Kalman model (no steady "
        "state: scaling_law.py 555-558), so predict_ahead returns the filtered value (observer.py 163), which "
        "falls ~27 % a window (noises at observer.py 97-98), and scaling_law.py 567 takes max(eps_pred, lead). "
        "Fix: with no steady state to predict with, _observe returns the measured signal (its eps argument); "
        "a random-walk estimate never enters the max"
    ),
)
def test_the_feedback_loop_s_observer_passes_a_fall_of_the_violations_on_at_once() -> None:
    signals = _signals(True, None)  # bench design-source §3.1's loop: no profiled capacity
    assert min(signals[:6]) > 0.5
    # A compensation may anticipate; it must not hold the loop above eps_ref for windows after the
    # violations and the queue are gone on a fleet with nothing in flight.
    assert max(signals[6:]) <= 0.02, [round(s, 3) for s in signals]


@pytest.mark.xfail(
    strict=True,
    reason=(
        "with a profiled capacity the queue has a steady state, but its estimate trails the measurement too "
        "(queue measurement noise 0.25 against process noise 5e-3 /s, observer.py 97-98), and lead is "
        "computed from that estimate (scaling_law.py 561-566) next to the lagging eps (567). Fix: the eps "
        "fix above, and noises fitted to the windows (the defaults are placeholders) or the measured queue "
        "as the prediction's start, so that a queue already gone is not predicted"
    ),
)
def test_with_a_profiled_capacity_the_observer_passes_the_fall_on_within_two_windows() -> None:
    signals = _signals(True, 2.5)
    assert min(signals[:6]) > 0.5
    assert max(signals[8:]) <= 0.02, [round(s, 3) for s in signals]
