"""A slow stage is not queueing (issue 36 item 6): the share of violations the network and preprocess
time explain (``stage_unfixable_rate``) is let off the scaler's feedback whole, never learned into the
key's running unfixable share, and the law says why it holds (a ``slow_stage`` event)."""

from __future__ import annotations

import dataclasses

from controllers.fixable import fixable_violation_rate, slow_stage_held
from controllers.window_record import WindowRecord
from loop.scaler_driver import Scaler
from tests.unit.test_scaler_driver import MODEL, _run, _settings, _window


def _slow(k: int, eps: float, stage: float) -> WindowRecord:
    """A window whose ``eps`` violations are all unfixable, ``stage`` of the requests the network's."""
    return dataclasses.replace(_window(k, eps=eps, unfixable=eps), stage_unfixable_rate=stage)


def test_the_stage_share_is_let_off_beyond_the_running_base() -> None:
    """A key that never had unfixable misses (base 0): a sudden 30 % over the limit without their wait
    counts as fixable (slow replicas do that), unless the network explains them."""
    plain = _window(20, eps=0.3, unfixable=0.3)
    assert fixable_violation_rate(plain, 0.0) > 0.29
    assert fixable_violation_rate(_slow(20, 0.3, 0.3), 0.0) == 0.0
    # half of them the network's (let off), the other half capped at the base plus its slack (0.005)
    u = 0.15 + 0.005
    assert abs(fixable_violation_rate(_slow(20, 0.3, 0.15), 0.0) - (0.3 - u) / (1.0 - u)) < 1e-12
    assert slow_stage_held(_slow(20, 0.3, 0.3), 0.0, 0.02)
    assert not slow_stage_held(plain, 0.0, 0.02)
    assert not slow_stage_held(_slow(20, 0.3, 0.3), None, 0.02)  # a first window lets every unfixable off anyway


def test_a_slow_network_adds_no_replicas_and_says_why() -> None:
    """Twelve windows where 30 % of requests miss: with the misses explained by the network stage the
    fleet stays at 4 and each held window publishes a ``slow_stage`` event; the same misses without a
    stage share (slower replicas) scale up after the first window."""
    slow, replicas = Scaler(_settings()), Scaler(_settings())
    _run(slow, [_slow(0, 0.0, 0.0)] + [_slow(k, 0.3, 0.3) for k in range(1, 12)])
    _run(replicas, [_window(0)] + [_window(k, eps=0.3, unfixable=0.3) for k in range(1, 12)])
    assert slow.targets().get((MODEL, "az-a"), 4) <= 4
    assert replicas.targets()[(MODEL, "az-a")] > 4
    events = [e for e in slow.drain_events() if e["kind"] == "slow_stage"]
    assert len(events) == 11
    assert "not queueing" in events[0]["reason"] and events[0]["stage_unfixable_rate"] == 0.3
    assert not [e for e in replicas.drain_events() if e["kind"] == "slow_stage"]
    # the network's share is not the workload's: the running unfixable share stays at 0
    assert slow.states[(MODEL, "az-a")].unfixable_base == 0.0
