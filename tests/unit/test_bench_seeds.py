"""``governor bench seeds``: seeds parsed strictly, summaries exact, runs the same as ``bench control``'s."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from governor.bench_seeds import markdown, parse_seeds, summarise


@pytest.mark.parametrize("text", ["", "a", "3-1", "-2", "0-100", "1,,2"])
def test_unusable_seed_lists_are_refused(text: str) -> None:
    with pytest.raises(SystemExit, match="--seeds"):
        parse_seeds(text)


def test_seed_lists_and_ranges_merge_sorted_and_distinct() -> None:
    assert parse_seeds("4,0-2,2") == [0, 1, 2, 4]


def _row(seed: int, strategy: str, share: float, gpu: float, waste: float | None = 0.1) -> dict[str, object]:
    return {"scenario": "step", "seed": seed, "strategy": strategy, "share": share, "gpu_seconds": gpu, "waste": waste}


def test_the_oracle_ratio_counts_only_seeds_where_both_reach_the_target() -> None:
    rows = [
        _row(0, "governor", 0.999, 150.0),
        _row(0, "oracle", 0.996, 100.0),  # both at target: 1.5x
        _row(1, "governor", 0.990, 90.0),  # governor misses: not a ratio
        _row(1, "oracle", 0.999, 100.0),
        _row(2, "governor", 0.998, 110.0),
        _row(2, "oracle", 0.994, 50.0),  # the oracle misses: not a ratio
        _row(3, "governor", 0.998, 130.0, None),
        _row(3, "oracle", 0.997, 100.0),  # 1.3x
    ]
    (s,) = summarise(rows)
    g = s["strategies"]["governor"]
    assert (g["seeds"], g["at_target"], g["share_min"], g["share_max"]) == (4, 3, 0.99, 0.999)
    assert g["gpu_seconds_mean"] == 120.0 and g["waste_mean"] == 0.1  # the seed without a waste is left out
    assert (s["governor_over_oracle_mean"], s["governor_over_oracle_max"], s["seeds_both_at_target"]) == (1.4, 1.5, 2)
    meta = {"trace": "t", "qps": 4, "duration_s": 60, "seeds": [0, 1, 2, 3], "seeds_arg": "0-3",
            "strategies": ["governor", "oracle"], "wall_s": 1.0}  # fmt: skip
    table = markdown(meta, [s])
    assert "| step | 99.6" in table and "[99.00%-99.90%] / 3 of 4 / 120 / 10.0% [10.0%]" in table
    assert "1.40x (max 1.50x, 2 of 4 seeds)" in table


def _cli(*args: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "governor.cli", *args, "--json"], capture_output=True, text=True, check=True, timeout=600
    )
    return json.loads(out.stdout)


def test_each_seed_is_the_bench_control_run_of_that_seed() -> None:
    """The command repeats ``bench control``: seed 1's rows are what ``bench control --seed 1`` prints."""
    common = ["--trace", "mooncake", "--scenario", "replica-loss", "--qps", "4", "--duration-s", "90"]
    seeds = _cli("bench", "seeds", *common, "--seeds", "0-1", "--strategies", "governor,static")
    one = _cli("bench", "control", *common, "--seed", "1", "--strategies", "governor,static", "--out", "/tmp/gv-seeds")
    runs = {(r["seed"], r["strategy"]): r for r in seeds["runs"]}  # type: ignore[index]
    assert sorted(runs) == [(0, "governor"), (0, "static"), (1, "governor"), (1, "static")]
    for s in one["strategies"]:  # type: ignore[attr-defined]
        mine = runs[(1, s["strategy"])]
        assert mine["gpu_seconds"] == s["gpu_seconds"] and mine["share"] == s["attainment_over_ceiling"]
    assert [sc["scenario"] for sc in seeds["scenarios"]] == ["replica-loss"]  # type: ignore[index]
