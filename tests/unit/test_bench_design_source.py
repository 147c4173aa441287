"""``governor bench design-source``: the design source's experiments (§3.1, §4.1, §4.4, §5) at a tiny
duration: the table's structure, the design source's column read from :data:`DESIGN_SOURCE`, and every
governor figure computed by the run (it moves with the input), not written down."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import pytest

from bench import design_source as ds
from bench.commands import run_argv

Rows = list[dict[str, Any]]


def _args(duration_s: float, seed: int, section: str = "all") -> argparse.Namespace:
    return argparse.Namespace(duration_s=duration_s, seed=seed, seeds="", section=section, json=False)


@pytest.fixture(scope="module")
def two_runs() -> tuple[Rows, Rows]:
    return ds.measure(_args(40.0, 0)), ds.measure(_args(90.0, 1))


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
            assert (r["design_source"], r["quote"], r["unit"]) == (src.value, src.quote, src.unit)
            assert f"{src.value:g}" in src.quote  # the figure is the one its quote of the source gives
        assert r["governor"] is not None and math.isfinite(r["governor"]), r
    # the source's figures, as its sections report them
    figures = {(r["section"], r["key"]): r["design_source"] for r in rows}
    assert figures[("3.1", "sse_20ms_comp")] == 1.2 and figures[("3.1", "sse_50ms_comp")] == 3.8
    assert (figures[("4.1", "static_mean_ms")], figures[("4.1", "dynamic_completion")]) == (842.0, 93.7)
    assert (figures[("4.4", "without_p99_ms")], figures[("4.4", "with_error_rate")]) == (1120.0, 0.03)
    assert [figures[("5", f"{s}_attainment")] for s in ("static", "keda", "governor")] == [89.2, 95.7, 99.4]
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
    assert moved >= len(short) - 3  # at these inputs: the gray release's 0 errors, KEDA's 100 %


def test_the_command_prints_json_for_the_sections_asked(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_argv(["design-source", "--section", "4.1", "--duration-s", "40", "--seeds", "0,1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["seeds"] == [0, 1] and {r["section"] for r in out["rows"]} == {"4.1"}
    for r in out["rows"]:
        assert len(r["per_seed"]) == 2 and r["governor"] == pytest.approx(sum(r["per_seed"]) / 2)
    with pytest.raises(SystemExit):
        run_argv(["design-source", "--section", "3.3"])  # printed by bench bandwidth, not here
