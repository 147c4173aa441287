"""The per-key wiring of the controllers (loop.scaler_driver.Scaler), without I/O."""

from __future__ import annotations

import dataclasses

import pytest

from controllers.fixable import fixable_violation_rate
from controllers.window_record import WindowRecord, decode_window
from core.settings import ModelSpec, Settings
from loop.commands import Command
from loop.errors import SnapshotVersionError
from loop.scaler_driver import Scaler
from tests.unit.test_breaker_driver import plain

MODEL = "m"


# Tests of mechanisms (the driver's bookkeeping here, the control loop, the exported target) run at a brisk
# symmetric integral gain (the gains shipped before issue 35), so that one window of violations moves a small
# fleet; the law at the shipped, certified gains is tested in test_scale_down_stabilisation, test_analyze_gains
# and on the fast loop (tests/unit/test_fastloop*.py).
BRISK = {"kp": 0.0, "ki": 0.05, "kd": 0.0}


def _settings(**kw) -> Settings:
    kw.setdefault("pid_gains", BRISK)
    spec = ModelSpec(
        MODEL,
        ttft_slo_ms=1000.0,
        itl_slo_ms=150.0,
        min_replicas=1,
        max_replicas=100,
        replica_capacity_rps=kw.pop("capacity", None),
    )
    return Settings(models=(spec,), window_s=10.0, zones=("az-a",), **kw)


def _window(
    k: int,
    *,
    eps: float = 0.0,
    rate: float = 10.0,
    queue: float = 0.0,
    ready: int = 4,
    starting: int = 0,
    p95: float = 300.0,
    unfixable: float = 0.0,
    running: float | None = None,
    nodes: int | None = None,
) -> WindowRecord:
    extra = {} if running is None else {"running_mean": running}
    if nodes is not None:
        extra["nodes"] = nodes
    return decode_window(
        {
            **extra,
            "scope": "zone",
            "model": MODEL,
            "zone": "az-a",
            "window_start_ms": k * 10_000,
            "window_end_ms": (k + 1) * 10_000,
            "window_s": 10.0,
            "count": int(rate * 10),
            "violation_rate": eps,
            "unfixable_rate": unfixable,
            "rate_rps": rate,
            "queue_len_mean": queue,
            "ttft_p95_ms": p95,
            "replicas_ready": ready,
            "replicas_starting": starting,
            "ttft_slo_ms": 1000.0,
        }
    )


def _run(scaler: Scaler, windows: list[WindowRecord]) -> list[list[Command]]:
    return [scaler.on_window(w, w.window_end_ms) for w in windows]


def test_redelivered_window_gives_no_second_command() -> None:
    s = Scaler(_settings())
    w = _window(0, eps=0.9)
    (first,) = s.on_window(w, 10_000)
    assert first.target_replicas > 4
    assert s.on_window(w, 10_000) == []


def test_growing_queue_is_seen_before_violations_finish() -> None:
    """Same finished-request violation rate (0), but 400 waiting at 10 rps: scale up."""
    s = Scaler(_settings())
    (cmd,) = s.on_window(_window(0, eps=0.0, queue=100.0), 10_000)
    assert cmd.reason == "scale_up"
    assert cmd.detail["violation_rate"] > 0.5


def test_feedforward_lifts_to_the_demand_at_once() -> None:
    """Capacity 2 rps/replica, demand 10 completed + 400 queued in 10 s: far more than 4 replicas."""
    s = Scaler(_settings(capacity=2.0))
    _run(s, [_window(0, rate=10.0, queue=0.0)])
    (cmd,) = s.on_window(_window(1, rate=10.0, queue=100.0), 20_000)
    assert cmd.target_replicas >= 20  # (10 + 40 arrivals/s) / (2 * 0.8) = 31 before limits
    assert cmd.detail["ff_mode"] is True
    assert any(e["kind"] == "feedforward_mode" and e["on"] for e in s.drain_events())


