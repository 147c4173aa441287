"""Feasible region (sim/region.py, docs/model.md (region)): hull volumes of known sets, the
over-estimate on a non-convex set, coverage of a tiny fast run, and the CLI."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from governor.cli import main
from sim.region import RegionConfig, RegionError, analyse, hull_volume, inside_hull, sample

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("points", "volume"),
    [
        # the unit square with an interior point: area 1
        ([[0, 0], [1, 0], [0, 1], [1, 1], [0.3, 0.6]], 1.0),
        # the unit cube's 8 corners: volume 1
        (list(itertools.product([0, 1], repeat=3)), 1.0),
        # a right triangle with legs 2 and 3: area 3
        ([[0, 0], [2, 0], [0, 3]], 3.0),
        # the 4-D unit simplex: volume 1 / 4! = 1 / 24
        ([[0, 0, 0, 0], *np.eye(4).tolist()], 1 / 24),
        # too few points, or flat: no volume
        ([[0, 0], [1, 1]], 0.0),
        ([[0, 0], [1, 1], [2, 2], [3, 3]], 0.0),
    ],
)
def test_hull_volume_of_known_sets(points: list[Any], volume: float) -> None:
    assert hull_volume(np.array(points, dtype=float)) == pytest.approx(volume, abs=1e-12)


def test_inside_hull_counts_the_boundary_and_a_flat_hull_holds_only_its_points() -> None:
    sq = np.array([[0, 0], [1, 0], [0, 1], [1, 1]], dtype=float)
    q = np.array([[0.5, 0.5], [1.0, 0.5], [1.01, 0.5], [-0.01, 0.0]])
    assert inside_hull(sq, q).tolist() == [True, True, False, False]
    line = np.array([[0, 0], [1, 1]], dtype=float)
    assert inside_hull(line, np.array([[1, 1], [0.5, 0.5]])).tolist() == [True, False]


def test_the_over_estimate_of_a_non_convex_feasible_set() -> None:
    # A 5 x 5 grid; feasible: an L (x == 0 or y == 0). Its hull is the triangle x + y <= 4, which
    # holds the L's 9 points and the 6 infeasible points with x, y >= 1 and x + y <= 4.
    pts = np.array([[x, y] for x in range(5) for y in range(5)], dtype=float)
    ok = (pts[:, 0] == 0) | (pts[:, 1] == 0)
    out = analyse(pts, ok)
    assert out["feasible"] == 9 and out["inside_hull"] == 15
    assert out["hull_overestimate"] == pytest.approx(6 / 15)
    assert out["coverage"] == pytest.approx(0.5)  # triangle area 8 over the box's 16
    # A convex feasible set (a lower-left square) is not over-estimated.
    sq = analyse(pts, (pts[:, 0] <= 2) & (pts[:, 1] <= 2))
    assert sq["hull_overestimate"] == 0.0 and sq["coverage"] == pytest.approx(0.25)


def test_an_axis_with_one_value_is_left_out_of_the_hull() -> None:
    pts = np.array([[x, y, 7.0] for x in (0, 1) for y in (0, 1)], dtype=float)
    out = analyse(pts, np.ones(4, dtype=bool))
    assert out["coverage"] == pytest.approx(1.0) and out["projections"]["0,2"] == 0.0
    with pytest.raises(RegionError):
        analyse(np.zeros((0, 2)), np.zeros(0, dtype=bool))


def test_coverage_of_a_tiny_fast_run() -> None:
    # 1 or 4 replicas per zone at 2 or 20 req/s, the trace's own lengths, 20 s per point.
    cfg = RegionConfig(replicas=(1, 4), rate_rps=(2.0, 20.0), prompt_scale=(1.0,), output_scale=(1.0,), duration_s=20.0)
    res = sample(cfg)
    assert res.points.shape == (4, 4)
    by = {(int(p[0]), round(p[1]) > 10): bool(f) for p, f in zip(res.points, res.feasible, strict=True)}
    # One replica per zone cannot carry 20 req/s; four carry 2 req/s.
    assert by[(1, True)] is False and by[(4, False)] is True
    assert np.all(res.violation_rate[res.feasible] <= cfg.eps_ref)
    assert np.all(res.violation_rate[~res.feasible] > cfg.eps_ref)
    # Coverage is the hull of the feasible points in the normalised (replicas, rate) square.
    unit = (res.points[:, :2] - res.points[:, :2].min(0)) / np.ptp(res.points[:, :2], axis=0)
    assert res.analysis["coverage"] == pytest.approx(hull_volume(unit[res.feasible]))
    assert 0.0 <= res.analysis["coverage"] < 1.0


@pytest.mark.parametrize(
    "kw",
    [
        {"replicas": ()},
        {"rate_rps": (float("nan"),)},
        {"prompt_scale": (-1.0,)},
        {"replicas": (1.5,)},
        {"replicas": (1000,)},
        {"duration_s": 0.0},
        {"rate_rps": tuple(range(1, 101)), "replicas": tuple(range(1, 61))},  # over MAX_POINTS
    ],
)
def test_bad_config_is_a_clear_error(kw: dict[str, Any]) -> None:
    with pytest.raises(RegionError):
        RegionConfig(**kw)


TINY = ["--replicas", "1,4", "--rates", "2,20", "--prompt-scales", "1", "--output-scales", "1", "--duration-s", "20"]


def test_cli_prints_the_region_and_draws_the_projections(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "region", *TINY, "--png", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "coverage (hull volume / sampled box)" in out and "hull over-estimate" in out and "current fleet" in out
    png = tmp_path / "out" / "region.png"
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000
    assert main(["analyze", "region", *TINY, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["points"] == 4 and len(data["samples"]) == 4 and set(data["current"]) >= {"feasible", "inside_hull"}


@pytest.mark.parametrize(
    "extra",
    [
        ["--rates", "0"],
        ["--replicas", "0"],
        ["--duration-s", "-5"],
        ["--trace", "/nonexistent.jsonl"],
        ["--current-rate", "nan"],
        ["--current-replicas", "100000"],
    ],
)
def test_cli_exits_2_on_bad_input(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", "region", *TINY, *extra]) == 2
    assert "governor analyze region:" in capsys.readouterr().err
