"""Missing telemetry means hold, never idle (issue 13, item 3): controllers.staleness, the control
loop's hold, zone loss that needs the executor's heartbeat gone, and the fast loop's broken streams."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from controllers import zone_capacity as zc
from controllers.staleness import StaleParams, StaleState, classify, silent, step
from controllers.window_record import WindowRecord, decode_window
from core.settings import ModelSpec, Settings
from loop.control_loop import ControlLoop
from sim.fastloop import Fault, LoopConfig, run
from sim.scenarios import build
from sim.traces import load_trace
from streams.metrics_export import WorkerMetrics

T0 = 1_700_000_000_000
MODEL = "m"


def _loop(metrics: WorkerMetrics | None = None) -> ControlLoop:
    s = Settings(models=(ModelSpec(MODEL, min_replicas=1, max_replicas=20),), zones=("az-a", "az-b"))
    return ControlLoop(s, metrics)


def _zone(k: int, zone: str = "az-a", **kw: Any) -> WindowRecord:
    base = {"scope": "zone", "model": MODEL, "zone": zone, "window_end_ms": T0 + (k + 1) * 10_000, "window_s": 10.0}
    return decode_window({**base, **kw})


@pytest.mark.parametrize(
    ("count", "running", "queued", "replicas", "want"),
    [
        (50, 2.0, 0.0, 2, "ok"),
        (0, 0.0, 0.0, 2, "ok"),  # idle: both streams agree
        (0, None, None, 0, "ok"),  # nothing reported at all
        (0, 3.0, 0.0, 2, "no_requests"),
        (0, 0.0, 0.3, 2, "no_requests"),
        (0, 24.4, 1.5, 6, "saturated"),  # the Mooncake step: overloaded, long requests, nothing finished
        (50, None, None, 0, "no_gpu"),
        (50, None, None, 3, "ok"),  # replica counts come only from GPU samples
        (0, float("nan"), None, 1, "ok"),
    ],
)
def test_classify(count: int, running: float | None, queued: float | None, replicas: int, want: str) -> None:
    assert classify(count, running, queued, replicas) == want


def test_stale_after_n_held_windows_and_fresh_on_the_first_good_one() -> None:
    p, s = StaleParams(stale_windows=3), StaleState()
    kinds = ["no_requests", "no_gpu", "no_requests", "no_requests", "saturated"]
    seen = []
    for kind in kinds:
        s = step(p, s, kind)
        seen.append(s.stale)
    assert seen == [False, False, True, True, False]
    assert not silent(p, T0, T0 + 32_000, 10_000, 2_000) and silent(p, T0, T0 + 32_001, 10_000, 2_000)
    with pytest.raises(ValueError):
        StaleParams(stale_windows=0)


def test_request_records_missing_for_30_minutes_move_nothing() -> None:
    """Busy GPUs (4 running, 2 queued per replica) and no request record for 180 windows:
    the loop holds -- not one command, the controller's level untouched -- and reports stale."""
    metrics = WorkerMetrics()
    loop = _loop(metrics)
    for k in range(3):
        loop.decide(_zone(k, count=400, violation_rate=0.0, replicas_ready=8, running_mean=4.0), 0)
    level = loop.scaler.states[(MODEL, "az-a")].ctrl.level
    events = []
    for k in range(3, 183):
        out = loop.decide(_zone(k, count=0, replicas_ready=8, running_mean=4.0, queue_len_mean=0.2), 0)
        assert out.commands == [], k
        events += out.events
    assert loop.scaler.states[(MODEL, "az-a")].ctrl.level == level
    assert [e["kind"] for e in events] == ["telemetry_stale"] and events[0]["reason"] == "no_requests"
    assert metrics.registry.get_sample_value("governor_telemetry_stale", {"model": MODEL, "zone": "az-a"}) == 1.0
    back = loop.decide(_zone(183, count=400, violation_rate=0.0, replicas_ready=8, running_mean=4.0), 0)
    assert [e["kind"] for e in back.events] == ["telemetry_fresh"]
    assert metrics.registry.get_sample_value("governor_telemetry_stale", {"model": MODEL, "zone": "az-a"}) == 0.0


def test_a_zone_whose_windows_stop_is_reported_stale_by_the_clock() -> None:
    loop = _loop()
    loop.decide(_zone(0, count=10, replicas_ready=1), 0)
    assert loop.check_silence(T0 + 10_000 + 3 * 10_000) == []  # 3 windows + lateness not yet passed
    (ev,) = loop.check_silence(T0 + 10_000 + 3 * 10_000 + 2_001)
    assert (ev["kind"], ev["zone"], ev["reason"]) == ("telemetry_stale", "az-a", "no_window")
    assert loop.check_silence(T0 + 100_000) == []  # reported once


def test_zone_loss_by_silence_needs_the_executor_heartbeat_gone() -> None:
    p = zc.ZoneCapacityParams(zones=("az-a", "az-b"), window_s=10.0)
    st = zc.ZoneCapacityState()
    for k in range(3):
        for z in ("az-a", "az-b"):
            st, _ = zc.observe(p, st, z, zc.ZoneWindow(T0 + k * 10_000, 5.0, 2, 0))
    alive_st, alive_ev = st, []
    for k in range(3, 8):  # az-b silent; its executor still beats
        alive_st, ev = zc.observe(
            p, alive_st, "az-a", zc.ZoneWindow(T0 + k * 10_000, 5.0, 2, 0), alive={"az-a", "az-b"}
        )
        alive_ev += ev
    assert alive_ev == [] and zc.weights(p, alive_st)["az-b"] > 0
    _, gone = zc.observe(p, alive_st, "az-a", zc.ZoneWindow(T0 + 8 * 10_000, 5.0, 2, 0), alive={"az-a"})
    assert [(e.kind, e.zone) for e in gone] == [("zone_lost", "az-b")]


SC = build("replay", load_trace("azure-conv"), qps=20, duration_s=3000)
CFG = LoopConfig.of(initial_replicas=4, startup_s=30.0, min_replicas=1)


@pytest.mark.parametrize("kind", ["requests_silent", "gpu_silent"])
def test_a_broken_telemetry_stream_for_30_simulated_minutes_holds_the_fleet(kind: str) -> None:
    r = run("governor", SC.workload, CFG, (Fault(kind, "az-a", 600.0, 1800.0),), SC.duration_s)
    t, desired = r.timeline["t_s"], r.timeline["az-a.desired"]
    during = desired[(t >= 600.0) & (t < 2400.0)]
    assert during.min() == during.max() == desired[np.searchsorted(t, 599.0)]  # not one move in 30 minutes
    assert not [e for e in r.events if e["kind"] == "zone_lost"]  # a silent stream is not a lost zone
    stale = [e for e in r.events if e["kind"] in ("telemetry_stale", "telemetry_fresh")]
    assert [e["kind"] for e in stale] == ["telemetry_stale", "telemetry_fresh"]
    # and it decides again after: its windows reach the law (the fresh event, then whatever the law says: a
    # command, or none when the fleet it held is the one the load needs, as at the shipped gains)
    after = [e for e in r.events if e.get("zone") == "az-a" and e.get("window_end_ms", 0) >= T0 + 2_400_000]
    assert after and after[0]["kind"] == "telemetry_fresh"
