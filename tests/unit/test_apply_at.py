"""``apply_at_ms`` of cross-zone actions: the planner (controllers/apply_at.py), the loop's stamping
(loop/cross_zone.py, ControlLoop.decide), the executor's published lead (executors/timing.py) and the
settings that bound it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from controllers.apply_at import ApplyAt, ApplyAtParams, ApplyAtPlanner, parse_zone_lead
from controllers.errors import ParameterError
from core.settings import Settings, SettingsError
from executors.timing import ZoneTiming
from loop.commands import Command
from loop.control_loop import ControlLoop
from loop.cross_zone import stamp_cross_zone
from loop.effects import Effects, Heartbeats, SwapWrite, ZoneClocks
from streams.agents import zone_beats
from tests.unit.test_control_loop import T0, _settings, _zone

P = ApplyAtParams(margin_ms=50, fallback_ms=1000, max_lead_ms=3000, stale_ms=15_000)
CLOCK = (1_000.0, 1_205.0, 1_010.0)  # the worker's clock 200 ms behind Redis, 10 ms round trip


def _beat(lead_ms: Any, error_ms: float = 1.0, age_ms: float = 100.0) -> dict[str, Any]:
    return {"ts_ms": 0, "executor": "x", "timing": {"lead_ms": lead_ms, "offset_error_ms": error_ms, "age_ms": age_ms}}


def _planner(beats: dict[str, Any], **kw: Any) -> ApplyAtPlanner:
    return ApplyAtPlanner(P, **kw).observe(beats, T0, clock=CLOCK)


def _plan(planner: ApplyAtPlanner, zones: list[str], alive: set[str] | None = None, now: int = T0) -> ApplyAt:
    plan = planner.plan(now, zones, alive=alive)
    assert plan is not None
    return plan


def test_the_lead_is_the_slowest_live_zones_measured_lead_plus_the_margin_on_the_reference_clock() -> None:
    planner = _planner({"az-a": _beat(40.0, 0.5), "az-b": _beat(900.0, 3.0), "az-c": _beat(2.0)})
    plan = _plan(planner, ["az-a", "az-b"])
    assert plan.basis == "measured"
    assert plan.lead_ms == 950.0
    assert plan.at_ms == T0 + 200 + 950  # the worker's offset to Redis, then the lead
    assert plan.skew_bound_ms == 3.5
    assert plan.detail()["apply_at_ms"] == plan.at_ms


def test_one_zone_or_no_max_lead_means_no_apply_at() -> None:
    planner = _planner({"az-a": _beat(40.0), "az-b": _beat(900.0)})
    assert planner.plan(T0, ["az-b"], alive=None) is None
    assert planner.plan(T0, ["az-b", "az-b"], alive=None) is None
    off = ApplyAtPlanner(ApplyAtParams(max_lead_ms=0, fallback_ms=0)).observe({"az-a": _beat(1.0)}, T0, CLOCK)
    assert off.plan(T0, ["az-a", "az-b"], alive=None) is None


def test_a_lost_zone_is_left_out_and_an_unmeasured_live_zone_gives_the_fixed_lead() -> None:
    planner = _planner({"az-a": _beat(40.0)})
    assert _plan(planner, ["az-a", "az-b"], alive={"az-a"}).lead_ms == 90.0  # az-b's executor is gone
    fallback = _plan(planner, ["az-a", "az-b"])  # az-b alive, never measured
    assert fallback.basis == "fallback" and fallback.lead_ms == 1000.0
    assert _plan(planner, ["az-a", "az-b"], alive=set()).basis == "fallback"  # nobody alive: never blocks


def test_stale_invalid_or_unclocked_measurements_fall_back_and_say_why() -> None:
    beats = {"az-a": _beat(40.0), "az-b": _beat(float("nan"))}
    planner = _planner(beats)
    assert _plan(planner, ["az-a", "az-b"]).basis == "fallback"
    assert "timing.lead_ms=nan" in planner.refused["az-b"]
    old = _planner({"az-a": _beat(40.0), "az-b": _beat(40.0, age_ms=20_000)})
    assert old.refused["az-b"].startswith("stale")
    seen_long_ago = _planner({"az-a": _beat(40.0), "az-b": _beat(40.0)})
    assert _plan(seen_long_ago, ["az-a", "az-b"], now=T0 + 16_000).basis == "fallback"
    no_clock = ApplyAtPlanner(P).observe({"az-a": _beat(40.0), "az-b": _beat(40.0)}, T0)
    assert _plan(no_clock, ["az-a", "az-b"]).basis == "fallback"  # the worker's offset unknown
    kept = planner.observe(None, T0 + 1)  # no view: the last heartbeats kept
    assert kept.leads == planner.leads


@settings(derandomize=True, max_examples=200)
@given(
    leads=st.lists(st.one_of(st.floats(allow_nan=True), st.integers(), st.none(), st.text(max_size=3)), max_size=4),
    speed=st.sampled_from([1.0, 4.0]),
)
@example(leads=[1e12, 5.0], speed=1.0)
def test_apply_at_is_never_further_ahead_than_the_max_lead(leads: list[Any], speed: float) -> None:
    beats = {f"z{i}": _beat(v) for i, v in enumerate(leads)} | {"zz": "not an object"}
    planner = ApplyAtPlanner(P, speed=speed).observe(beats, T0, clock=CLOCK)
    plan = _plan(planner, [*beats, "z-extra"])
    assert 0 <= plan.at_ms - (T0 + 200 * speed) <= P.max_lead_ms * speed + 1


def test_parameters_and_settings_are_validated_by_name() -> None:
    with pytest.raises(ParameterError, match="margin_ms"):
        ApplyAtParams(margin_ms=-1)
    with pytest.raises(ParameterError, match="fallback_ms"):
        ApplyAtParams(fallback_ms=5000, max_lead_ms=3000)
    with pytest.raises(SettingsError, match="GOVERNOR_APPLY_AT_FALLBACK_MS"):
        Settings(apply_at_fallback_ms=5000.0, apply_at_max_lead_ms=3000.0)
    with pytest.raises(SettingsError, match="GOVERNOR_APPLY_AT_MARGIN_MS"):
        Settings.from_env({"GOVERNOR_APPLY_AT_MARGIN_MS": "-5"})
    # The max lead never passes what the executors accept nor half a command's lifetime.
    assert Settings(max_clock_skew_s=0.5).apply_at_lead_cap_ms() == 500.0
    assert Settings(command_ttl_s=2.0).apply_at_lead_cap_ms() == 1000.0
    assert Settings().apply_at_lead_cap_ms() == 3000.0


def _cmd(zone: str, kind: str = "scale", model: str = "m") -> Command:
    extra: dict[str, Any] = {"target_replicas": 2} if kind == "scale" else {}
    if kind == "canary":
        extra = {"payload": {"model": model, "version": "v2", "share": 0.05}}
    return Command(
        kind=kind, zone=zone, model=model, reason="", issued_at_ms=T0, expires_at_ms=T0 + 60_000, basis_ms=T0, **extra
    )


def test_a_canary_steps_released_commands_are_stamped_and_one_zone_groups_are_not() -> None:
    then = tuple((_cmd(z, "canary"), "canary") for z in ("az-a", "az-b"))
    fx = Effects(commands=[_cmd("az-a")], writes=[SwapWrite("k", b"new", b"old", then)])
    assert stamp_cross_zone(fx, lambda zones: {"apply_at_ms": 7} if len(zones) > 1 else None) == 2
    assert "apply_at_ms" not in fx.commands[0].detail  # a scale for one zone: not delayed
    released = fx.writes[0]
    assert isinstance(released, SwapWrite)
    assert [c.detail["apply_at_ms"] for c, _ in released.then] == [7, 7]
    assert [c.command_id for c, _ in released.then] == [c.command_id for c, _ in then]  # same decision, same id


def _timed_loop() -> ControlLoop:
    loop = ControlLoop(_settings())
    beats = {"az-a": _beat(30.0), "az-b": _beat(400.0)}
    loop.observe(ZoneClocks(zone_beats(("az-a", "az-b"), [orjson.dumps(b) for b in beats.values()]), CLOCK, T0))
    return loop


def test_the_loop_stamps_a_zone_loss_reroute_from_the_measured_leads_and_leaves_single_zone_scales() -> None:
    loop = ControlLoop(_settings())
    routes = []
    for k in range(20):
        now = T0 + (k + 1) * 10_000
        zones = ("az-a", "az-b") if k < 5 else ("az-a",)  # az-b goes dark after 5 windows, its executor too
        loop.observe(Heartbeats(zones))
        read = [orjson.dumps(_beat(30.0)), orjson.dumps(_beat(400.0)) if k < 5 else None]
        loop.observe(ZoneClocks(zone_beats(("az-a", "az-b"), read), CLOCK, now))  # the worker, every second
        for zone in zones:
            out = loop.decide(_zone(zone=zone, window_end_ms=now, count=80, rate_rps=8.0, replicas_ready=4), now)
            routes += [(now, c) for c in out.commands if c.kind == "route"]
    assert routes and {c.zone for _, c in routes} == {"az-a", "az-b"}
    for now, c in routes:
        # az-b is lost (left out): az-a's measured 30 ms + the 50 ms margin, after the worker's 200 ms offset.
        assert c.detail["apply_at_ms"] == now + 200 + 80 and c.detail["apply_basis"] == "measured", c.detail
    out = _timed_loop().decide(_zone(count=100, violation_rate=0.5, replicas_ready=2), T0 + 10_000)
    scales = [c for c in out.commands if c.kind == "scale"]
    assert scales and all("apply_at_ms" not in c.detail for c in scales)  # one zone's scale: not put off
    # Read long ago: stale, the fixed lead.
    assert (loop.plan_apply_at(T0 + 10**6, ["az-a", "az-b"]) or {}).get("apply_basis") == "fallback"


def test_a_fresh_measurement_gives_the_measured_lead_in_decide() -> None:
    loop = _timed_loop()
    assert loop.plan_apply_at(T0 + 1, ["az-a", "az-b"]) == {
        "apply_at_ms": T0 + 1 + 200 + 450,
        "apply_lead_ms": 450.0,
        "apply_basis": "measured",
        "apply_skew_bound_ms": 2.0,
    }
    assert loop.plan_apply_at(T0 + 1, ["az-a"]) is None


def test_the_worker_decodes_heartbeats_and_keeps_an_unreadable_one_as_empty() -> None:
    assert zone_beats(("az-a", "az-b", "az-c"), [b'{"timing": {}}', b"{not json", None]) == {
        "az-a": {"timing": {}},
        "az-b": {},
    }
    assert zone_beats(("az-a",), None) is None
    assert parse_zone_lead({}, T0, 1.0) == (None, "")  # an executor that has not probed yet


class _NoRedis:
    pass


def test_an_executor_publishes_its_lead_from_deliveries_and_never_before_a_probe() -> None:
    now = [10_000.0]
    timing = ZoneTiming("az-a", _NoRedis(), wall_ms=lambda: now[0])  # type: ignore[arg-type]
    assert timing.summary() is None
    assert timing.observe_ready(b"9990-0") is None  # no offset measured yet: not believed
    timing.probes, timing.probed_ms = 1, now[0]
    timing.rtt = timing.rtt.probe("az-a", 10.0)
    timing.offset = timing.offset.sample(9_000.0, 9_105.0, 9_105.0, 9_010.0)  # Redis 100 ms ahead
    assert timing.observe_ready(b"10050-3") == 50.0  # XADD at Redis 10050, here 10000 + 100
    for junk in (b"junk", b"99999999-0", "20000-0", b""):
        assert timing.observe_ready(junk) is None
    summary = timing.summary()
    assert summary is not None
    # 50 ms to be ready, then the release's checks (4 RTTs) and the poll's lateness (3 RTTs).
    assert summary["lead_ms"] == 50.0 + 40.0 + 30.0
    timing.observe_prep(80.0)
    timing.observe_wake(5.0)
    assert timing.lead_ms() == 50.0 + 80.0 + 30.0
    lead, why = parse_zone_lead({"timing": timing.summary()}, T0, 15_000)
    assert why == "" and lead is not None and lead.lead_ms == 160.0
