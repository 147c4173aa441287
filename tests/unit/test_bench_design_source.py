"""``governor bench design-source``: the design source's experiments (§3.1, §4.1, §4.4, §5) at a tiny
duration: the table's structure, the design source's column read from :data:`DESIGN_SOURCE`, and every
governor figure computed by the run (it moves with the input), not written down."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import numpy as np
import pytest

from bench import design_source as ds
from bench.commands import run_argv
from core.defaults import EPS_REF
from sim.fastloop import EPOCH_MS0, RunResult

Rows = list[dict[str, Any]]


def _args(duration_s: float, seed: int, section: str = "all") -> argparse.Namespace:
    return argparse.Namespace(
        duration_s=duration_s, sse_duration_s=1.5 * duration_s, seed=seed, seeds="", section=section, json=False
    )


@pytest.fixture(scope="module")
def two_runs() -> tuple[Rows, Rows]:
    return ds.measure(_args(40.0, 0)), ds.measure(_args(90.0, 1))


def _by_key(rows: Rows) -> dict[tuple[str, str], float]:
    return {(r["section"], r["key"]): r["governor"] for r in rows}


def test_every_row_of_every_section_with_the_design_source_beside(two_runs: tuple[Rows, Rows]) -> None:
    rows, _ = two_runs
    assert [(r["section"], r["key"]) for r in rows] == [
        (section, key) for section in ds.SECTIONS for key in ds.DESIGN_SOURCE[section]
    ]
    assert ds.SECTIONS == ("3.1", "4.1", "4.4", "5")
    for r in rows:
        src = ds.DESIGN_SOURCE[r["section"]][r["key"]]
        if src is None:  # a row of governor's own (e.g. GPU-seconds): nothing to print beside it
            assert r["design_source"] is None and r["quote"] is None
        else:
            assert (r["design_source"], r["quote"], r["source_unit"]) == (src.value, src.quote, src.unit)
            assert f"{src.value:g}" in src.quote  # the figure is the one its quote of the source gives
        assert r["governor"] is not None and math.isfinite(r["governor"]), r
    # the source's figures, as its sections report them
    figures = {(r["section"], r["key"]): r["design_source"] for r in rows}
    for start in ("need", "half"):  # both measures of the compensated loop, from either start
        for measure in ("eps", "fleet"):
            assert figures[("3.1", f"sse_20ms_comp_{start}_{measure}")] == 1.2
            assert figures[("3.1", f"sse_50ms_comp_{start}_{measure}")] == 3.8
            assert figures[("3.1", f"sse_20ms_plain_{start}_{measure}")] is None
    assert (figures[("4.1", "static_mean_ms")], figures[("4.1", "dynamic_completion")]) == (842.0, 93.7)
    assert (figures[("4.4", "without_p99_ms")], figures[("4.4", "with_error_rate")]) == (1120.0, 0.03)
    assert [figures[("5", f"{s}_attainment")] for s in ("static", "keda", "governor")] == [89.2, 95.7, 99.4]
    # the source's waste is beside the unused-capacity waste, not beside the busy-GPU one
    assert [figures[("5", f"{s}_waste_capacity")] for s in ("static", "keda", "governor")] == [63.0, 38.0, 11.0]
    assert all(figures[("5", f"{s}_waste_busy")] is None for s in ("static", "keda", "governor"))
    text = ds.table(rows)
    lines = text.splitlines()
    assert lines[0] == "| § | figure | governor | design source |"
    assert len([ln for ln in lines if ln.startswith("| ") and ln[2].isdigit()]) == len(rows)
    assert "| 5 | governor: SLO attainment |" in text and "| 99.4 % |" in text
    for section in ds.SECTIONS:  # a note for each section
        assert f"§{section}: {ds.NOTES[section]}" in text


def test_governor_figures_are_measured_not_constants(two_runs: tuple[Rows, Rows]) -> None:
    short, longer = two_runs
    for a, b in zip(short, longer, strict=True):
        if a["governor"] == b["governor"]:
            # the same figure at two durations and seeds only where it sits at its bound
            assert a["unit"] == "%" and a["governor"] in (0.0, 100.0), (a, b)
        else:
            assert a["governor"] != (a["design_source"] or math.nan)
    moved = sum(a["governor"] != b["governor"] for a, b in zip(short, longer, strict=True))
    # at these inputs: the six runs from the needed fleet that hold it (0 %), the gray release's 100 % and
    # 0 errors, KEDA's 100 %
    assert moved >= len(short) - 10


def test_the_command_prints_json_for_the_sections_asked(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_argv(["design-source", "--section", "4.1", "--duration-s", "40", "--seeds", "0,1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["seeds"] == [0, 1] and {r["section"] for r in out["rows"]} == {"4.1"}
    for r in out["rows"]:
        assert len(r["per_seed"]) == 2 and r["governor"] == pytest.approx(sum(r["per_seed"]) / 2)
    with pytest.raises(SystemExit):
        run_argv(["design-source", "--section", "3.3"])  # printed by bench bandwidth, not here


def test_the_big_bang_release_is_calibrated_to_the_source_s(two_runs: tuple[Rows, Rows]) -> None:
    for rows in two_runs:
        got = _by_key(rows)
        # the bad version's error probability gives the source's 1.27 % of all requests in expectation: it
        # is 1.27 % over the share the big-bang sends to v2 (after the release's start at 30 s)
        assert got[("4.4", "v2_error_prob")] > 1.27
        assert ds.FACTOR_RANGE[0] < got[("4.4", "v2_ttft_factor")] < ds.FACTOR_RANGE[1]
        assert got[("4.4", "without_error_rate")] == pytest.approx(1.27, abs=0.5)  # a few thousand requests
        ratio = got[("4.4", "without_p99_ms")] / got[("4.4", "with_p99_ms")]
        assert 2.0 < ratio < 5.0  # the source's 1120 / 342 = 3.3, to the bisection's resolution
        # ... where the severe version melts the big-bang release down
        assert got[("4.4", "severe_without_p99_ms")] > 10 * got[("4.4", "without_p99_ms")]
        assert got[("4.4", "severe_without_attainment")] < got[("4.4", "without_attainment")]


def test_steady_state_rows_from_the_needed_fleet_and_from_half(two_runs: tuple[Rows, Rows]) -> None:
    _, longer = two_runs
    got = _by_key(longer)
    for tag, _ in ds.SSE_DELAYS:
        for comp in ("comp", "plain"):
            key = f"sse_{tag}_{comp}"
            # from the fleet that meets eps_ref the loop stays under it; from half it violates at least as much
            assert got[("3.1", f"{key}_need_eps")] <= 0.0
            assert got[("3.1", f"{key}_need_eps")] <= got[("3.1", f"{key}_half_eps")]
            assert got[("3.1", f"{key}_need_eps")] >= -100.0 * EPS_REF  # points: the rate is >= 0


def _result(ready: list[int], arrivals_s: list[float]) -> RunResult:
    finished = [{"arrival_ms": EPOCH_MS0 + 1000.0 * a} for a in arrivals_s]
    t_s = np.arange(1.0, len(ready) + 1.0)
    return RunResult("x", {}, {"t_s": t_s, "az-a.ready": np.array(ready)}, [], finished, [])


def test_capacity_waste_is_the_unused_share_of_the_ready_capacity() -> None:
    # 5 ready replicas of 2 req/s for 100 s: 1,000 requests of capacity, 100 per 10 s window
    quiet = [i / 2.0 for i in range(100)]  # 2 req/s for 50 s: 20 % of the capacity, 80 % unused
    rush = [50.0 + i / 20.0 for i in range(1000)]  # 20 req/s for 50 s: twice the capacity, nothing unused
    waste = ds.capacity_waste(_result([5] * 100, quiet + rush), 2.0, 10.0)
    assert waste == pytest.approx(0.5 * 0.8)  # an overloaded window does not make up for an idle one
    assert ds.capacity_waste(_result([5] * 100, []), 2.0, 10.0) == 1.0  # nothing served: all unused
    # a fleet that follows the load: 1 replica in the quiet half, 10 in the rush
    assert ds.capacity_waste(_result([1] * 50 + [10] * 50, quiet + rush), 2.0, 10.0) == pytest.approx(0.0)
    assert ds.capacity_waste(_result([10] * 100, rush), 2.0, 10.0) == pytest.approx(0.5)