def test_violations_no_replica_count_fixes_do_not_drive_the_feedback() -> None:
    """4 % of requests miss even without waiting (prefill longer than the SLO): above eps_ref 2 %, but
    the fleet can fix none of them.  Feedback on the raw rate adds replicas window after window;
    on the fixable rate (here 0) it holds, and the command reports the unfixable share apart."""
    raw, fixable = Scaler(_settings()), Scaler(_settings())
    _run(raw, [_window(k, eps=0.04) for k in range(12)])
    out = _run(fixable, [_window(k, eps=0.04, unfixable=0.04) for k in range(12)])
    assert raw.targets()[(MODEL, "az-a")] > 4
    assert fixable.targets().get((MODEL, "az-a"), 4) <= 4
    level = fixable.states[(MODEL, "az-a")].ctrl.level
    assert level is not None and level < 4.0  # nothing to fix: the feedback reclaims
    # Misses the fleet can fix still count: 46 of the 96 servable requests, within two windows running
    # (at once when a held scale-down left the level below the fleet: the turn up starts from the fleet).
    cmds = fixable.on_window(_window(12, eps=0.5, unfixable=0.04), 130_000)
    (cmd,) = cmds or fixable.on_window(_window(13, eps=0.5, unfixable=0.04), 140_000)
    assert cmd.reason == "scale_up" and abs(cmd.detail["violation_rate"] - 0.46 / 0.96) < 1e-9
    assert cmd.detail["unfixable_rate"] == 0.04 and cmd.detail["window_violation_rate"] == 0.5
    assert all(not cmds for cmds in out[1:])


def test_a_jump_of_the_unfixable_share_counts_as_fixable() -> None:
    """A key whose requests have never been unfixable: a window where 12 % suddenly are (replicas
    slowed 3x make TTFT without the wait long) is not let off, the scaler scales up as on the raw
    rate; a key that has always had 4 % unfixable (long prompts) keeps holding on them."""
    steady, jump = Scaler(_settings()), Scaler(_settings())
    _run(steady, [_window(k, eps=0.04, unfixable=0.04) for k in range(20)])
    _run(jump, [_window(k) for k in range(20)])
    ks = jump.states[(MODEL, "az-a")]
    assert ks.unfixable_base == 0.0
    assert fixable_violation_rate(_window(20, eps=0.12, unfixable=0.12), ks.unfixable_base) > 0.11
    level = ks.ctrl.level
    _run(jump, [_window(20 + k, eps=0.12, unfixable=0.12) for k in range(3)])
    ks = jump.states[(MODEL, "az-a")]  # the law returns a new state each window
    assert ks.ctrl.level is not None and level is not None and ks.ctrl.level > level * 1.1
    base = steady.states[(MODEL, "az-a")].unfixable_base
    assert base is not None and abs(base - 0.04) < 1e-9
    assert fixable_violation_rate(_window(20, eps=0.04, unfixable=0.04), base) == 0.0


def test_feedforward_mode_goes_off_only_after_a_quiet_minute() -> None:
    """The first window's lift (10 rps needs 6.25 replicas of 2 rps at 80 %) turns the mode on at
    once; it goes off only after 6 quiet windows (60 s) without a lift or a burst, not at the first
    one (it toggled in 3 of 5 windows of the default step run), and a lift in between restarts the
    count (here the feedback's own reclaim lets the level fall 10 % under the need before the
    forecast is warm, at the 11th window)."""
    s = Scaler(_settings(capacity=2.0))
    seen = []
    for k in range(24):
        ks = s.states.get((MODEL, "az-a"))
        ready = ks.ctrl.last_target or 4 if ks is not None else 4
        _run(s, [_window(k, rate=10.0, ready=ready)])
        ks = s.states[(MODEL, "az-a")]
        seen.append((ks.ff_mode, ks.ff_quiet))
    assert seen[0] == (True, 0)
    assert all(mode == (quiet < 6) for mode, quiet in seen)  # off exactly from the 6th quiet window
    assert [mode for mode, _ in seen[:7]] == [True] * 6 + [False]
    events = [e["on"] for e in s.drain_events() if e["kind"] == "feedforward_mode"]
    assert events[:2] == [True, False] and events == [i % 2 == 0 for i in range(len(events))]
    assert len(events) <= 4  # at most one more on-off pair in 24 windows: no per-window chatter


