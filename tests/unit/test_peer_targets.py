"""Issue 35 item 1: KPA's and Ray Serve's per-replica target is one per model, derived once from its profile.

Two identical zones of one Mooncake replay derived 3.3 and 16.0 when each measured
the target on its own first windows (sim.baselines.base.LittleTarget).
"""

from __future__ import annotations

from argparse import Namespace

import pytest

from bench.control import peer_factory, prepare
from sim.baselines.derived import profiled_concurrency
from sim.fastloop import _FastRun
from sim.traces import load_trace


def _setup(capacity_error: float = 1.0):  # type: ignore[no-untyped-def]
    args = Namespace(
        trace="mooncake",
        qps=4.0,
        duration_s=300.0,
        startup_s=30.0,
        window_s=10.0,
        seed=0,
        capacity_error=capacity_error,
    )
    return prepare(args, "replay", trace=load_trace("mooncake"), capacity=0.2003, headroom=1.25)


def test_kpa_and_rayserve_derive_one_target_per_model_in_every_zone() -> None:
    """Two identical zones of one Mooncake replay measured 3.3 and 16.0 each on its own first windows."""
    setup = _setup()
    sc = setup.scenario
    per_model = setup.replica_concurrency
    assert per_model > 0 and per_model == setup.replica_concurrency  # one trial, cached
    for name in ("kpa", "rayserve"):
        fr = _FastRun(peer_factory(name, setup), sc.workload, setup.cfg, sc.faults, sc.duration_s)
        fr.run(name)
        method = "target_value" if name == "kpa" else "target_ongoing"  # TargetValue / target_ongoing_requests
        targets = {z: getattr(s, method)() for z, s in fr.scalers.items()}
        util = 0.70 if name == "kpa" else 1.0
        assert len(targets) == 2 and all(t == pytest.approx(per_model * util) for t in targets.values()), targets


def test_the_derived_target_follows_the_profile_it_is_given() -> None:
    """Little's law on the trial at the true capacity, scaled by the capacity the peers are given."""
    right, off = _setup(), _setup(capacity_error=2.5)
    assert right.replica_concurrency == pytest.approx(profiled_concurrency(right.trace, right.cfg, 0.2003))
    assert off.replica_concurrency == pytest.approx(2.5 * right.replica_concurrency)
