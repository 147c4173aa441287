"""Scale-down stabilisation of the scaling law (controllers.scaling_law.stabilise_scale_down, issue 35):
a target below the one in force waits for the dwell after a scale-up, takes the highest raw target of the
stabilisation window, and keeps the replicas that carry the demand; a scale-up is never delayed; every hold
is visible (the reason, a ``scale_down_hold`` event, the command's detail) and survives a snapshot."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from controllers.scaling_law import stabilise_scale_down
from loop.errors import SnapshotVersionError
from loop.scaler_driver import SNAPSHOT_VERSION, Scaler
from tests.unit.test_scaler_driver import MODEL, _settings, _window

pytestmark = pytest.mark.timeout(300)
KEY = (MODEL, "az-a")


def _stab(**kw: Any) -> Any:
    args: dict[str, Any] = {"now_s": 1000.0, "window_s": 60.0, "dwell_windows": 3, "since_up": None,
                            "raw_targets": (), "absorb_min": None}  # fmt: skip
    return stabilise_scale_down(**{**args, **kw})


# -- the pure conditions ------------------------------------------------------------------------------
def test_dwell_holds_a_scale_down_until_the_dwell_after_a_scale_up() -> None:
    up = _stab(current=8, raw=10, since_up=7)
    assert (up.target, up.held_by, up.since_up) == (10, "", 0)  # a scale-up restarts the dwell
    since, held = up.since_up, []
    for _ in range(4):
        out = _stab(current=10, raw=6, since_up=since, window_s=0.0)
        since = out.since_up
        held.append((out.target, out.held_by))
    assert held == [(10, "dwell"), (10, "dwell"), (6, ""), (6, "")]  # the 3rd window after the scale-up


def test_the_window_applies_the_highest_raw_target_of_its_seconds() -> None:
    history = ((930.0, 10), (950.0, 9), (970.0, 8), (990.0, 7))  # raw targets of the last windows
    out = _stab(current=10, raw=6, raw_targets=history)
    assert (out.target, out.held_by) == (9, "window")  # 930 s is out of the 60 s window; 950 s is in
    assert [t for t, _ in out.raw_targets] == [950.0, 970.0, 990.0, 1000.0]  # bounded to the window
    assert _stab(current=10, raw=6, raw_targets=((945.0, 12),)).held_by == "window"  # a high one holds it all
    assert _stab(current=10, raw=6, raw_targets=((939.0, 12),))[:3] == (6, 6, "")  # older than W: gone


def test_the_absorb_check_keeps_the_replicas_that_carry_the_demand() -> None:
    assert _stab(current=4, raw=2, absorb_min=3)[:3] == (3, 2, "absorb")  # 4 -> 3 absorbs it, 4 -> 2 not
    assert _stab(current=2, raw=1, absorb_min=2)[:3] == (2, 1, "absorb")  # Dynamo's 2 <-> 1
    assert _stab(current=4, raw=2, absorb_min=2)[:3] == (2, 2, "")
    assert _stab(current=4, raw=2, absorb_min=None)[:3] == (2, 2, "")  # no feedforward capacity: skipped


def test_a_shrunk_budget_wins_over_every_hold() -> None:
    out = _stab(current=10, raw=6, since_up=0, budget_cap=6)
    assert (out.target, out.held_by) == (6, "")


@settings(derandomize=True, max_examples=300, deadline=None)
@given(
    current=st.integers(0, 200),
    rise=st.integers(0, 50),
    since_up=st.none() | st.integers(0, 20),
    dwell=st.integers(0, 20),
    history=st.lists(st.tuples(st.floats(900.0, 1000.0), st.integers(0, 400)), max_size=12),
    absorb=st.none() | st.integers(0, 400),
)
@example(current=2, rise=0, since_up=0, dwell=5, history=[(999.0, 9)], absorb=9)
def test_a_scale_up_or_a_hold_is_never_delayed(
    current: int, rise: int, since_up: int | None, dwell: int, history: list[tuple[float, int]], absorb: int | None
) -> None:
    out = _stab(current=current, raw=current + rise, since_up=since_up, dwell_windows=dwell,
                raw_targets=tuple(history), absorb_min=absorb)  # fmt: skip
    assert (out.target, out.held_by) == (current + rise, "")


# -- through the law (the driver keeps the state; the law decides) --------------------------------------
def _scaler(**kw: Any) -> Scaler:
    return Scaler(_settings(**kw))


def _follow(s: Scaler, ks: range, fleet: int, **kw: Any) -> tuple[list[int], list[Any]]:
    """Windows ``ks`` whose fleet follows every command at once (from ``fleet``): the target in force
    after each window, and the commands."""
    out, cmds = [], []
    for k in ks:
        for cmd in s.on_window(_window(k, ready=fleet, **kw), (k + 1) * 10_000):
            assert cmd.target_replicas is not None
            fleet = cmd.target_replicas
            cmds.append(cmd)
        out.append(s.states[KEY].ctrl.last_target or 0)
    return out, cmds


def _targets(s: Scaler, ks: range, fleet: int, **kw: Any) -> list[int]:
    return _follow(s, ks, fleet, **kw)[0]


def test_the_law_holds_after_a_scale_up_and_says_so() -> None:
    s = _scaler(scale_down_dwell_windows=4, scale_down_stabilization_s=0.0, startup_hint_s=0.0,
                pid_gains={"ki": 0.05, "ki_down": 1.0})  # fmt: skip
    (up,) = s.on_window(_window(0, eps=0.9), 10_000)
    assert up.reason == "scale_up"
    fleet, first_down, holds = up.target_replicas, None, []
    for k in range(1, 7):  # the raw target falls from the 2nd window on (the slew); the dwell holds it
        cmds = s.on_window(_window(k, eps=0.0, ready=fleet), (k + 1) * 10_000)
        holds.append(s.states[KEY].hold)
        if cmds and first_down is None:
            first_down = k
            assert cmds[0].target_replicas < fleet and cmds[0].reason == "scale_down"
    assert first_down == 4 and "dwell" in holds[:3], holds  # the 4th window after the scale-up releases it
    events = [e for e in s.drain_events() if e["kind"] == "scale_down_hold"]
    assert [e["condition"] for e in events] == ["dwell", "released"]
    assert events[0]["held_replicas"] == fleet > events[0]["target_replicas"]


def test_the_law_follows_the_highest_raw_target_of_the_window() -> None:
    s = _scaler(scale_down_dwell_windows=0, scale_down_stabilization_s=60.0, startup_hint_s=0.0,
                pid_gains={"ki": 0.05, "ki_down": 0.5})  # fmt: skip
    applied = _targets(s, range(30), 20, eps=0.0)
    raws = s.states[KEY].raw_targets
    assert applied[-1] == max(n for _, n in raws)  # the window's highest raw target
    assert applied[:5] == [20] * 5  # a falling raw target moves nothing before the window has passed
    assert min(applied) < 20 and applied == sorted(applied, reverse=True)  # then follows, never up


def test_the_law_keeps_what_carries_the_demand_and_skips_the_check_without_a_capacity() -> None:
    # 10 req/s at 2 req/s a replica and target utilisation 0.8: 7 replicas carry it.
    kw: dict[str, Any] = {"scale_down_dwell_windows": 0, "scale_down_stabilization_s": 0.0, "startup_hint_s": 0.0,
                          "pid_gains": {"ki": 0.05, "ki_down": 1.0}}  # fmt: skip
    with_ff = _scaler(capacity=2.0, **kw)
    applied = _targets(with_ff, range(40), 20, eps=0.0, rate=10.0)
    assert min(applied) == 7 and with_ff.states[KEY].hold == "absorb"
    assert with_ff.states[KEY].ctrl.level is not None and with_ff.states[KEY].ctrl.level >= 7.0  # no wind-down
    without = _scaler(**kw)
    assert min(_targets(without, range(40), 20, eps=0.0, rate=10.0)) < 7


def test_a_scale_up_after_a_held_scale_down_is_not_delayed() -> None:
    """A long hold leaves the level below the fleet; the first violation window scales up from the fleet."""
    s = _scaler(scale_down_dwell_windows=0, scale_down_stabilization_s=300.0, startup_hint_s=0.0,
                pid_gains={"ki": 0.05, "ki_down": 0.5})  # fmt: skip
    _targets(s, range(20), 20, eps=0.0)
    ks = s.states[KEY]
    assert ks.ctrl.last_target == 20 and ks.ctrl.level is not None and ks.ctrl.level < 10  # held, level below
    (cmd,) = s.on_window(_window(20, eps=0.3, ready=20), 210_000)
    assert cmd.reason == "scale_up" and cmd.target_replicas > 20


def test_a_partial_release_names_its_condition_in_the_command() -> None:
    s = _scaler(scale_down_dwell_windows=0, scale_down_stabilization_s=60.0, startup_hint_s=0.0,
                pid_gains={"ki": 0.05, "ki_down": 0.5})  # fmt: skip
    _, cmds = _follow(s, range(30), 20, eps=0.0)
    partial = [c for c in cmds if c.detail["scale_down_held_by"]]
    assert partial and all("held at" in c.reason and "window" in c.reason for c in partial)


def test_the_stabilisation_state_survives_a_snapshot() -> None:
    kw: dict[str, Any] = {"scale_down_dwell_windows": 2, "scale_down_stabilization_s": 60.0, "startup_hint_s": 0.0,
                          "pid_gains": {"ki": 0.05, "ki_down": 0.5}}  # fmt: skip
    a = _scaler(**kw)
    _targets(a, range(1), 4, eps=0.9)
    _targets(a, range(1, 12), a.states[KEY].ctrl.last_target or 0, eps=0.0, starting=1)
    snap = json.loads(json.dumps(a.snapshot()))
    assert snap["version"] == SNAPSHOT_VERSION == 4
    b = _scaler(**kw)
    b.restore(snap)
    assert b.states[KEY].to_state() == a.states[KEY].to_state()
    assert b.states[KEY].raw_targets and b.states[KEY].startup == a.states[KEY].startup
    fleet = a.states[KEY].ctrl.last_target or 0
    assert _targets(b, range(12, 20), fleet, eps=0.0) == _targets(a, range(12, 20), fleet, eps=0.0)
    with pytest.raises(SnapshotVersionError):
        _scaler(**kw).restore({**snap, "version": 3})


def test_the_600_s_azure_step_does_not_flap_in_the_fast_loop() -> None:
    """The benchmark's run (``governor bench control --trace azure-conv --scenario step --qps 20
    --duration-s 600 --strategies governor``, seed 0): 12 reversals at 8c5b9fc (46 on the 1800 s run);
    the issue's goal is at most one per 10 minutes per zone.  The bound is well above the measured
    figure (the report has it), and attainment stays at the ceiling."""
    from argparse import Namespace

    from bench.control import prepare
    from sim.fastloop import run

    args = Namespace(
        trace="azure-conv", qps=20.0, duration_s=600.0, startup_s=30.0, seed=0, window_s=10.0, replicas=4,
        warm_start=True, static_replicas=0, zones=2, balancer="uniform", eps_ref=0.02, ttft_slo_ms=0.0,
        itl_slo_ms=0.0,
    )  # fmt: skip
    s = prepare(args, "step")
    cfg = s.cfg.replace(replica_capacity_rps=s.capacity, replica_headroom=s.headroom)
    m = run("governor", s.scenario.workload, cfg, s.scenario.faults, s.scenario.duration_s).metrics
    assert m["reversals"] <= 4, m
    assert m["slo_attainment"] >= 0.999, m
