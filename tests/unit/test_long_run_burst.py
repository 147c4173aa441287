"""A known gap, pinned: governor's shipped defaults on a 3600 s run of three 3x bursts.

Between bursts governor sizes each zone for the load it sees plus its
forecast's error over the horizon; a 3x burst of 60 s with 30 s start-ups is
met only from standing capacity (``static``, sized for the trace's busiest
minute) or foresight.  governor sees a burst in its first window (the running
batches grow before any queue, docs/model.md §6) and holds after it (the
violations of a drained backlog are stale, §23), but what it orders arrives
near the burst's end (docs/benchmarks.md, "Run length: the bursts at
3600 s").  Before b3e58df the 600 s runs hid this: the forecast's error margin
carried the errors of Holt's cold start.  The comparison with ``static``
below is the fact the docs state; the strict xfail turns into a failure the
day the burst response holds on long runs, so the docs and this pin are
updated together.
"""

from __future__ import annotations

from argparse import Namespace

import pytest

from bench.control import run_all


def _burst_3600() -> dict[str, dict[str, float]]:
    args = Namespace(trace="azure-conv", scenario="burst", qps=20.0, duration_s=3600.0, seed=0, startup_s=30.0,
                     window_s=10.0, strategies="governor,static")  # fmt: skip
    results, _ = run_all(args)
    return {r.strategy: r.metrics for r in results}


@pytest.fixture(scope="module")
def burst_3600() -> dict[str, dict[str, float]]:
    return _burst_3600()


def test_static_holds_the_long_burst_run_that_governor_misses(burst_3600: dict[str, dict[str, float]]) -> None:
    gov, static = burst_3600["governor"], burst_3600["static"]
    assert static["attainment_over_ceiling"] >= 0.995
    assert gov["attainment_over_ceiling"] < static["attainment_over_ceiling"] - 0.03
    assert gov["gpu_seconds"] > 0.9 * static["gpu_seconds"]  # not cheaper by enough to be a trade


@pytest.mark.xfail(strict=True, reason="issue 17: the burst response does not hold on long runs (docs/benchmarks.md)")
def test_governor_holds_995_of_the_ceiling_on_the_long_burst_run(burst_3600: dict[str, dict[str, float]]) -> None:
    assert burst_3600["governor"]["attainment_over_ceiling"] >= 0.995
