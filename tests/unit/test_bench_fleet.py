"""``governor bench fleet`` on a tiny fleet: the worker's loop takes every record and decides every key."""

from __future__ import annotations

import pytest

from bench.fleet import FleetLoad, fleet_settings, measure, plan, render

pytestmark = pytest.mark.timeout(120)


def test_a_small_fleet_through_the_workers_loop() -> None:
    s = fleet_settings(models=3, zones=2, partitions=4)
    r = measure(s, FleetLoad(replicas=24), windows=4)
    assert r["keys"] == 6 and r["windows"] == 3  # the first window is warm-up
    for row in r["per_window"]:
        # every record windowed (no dead letter: measure asserts it); each of the 24 nodes and
        # 6 (model, zone) keys closes one window record a window, each decided
        assert row["records"] > 24 * 10 and row["messages"] == 6 * 10
        assert row["window_records"] == 24 + 6
    assert r["commands_per_window"] > 0  # some keys miss the SLO and scale
    assert 0 < r["decide_share_of_window_p50"] <= r["decide_share_of_window_p99"]
    p1, p100 = plan(r, 0.5), plan(r, 0.5, 100.0)
    assert p100["workers"] >= p1["workers"] and p100["partitions"] >= p100["workers"]
    assert "x100" in render(r, 0.5)
