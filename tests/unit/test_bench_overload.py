"""``governor bench overload``: the profile fleet's attainment around its capacity, from the profile's own trials."""

from __future__ import annotations

import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from bench.control import base_config
from bench.overload import parse_factors
from sim.profiling import overload_curve, replica_capacity_rps
from sim.traces import load_trace


def test_the_curve_at_1x_is_what_the_profile_accepted_and_past_it_attainment_falls() -> None:
    trace = load_trace("azure-conv")
    cfg = base_config(Namespace(trace="azure-conv", startup_s=30.0, seed=0, window_s=10.0))
    capacity = replica_capacity_rps(trace, cfg, replicas=2, duration_s=60.0, min_requests=300, iters=8)
    idle, points = overload_curve(trace, cfg, capacity, (0.8, 1.0, 2.0), replicas=2, duration_s=60.0, min_requests=300)
    share = {f: s for f, _, s in points}
    assert idle == pytest.approx(1.0, abs=0.01)
    assert share[1.0] >= 0.98 - 0.01  # the bisection accepted this rate at the profile's target
    assert share[0.8] >= share[1.0] > share[2.0]
    assert share[2.0] < 0.5  # twice what the replicas serve: most requests miss or are never served


@pytest.mark.parametrize("text", ["", "a", "0", "-1,1", "1,nan", ",".join(["1"] * 13)])
def test_unusable_factors_are_refused(text: str) -> None:
    with pytest.raises(SystemExit, match="--factors"):
        parse_factors(text)


def test_cli_json_names_each_seeds_capacity_and_points() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "governor.cli", "bench", "overload", "--trace", "mooncake", "--seeds", "1",
         "--factors", "1,1.3", "--json"],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    doc = json.loads(out.stdout)
    (row,) = doc["seeds"]
    assert row["seed"] == 1 and row["capacity_rps"] > 0 and [p["factor"] for p in row["points"]] == [1.0, 1.3]
    assert doc["meta"]["ttft_slo_ms"] == 6000.0 and 0 < row["idle_attainment"] <= 1
    assert 1.0 <= row["headroom"] <= 1.25  # the profile's, on Mooncake's slope


@pytest.mark.parametrize("bench", ["overload", "seeds", "control", "frontier"])
def test_a_trace_that_does_not_exist_is_a_one_line_error_not_a_traceback(bench: str, tmp_path: Path) -> None:
    bad = tmp_path / "nope.csv"
    out = subprocess.run(
        [sys.executable, "-m", "governor.cli", "bench", bench, "--trace", str(bad)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert f"governor bench {bench}: bad trace: {bad}" in out.stderr and "Traceback" not in out.stderr
