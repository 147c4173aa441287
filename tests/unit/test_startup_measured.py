"""The measured start-up (controllers.startup): FIFO starting -> ready samples per key, a robust estimate,
the hint until the first sample; the scaling law sizes its horizon and its stabilisation window with it."""

from __future__ import annotations

import json

import pytest

from controllers import startup as su
from controllers.errors import ParameterError
from controllers.scaling_law import horizon_steps
from sim.fastloop import LoopConfig, _FastRun
from sim.scenarios import build
from sim.traces import load_trace

pytestmark = pytest.mark.timeout(300)


def _fold(counts: list[tuple[float, int, int]], window_s: float = 10.0) -> su.StartupState:
    s = su.StartupState()
    for t, starting, ready in counts:
        s = su.observe(s, t, starting, ready, window_s)
    return s


def test_starts_and_readies_pair_first_in_first_out() -> None:
    # two starts at 10 s, one more at 30 s; ready at 130 s, 140 s and 160 s
    s = _fold([(0, 0, 2), (10, 2, 2), (30, 3, 2), (130, 2, 3), (140, 1, 4), (160, 0, 5)])
    assert s.samples == (120.0, 130.0, 130.0) and s.pending == ()
    assert su.estimate_s(s, 30.0) == 130.0


def test_a_cancelled_start_leaves_without_a_sample() -> None:
    # two start at 10 s; at 20 s the newest is cancelled (a scale-down of a loading replica)
    s = _fold([(0, 0, 2), (10, 2, 2), (20, 1, 2), (130, 0, 3)])
    assert s.samples == (120.0,)


def test_replicas_starting_when_first_seen_give_no_sample() -> None:
    s = _fold([(0, 3, 1), (50, 0, 4)])
    assert s.samples == () and su.estimate_s(s, 30.0) == 30.0  # the hint until a start is seen whole


def test_the_estimate_is_the_median_of_the_last_samples() -> None:
    s = su.StartupState(samples=(120.0, 120.0, 600.0, 110.0, 130.0))  # one replica that failed and restarted
    assert su.estimate_s(s, 30.0) == 120.0
    many = _fold([(float(t), (k % 2), 1 + (k + 1) // 2) for k, t in enumerate(range(0, 400, 20))])
    assert len(many.samples) <= su.STARTUP_SAMPLES  # bounded


def test_state_round_trips_as_json_and_refuses_malformed_data() -> None:
    s = _fold([(0, 0, 2), (10, 2, 2), (130, 1, 3)])
    assert su.StartupState.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    with pytest.raises(ParameterError, match="samples"):
        su.StartupState.from_dict({"samples": [-1.0]})
    with pytest.raises(ParameterError, match="starting"):
        su.StartupState.from_dict({"starting": -2})


def test_the_fast_loop_measures_a_slow_start_up_the_hint_understates() -> None:
    """Replicas take 120 s to start while ``startup_hint_s`` says 30: the key measures about 120 s
    (window resolution plus the actuation delay) and its horizon follows: the feedforward looks
    ahead 13 windows instead of 4, and the scale-down stabilisation window is 240 s."""
    trace = load_trace("azure-conv")
    sc = build("step", trace, 4.0, 900.0)
    cfg = LoopConfig.of(initial_replicas=2, startup_s=120.0).replace(startup_hint_s=30.0, replica_capacity_rps=3.4)
    assert cfg.settings.startup_hint_s == 30.0 and cfg.startup_s == 120.0
    fast = _FastRun("governor", sc.workload, cfg, (), sc.duration_s)
    fast.run(None)
    for zone in cfg.zones:
        ks = fast.loop.scaler.states[(cfg.model, zone)]
        measured = su.estimate_s(ks.startup, cfg.settings.startup_hint_s)
        assert ks.startup.samples, zone
        assert 110.0 <= measured <= 140.0, (zone, ks.startup.samples)
        assert horizon_steps(measured, cfg.window_s) >= 12 > horizon_steps(30.0, cfg.window_s)
    # the law sized with it: each decision carries the start-up it used (the hold events show it)
    holds = [e for e in fast.events if e["kind"] == "scale_down_hold" and e["condition"] != "released"]
    assert holds and all(110.0 <= e["startup_s"] <= 140.0 for e in holds), holds