def test_rate_drift_is_reported_and_resets_the_forecaster() -> None:
    s = Scaler(_settings(capacity=2.0))
    windows = [_window(k, rate=10.0) for k in range(60)] + [_window(60 + k, rate=40.0) for k in range(40)]
    _run(s, windows)
    events = [e for e in s.drain_events() if e["kind"] == "drift"]
    assert any(e["signal"] == "arrival_rps" and e["direction"] == "up" for e in events), events
    fc = s.states[(MODEL, "az-a")].forecaster
    assert fc is not None and fc.n_resets >= 1


@pytest.mark.parametrize("controller", ["pid", "fpid"])
def test_snapshot_restore_continues_identically(controller: str) -> None:
    """A restarted worker that restores the snapshot decides as if it never stopped."""
    gains = {"kp": 0.0, "ki": 0.05, "kd": 0.0} if controller == "pid" else {"kp": 0.2, "ki": 0.05}
    settings = _settings(capacity=2.0, controller=controller, pid_gains=gains)
    ws = [_window(k, eps=0.3 if 5 <= k < 12 else 0.0, rate=10.0 + k, queue=5.0 * (k % 3)) for k in range(30)]
    straight = Scaler(settings)
    a = _run(straight, ws)
    first = Scaler(settings)
    b = _run(first, ws[:15])
    resumed = Scaler(settings)
    assert resumed.restore(plain(first.snapshot())) == 1  # as the worker stores it: JSON
    b += _run(resumed, ws[15:])
    key = lambda cs: [(c.command_id, c.target_replicas) for c in cs]  # noqa: E731
    assert [key(c) for c in a] == [key(c) for c in b]
    assert any(a)  # there were decisions to compare


def test_snapshot_of_another_controller_is_ignored() -> None:
    pid = Scaler(_settings())
    _run(pid, [_window(0, eps=0.5)])
    other = Scaler(_settings(controller="fpid", pid_gains={"kp": 0.2, "ki": 0.05}))
    with pytest.raises(SnapshotVersionError, match="controller 'pid'"):
        other.restore(plain(pid.snapshot()))
    assert other.states == {}


def test_observer_measures_the_loop_delay_from_the_commands_life() -> None:
    """Command at window 0 (basis 10 s); the fleet shows it at 20 s (starting) and
    serves with it at 50 s: tau = ctrl 0 + net/apply 10 s + actuation 30 s."""
    s = Scaler(_settings(observer=True))
    (cmd,) = s.on_window(_window(0, eps=0.9), 10_000)
    n = cmd.target_replicas
    # eps at the reference while the replicas load: no new decision replaces the command
    for k in (1, 2, 3):
        assert s.on_window(_window(k, eps=0.02, ready=4, starting=n - 4), (k + 1) * 10_000) == []
    s.on_window(_window(4, eps=0.02, ready=n, starting=0), 50_000)
    delay = s.states[(MODEL, "az-a")].delay
    assert delay.n == 1
    assert delay.tau_net_s == pytest.approx(10.0) and delay.tau_act_s == pytest.approx(30.0)
    assert delay.tau_s == pytest.approx(40.0)


def test_observer_predicts_a_growing_queue_as_violations() -> None:
    with_obs = Scaler(_settings(observer=True, capacity=2.0))
    cmds: list[Command] = []
    for k in range(3):  # every window reports no violation; 10 rps on 4 replicas of 2 rps, the queue growing
        cmds += with_obs.on_window(_window(k, eps=0.0, rate=10.0, queue=4.0 * k, ready=4), (k + 1) * 10_000)
    assert cmds and all(cmd.reason == "scale_up" and cmd.detail["violation_rate"] > 0.9 for cmd in cmds)


