"""Issue 35 item 1: the peers at their best in ``governor bench frontier``.

Every baseline is selectable with a knob whose sweep holds the target it
derives from the profile; the derived target is one per model (the same in
every zone: tests/unit/test_peer_targets.py); static (sized on the whole run's busiest minute) and the oracles
are references, not peers, in the dominance count.
"""

from __future__ import annotations

from argparse import Namespace

import pytest

from bench.control import prepare
from bench.frontier import (
    CLAIRVOYANT,
    DEFAULT_STRATEGIES,
    KNOBS,
    LIMITS,
    PEERS,
    derived_targets,
    knob_values,
    markdown,
    peer_dominance,
    setting,
)
from sim.baselines import BASELINES
from sim.traces import load_trace

CAPACITY = {"azure-conv": 3.105, "mooncake": 0.2003}  # the profiles at seed 0 (the profiler is not under test)


def _setup(trace: str, duration_s: float = 600.0):  # type: ignore[no-untyped-def]
    args = Namespace(
        trace=trace,
        qps={"azure-conv": 20.0, "mooncake": 4.0}[trace],
        duration_s=duration_s,
        startup_s=30.0,
        window_s=10.0,
        seed=0,
        capacity_error=1.0,
    )
    return prepare(args, "replay", trace=load_trace(trace), capacity=CAPACITY[trace], headroom=1.25)


def test_every_baseline_and_both_oracles_are_selectable_and_swept_by_default() -> None:
    assert set(BASELINES) <= set(KNOBS) and set(LIMITS) <= set(KNOBS)  # hpa-queue had no knob
    assert set(BASELINES) <= set(DEFAULT_STRATEGIES) and set(LIMITS) <= set(DEFAULT_STRATEGIES)
    assert set(BASELINES) == set(PEERS) | set(CLAIRVOYANT) and not set(PEERS) & set(CLAIRVOYANT)


@pytest.mark.parametrize("trace", ["azure-conv", "mooncake"])
@pytest.mark.parametrize("points", [0, 3, 8])
def test_each_sweep_holds_the_derived_target(trace: str, points: int) -> None:
    setup = _setup(trace)
    derived = derived_targets(setup)
    assert set(derived) == set(BASELINES)
    for name in BASELINES:
        settings = [setting(name, v, setup) for v in knob_values(name, points)]
        target = float(derived[name]["value"])
        assert min(settings) < target < max(settings), (name, settings, target)
        assert any(abs(s - target) <= 1e-9 * max(1.0, target) for s in settings), (name, settings, target)
    # the per-replica targets scale with the profile, from a quarter of the derived one to twice it
    for name in ("kpa", "rayserve", "hpa-queue"):
        settings = [setting(name, v, setup) for v in knob_values(name)]
        assert min(settings) == pytest.approx(0.25 * derived[name]["value"], rel=1e-3)
        assert max(settings) == pytest.approx(2.0 * derived[name]["value"], rel=1e-3)


def test_static_and_the_oracles_are_not_counted_as_peer_points() -> None:
    def pt(s: str, k: float, a: float, g: float) -> dict[str, object]:
        return {"strategy": s, "knob_value": k, "slo_attainment": a, "gpu_seconds": g}

    points = [
        pt("governor", 1.0, 0.999, 100.0),
        pt("static", 1.0, 0.99, 150.0),  # dominated, but clairvoyant: not a peer
        pt("oracle", 1.0, 0.99, 150.0),
        pt("oracle-causal", 1.0, 0.99, 150.0),
        pt("kpa", 1.0, 0.99, 120.0),  # dominated
        pt("rayserve", 1.0, 0.9999, 90.0),  # not
    ]
    d = peer_dominance(points)
    assert d["dominated_by_governor"] == ["kpa@1"] and d["not_dominated"] == ["rayserve@1"]
    assert d["peer_points"] == 2 and d["dominated_share"] == 0.5
    summary = {
        "scenario": "replay",
        "ceiling": 1.0,
        "governor_gpu_seconds_at_target": 100.0,
        "governor_over_oracle": 1.0,
        "governor_over_causal_oracle": 1.0,
        "governor_over_lower_bound": 2.0,
        "static_gpu_seconds_at_target": 150.0,
        **d,
    }
    meta = {"trace": "azure-conv", "qps": 20.0, "duration_s": 600.0, "seed": 0, "wall_s": 1.0}
    row = markdown(meta, [summary]).splitlines()[-1]
    assert "| 150 |" in row and "| 1 of 2 (50%) |" in row
