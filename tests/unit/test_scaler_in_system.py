"""The scaler's count of the work in the system: the arrival rate by conservation, the backlog
history behind the stale-violation hold, and what the GPU samples' running mean is scaled by."""

from __future__ import annotations

import json

import pytest

from loop.scaler_driver import KeyState, Scaler
from tests.unit.test_scaler_driver import MODEL, _run, _settings, _window


def test_violations_in_the_wake_of_a_drained_backlog_do_not_add_replicas() -> None:
    """After a burst's queue has drained and the ready fleet serves the arrivals, the requests that
    waited in it still finish late: the window's violations are stale and the level holds.  The
    same violations with no backlog before (slow batches, an empty queue all along) scale up."""
    wake, fresh = Scaler(_settings(capacity=2.0)), Scaler(_settings(capacity=2.0))
    _run(
        wake,
        [_window(k, rate=10.0, ready=10) for k in range(3)] + [_window(3, rate=10.0, ready=10, eps=0.5, queue=3.0)],
    )
    _run(fresh, [_window(k, rate=10.0, ready=10) for k in range(4)])
    before = {id(s): s.states[(MODEL, "az-a")].ctrl.level for s in (wake, fresh)}
    assert wake.states[(MODEL, "az-a")].backlog[-1] == 3.0
    for s in (wake, fresh):
        _run(s, [_window(4, rate=10.0, ready=10, eps=0.6)])
    level = {id(s): s.states[(MODEL, "az-a")].ctrl.level for s in (wake, fresh)}
    assert level[id(wake)] <= before[id(wake)]
    assert level[id(fresh)] > before[id(fresh)] * 1.1
    # Two windows on, the backlog has left the history: the same violations count again.
    _run(wake, [_window(5 + k, rate=10.0, ready=10) for k in range(3)])
    held = wake.states[(MODEL, "az-a")].ctrl.level
    _run(wake, [_window(8, rate=10.0, ready=10, eps=0.6)])
    assert wake.states[(MODEL, "az-a")].ctrl.level > held


def test_key_state_keeps_its_in_system_count_and_backlog_history() -> None:
    s = Scaler(_settings(capacity=2.0))
    _run(s, [_window(k, rate=10.0, ready=10, queue=float(k)) for k in range(5)])
    ks = s.states[(MODEL, "az-a")]
    assert ks.backlog == (2.0, 3.0, 4.0)
    back = KeyState.from_state(json.loads(json.dumps(ks.to_state())))
    assert back.backlog == ks.backlog and back.in_system == ks.in_system
    assert back.forecaster is not None and back.forecaster.to_state() == ks.forecaster.to_state()
    with pytest.raises(ValueError, match="must be a finite number >= 0"):
        KeyState.from_state({**ks.to_state(), "backlog": [1.0, -2.0]})


def test_replicas_starting_do_not_read_as_a_change_of_load() -> None:
    """8 requests in service on 4 ready replicas; 4 more start (GPU samples with nothing running)
    and turn ready.  The per-sample mean halves while they start, but the work in the system does
    not change, so neither the count in the system nor the arrival rate may move: scaled by the
    ready count the mean read 4 then 8 in service, a dip and a surge of 0.4 rps that are only the
    fleet's own start-up (in live runs it moved the feedforward at another window than the fast
    loop's)."""
    s = Scaler(_settings(capacity=2.0))
    steady = [_window(k, rate=10.0, ready=4, running=2.0, nodes=4) for k in range(3)]
    start = [_window(3 + k, rate=10.0, ready=4, starting=4, running=1.0, nodes=8) for k in range(2)]
    ready = [_window(5 + k, rate=10.0, ready=8, running=1.0, nodes=8) for k in range(2)]
    seen = []
    for w in steady + start + ready:
        s.on_window(w, w.window_end_ms)
        seen.append(s.states[(MODEL, "az-a")].in_system)
    assert seen == [8.0] * len(seen)
    # Without a node count (an older producer) the ready replicas stand in, as before.
    legacy = Scaler(_settings(capacity=2.0))
    legacy.on_window(_window(0, ready=4, running=2.0), 10_000)
    assert legacy.states[(MODEL, "az-a")].in_system == 8.0