# -- zone-aware capacity (controllers.zone_capacity wired per model) -------------------------


def _two_zone_scaler(**kw) -> Scaler:
    spec = ModelSpec(
        MODEL, ttft_slo_ms=1000.0, itl_slo_ms=150.0, min_replicas=1, max_replicas=100, replica_capacity_rps=2.0
    )
    return Scaler(Settings(models=(spec,), window_s=10.0, zones=("az-a", "az-b"), **kw))


def _zw(zone: str, k: int, **kw) -> WindowRecord:
    return dataclasses.replace(_window(k, **kw), zone=zone)


def test_a_silent_zone_is_lost_and_its_demand_sized_on_the_survivor_at_once() -> None:
    """8 rps per zone at 2 rps/replica x 0.8: az-a alone needs 5 replicas, with az-b's share 10.
    az-b's last window is k=5 (ends 60 s); at az-a's window ending 90 s it has missed two."""
    s = _two_zone_scaler()
    for k in range(6):
        s.on_window(_zw("az-a", k, rate=8.0, ready=6), (k + 1) * 10_000)
        s.on_window(_zw("az-b", k, rate=8.0, ready=6), (k + 1) * 10_000)
    s.drain_events()
    before = s.on_window(_zw("az-a", 6, rate=8.0, ready=6), 70_000)
    s.on_window(_zw("az-a", 7, rate=8.0, ready=6), 80_000)
    assert s.zone_status(MODEL) == {"az-a": "up", "az-b": "up"}
    assert all(c.target_replicas < 10 for c in before)
    (cmd,) = s.on_window(_zw("az-a", 8, rate=8.0, ready=6), 90_000)
    assert cmd.target_replicas >= 10
    assert cmd.detail["zone_floor_rps"] == pytest.approx(16.0, rel=0.05)
    lost = [e for e in s.drain_events() if e["kind"] == "zone_lost"]
    assert len(lost) == 1 and lost[0]["zone"] == "az-b" and lost[0]["model"] == MODEL
    assert s.zone_weights(MODEL) == {"az-a": 1.0, "az-b": 0.0}


def _az_b_goes_dark(rate_after: float, ready_after: int) -> Scaler:
    """Six windows of 8 rps in both zones, then three of az-a alone (az-b is lost)."""
    s = _two_zone_scaler()
    for k in range(6):
        s.on_window(_zw("az-a", k, rate=8.0, ready=6), (k + 1) * 10_000)
        s.on_window(_zw("az-b", k, rate=8.0, ready=6), (k + 1) * 10_000)
    for k in (6, 7, 8):
        s.on_window(_zw("az-a", k, rate=rate_after, ready=ready_after), (k + 1) * 10_000)
    return s


def test_zone_state_survives_a_restart_and_the_heal_is_seen_after_it() -> None:
    s = _az_b_goes_dark(rate_after=16.0, ready_after=10)
    resumed = _two_zone_scaler()
    assert resumed.restore(plain(s.snapshot())) == 2
    assert resumed.zone_status(MODEL)["az-b"] == "lost"
    assert resumed.zone_weights(MODEL) == s.zone_weights(MODEL) == {"az-a": 1.0, "az-b": 0.0}
    resumed.on_window(_zw("az-b", 9, rate=0.0, ready=0, starting=5), 100_000)
    assert [e["kind"] for e in resumed.drain_events() if e["kind"].startswith("zone")] == ["zone_healed"]
    assert resumed.zone_weights(MODEL)["az-b"] == 0.0  # nothing ready yet: no traffic
    resumed.on_window(_zw("az-a", 9, rate=16.0, ready=10), 100_000)
    resumed.on_window(_zw("az-b", 10, rate=0.0, ready=5, starting=0), 110_000)
    assert [e["kind"] for e in resumed.drain_events() if e["kind"].startswith("zone")] == ["zone_returned"]
    assert resumed.zone_weights(MODEL) == {"az-a": 0.5, "az-b": 0.5}


