"""Weighted routing over (variant, zone) targets and injected errors in the fleet."""
from __future__ import annotations

import numpy as np
import pytest

from sim.fleet import Fleet, FleetConfig, FleetConfigError
from sim.perf_model import PerfModel
from sim.router import ErrorInjector, WeightedRouter, parse_target


def _fleet(seed: int = 0) -> Fleet:
    perf = PerfModel.from_splitwise()
    return Fleet(FleetConfig(models={"big": perf, "small": perf}, zones=("az-a", "az-b"),
                             initial_replicas=1, jitter=False, seed=seed))


def test_weights_are_honoured_per_class_and_seeded() -> None:
    picks = []
    for _ in range(2):
        f = _fleet()
        f.set_routing("fam", {"big|az-a": 3, ("small", "az-b"): 1}, 0.0)
        f.set_routing("fam", {"small|az-a": 1}, 0.0, request_class="trading")
        p = [f.submit_routed(0.0, "fam", "voice", 10, 1, f"v{i}") for i in range(2000)]
        assert all(f.submit_routed(0.0, "fam", "trading", 10, 1, f"t{i}") == ("small", "az-a")
                   for i in range(50))
        picks.append(p)
    assert picks[0] == picks[1]
    share = sum(t == ("big", "az-a") for t in picks[0]) / 2000
    assert 0.72 < share < 0.78


def test_unknown_target_and_bad_weights_are_refused() -> None:
    f = _fleet()
    with pytest.raises(FleetConfigError):
        f.set_routing("fam", {"nope|az-a": 1}, 0.0)
    with pytest.raises(FleetConfigError):
        f.set_routing("fam", {"big|az-a": 0}, 0.0)
    with pytest.raises(FleetConfigError):
        f.submit_routed(0.0, "other", "voice", 1, 1, "x")
    with pytest.raises(FleetConfigError):
        parse_target("no-zone")


def test_router_weights_round_trip() -> None:
    r = WeightedRouter(np.random.default_rng(0))
    r.set("f", {"a|z": 1, "b|z": 1})
    assert r.weights("f", "any") == pytest.approx({"a|z": 0.5, "b|z": 0.5})


def test_injected_errors_mark_records_in_window_only() -> None:
    f = _fleet()
    f.inject_errors("az-a", "big", 1.0, 0.0, 50.0)
    f.submit(0.0, "az-a", "big", 100, 4, "a")
    f.submit(0.0, "az-b", "big", 100, 4, "b")
    recs = {r["request_id"]: r["status"] for r in f.advance_to(30.0)}
    assert recs == {"a": "error", "b": "ok"}
    f.submit(60.0, "az-a", "big", 100, 4, "c")
    assert [r["status"] for r in f.advance_to(90.0)] == ["ok"]


def test_error_rate_is_close_to_the_injected_probability() -> None:
    inj = ErrorInjector(np.random.default_rng(1))
    inj.add("z", "m", 0.05, 0.0, 10.0)
    n = sum(inj.status("z", "m", 1.0) == "error" for _ in range(20000))
    assert 0.04 < n / 20000 < 0.06