def test_zone_redundancy_sizes_each_zone_for_the_other_zones_share() -> None:
    """N+1 over two zones at 8 rps each: each zone is sized for 16 rps = 10 replicas."""
    plain, n1 = _two_zone_scaler(), _two_zone_scaler(zone_redundancy=1)
    targets = {}
    for name, s in (("plain", plain), ("n1", n1)):
        last = None
        for k in range(6):
            for zone in ("az-a", "az-b"):
                for cmd in s.on_window(_zw(zone, k, rate=8.0, ready=6), (k + 1) * 10_000):
                    if zone == "az-a":
                        last = cmd.target_replicas
        targets[name] = last
    assert targets["n1"] is not None and targets["n1"] >= 10
    assert targets["plain"] is None or targets["plain"] < 10
    assert not [e for e in n1.drain_events() if e["kind"].startswith("zone")]  # no loss, only floors


def test_zone_route_commands_carry_the_weights_to_every_zone() -> None:
    s = _az_b_goes_dark(rate_after=8.0, ready_after=6)
    cmds = s.zone_route_commands(MODEL, 90_000, 91_000)
    assert [c.zone for c in cmds] == ["az-a", "az-b"]
    assert all(c.kind == "route" and c.payload == {"weights": {"*": {"m|az-a": 1.0, "m|az-b": 0.0}}} for c in cmds)
    assert cmds[0].command_id == s.zone_route_commands(MODEL, 90_000, 95_000)[0].command_id  # idempotent
    assert "az-b lost" in cmds[0].reason
    assert s.zone_route_commands("unknown-model", 90_000, 91_000) == []


def test_rate_forecast_is_none_until_the_forecaster_is_warm_then_follows_the_rate() -> None:
    s = _two_zone_scaler()
    assert s.rate_forecast(MODEL, "az-a") is None
    for k in range(40):
        s.on_window(_zw("az-a", k, rate=8.0, ready=6), (k + 1) * 10_000)
    f = s.rate_forecast(MODEL, "az-a", steps=2)
    assert f is not None and f == pytest.approx(8.0, rel=0.25)
    assert s.rate_forecast(MODEL, "az-b") is None


# -- guardrails: the feedforward step cap and the fleet budget ------------------------------


def test_the_feedforward_lift_is_capped_per_window() -> None:
    """The same 4 -> 31 demand jump as above, with max_ff_step = 2: the level may only double."""
    s = Scaler(_settings(capacity=2.0))
    ffp = s.laws[MODEL].feedforward
    assert ffp is not None and ffp.max_ff_step == 8.0  # the default never binds on this jump
    s.laws[MODEL] = dataclasses.replace(s.laws[MODEL], feedforward=dataclasses.replace(ffp, max_ff_step=2.0))
    _run(s, [_window(0, rate=10.0, queue=0.0)])
    level_before = s.states[(MODEL, "az-a")].ctrl.level or 4.0
    (cmd,) = s.on_window(_window(1, rate=10.0, queue=100.0), 20_000)
    assert cmd.detail["feedforward"]["replicas"] > 30  # the need is still reported
    # Lifted to 2 x the level, then one PID step (multiplier within a_prev + slew = 1.3).
    assert cmd.target_replicas <= round(2 * level_before * 1.3)
    assert cmd.target_replicas < 20


def _budget_scaler(total: int = 0, model_total: int | None = None) -> Scaler:
    spec = ModelSpec(MODEL, min_replicas=2, max_replicas=100, max_replicas_total=model_total)
    other = ModelSpec("o", min_replicas=1, max_replicas=100)
    return Scaler(
        Settings(models=(spec, other), window_s=10.0, zones=("az-a", "az-b"), max_replicas_total=total, pid_gains=BRISK)
    )


@pytest.mark.parametrize(("total", "model_total"), [(0, 12), (12, None)])
def test_the_scaler_keeps_a_models_zones_within_the_budget(total: int, model_total: int | None) -> None:
    s = _budget_scaler(total, model_total)
    targets: dict[str, int] = {}
    reasons: list[str] = []
    for k in range(4):
        for zone in ("az-a", "az-b"):
            w = _zw(zone, k, eps=0.9, ready=targets.get(zone, 4))
            for cmd in s.on_window(w, w.window_end_ms):
                targets[zone] = cmd.target_replicas
                reasons.append(cmd.reason)
                assert sum(targets.values()) <= 12, targets
    assert targets["az-a"] > 4 and sum(targets.values()) == 12
    assert any("budget:" in r for r in reasons)
    # The other model is not in m's budget, but the global one counts it too.
    (o,) = s.on_window(dataclasses.replace(_zw("az-a", 0, eps=0.9), model="o"), 10_000)
    assert o.target_replicas == (1 if total else 5)


def test_a_budget_never_clamps_below_min_replicas() -> None:
    s = _budget_scaler(model_total=3)
    (a,) = s.on_window(_zw("az-a", 0, eps=0.9, ready=4), 10_000)
    assert a.target_replicas == 3  # the budget, minus nothing yet
    (b,) = s.on_window(_zw("az-b", 0, eps=0.9, ready=4), 10_000)
    assert b.target_replicas == 2 and "budget: " in b.reason  # min_replicas wins over the budget


@pytest.mark.parametrize(
    ("headroom", "gains", "target_util"),
    [
        (None, {}, 0.8),  # no profile headroom: the feedforward's own default, 1.25
        (1.0, {}, 1.0),  # the profile's: a trace whose queue absorbs a replica short
        (1.1, {"ff_target_util": 0.7}, 0.7),  # the operator's gain wins over the profile
    ],
)
def test_the_feedforward_plans_with_the_profiles_headroom_under_the_gain(
    headroom: float | None, gains: dict[str, float], target_util: float
) -> None:
    from controllers.scaling_law import ff_params_for

    spec = ModelSpec(MODEL, replica_capacity_rps=2.0, replica_headroom=headroom)
    s = Settings(models=(spec,), zones=("az-a",), pid_gains={**Settings().pid_gains, **gains})
    ffp = ff_params_for(s, MODEL)
    assert ffp is not None and ffp.target_util == pytest.approx(target_util)


@pytest.mark.parametrize("bad", [0.4, 11.0, float("nan"), True, "1.2"])
def test_an_unusable_headroom_is_refused(bad: object) -> None:
    from core.settings import SettingsError

    with pytest.raises(SettingsError, match="replica_headroom"):
        ModelSpec(MODEL, replica_capacity_rps=2.0, replica_headroom=bad)  # type: ignore[arg-type]


def test_a_zones_allowance_caps_its_targets_so_its_executor_is_not_asked_for_more() -> None:
    """The executors refuse a scale-up above their zone's share (executors/budget.py): the scaler, once it has
    read the allowances, asks for no more, so a zone that wants more gets its share, not refusals."""
    from core import names
    from core.budget import default_allowances
    from loop.control_loop import ControlLoop

    s = _budget_scaler(total=12)
    shares = default_allowances(("az-a", "az-b"), 12, {})
    loop = ControlLoop.__new__(ControlLoop)  # only set_allowances, on this scaler
    loop.scaler = s
    loop.set_allowances({z: a.encode() for z, a in shares.items()} | {"az-b": b"junk"})
    assert set(s.allowances) == {"az-a"} and names.zone_allowance("p", "az-a").endswith("az-a:allowance")
    target, reasons = 4, []
    for k in range(4):
        w = _zw("az-a", k, eps=0.9, ready=target)
        for cmd in s.on_window(w, w.window_end_ms):
            target = cmd.target_replicas
            reasons.append(cmd.reason)
            assert target <= 6, cmd.reason  # az-a's share of 12, not the whole 12
    assert target == 6 and any("budget:" in r for r in reasons)
    loop.set_allowances(None)  # no view: the last one kept
    assert set(s.allowances) == {"az-a"}
