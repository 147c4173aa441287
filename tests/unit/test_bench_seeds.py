"""``governor bench seeds``: seeds parsed strictly, summaries exact, runs the same as ``bench control``'s."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from typing import Any

import pytest

from bench.gains import gains_of, setup_of
from bench.seeds import markdown, parse_seeds, summarise


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
    assert "| step | 99.6" in table and "[99.00%-99.90%] / 3 of 4 / - / 120 / 10.0% [10.0%]" in table
    assert "1.40x (max 1.50x, 2 of 4 seeds)" in table


def test_the_pooled_share_counts_requests_and_the_noise_count_separates_short_from_unlucky() -> None:
    """Pooled: every seed's met requests over every seed's servable ones.  Seed 3 of Mooncake's
    replica-loss (2,121 requests, 96.65 % met, ceiling 97.22 %: 99.42 %, sd 0.17 points over its
    2,062 servable ones) is within two sd of 99.5 %; a seed at 97.94 % of the ceiling on 5,000
    requests (sd 0.20 points) is not."""
    rows = [
        {**_row(0, "governor", 0.9942, 100.0), "attainment": 0.9665, "ceiling": 0.9722, "requests": 2121},
        {**_row(1, "governor", 0.9794, 100.0), "attainment": 0.95, "ceiling": 0.97, "requests": 5000},
        {**_row(2, "governor", 0.999, 100.0), "attainment": 0.999, "ceiling": 1.0, "requests": 1000},
    ]
    (s,) = summarise(rows)
    g = s["strategies"]["governor"]
    met = 0.9665 * 2121 + 0.95 * 5000 + 0.999 * 1000
    servable = 0.9722 * 2121 + 0.97 * 5000 + 1.0 * 1000
    assert g["share_pooled"] == round(met / servable, 5) and g["at_target"] == 1 and g["within_noise"] == 2
    meta = {"trace": "t", "qps": 4, "duration_s": 60, "seeds": [0, 1, 2], "seeds_arg": "0-2",
            "strategies": ["governor"], "wall_s": 1.0}  # fmt: skip
    assert f"/ 1 of 3 (2) / {met / servable:.2%} / 100 /" in markdown(meta, [s])
    # one row without its counts: no pooled share rather than a share of part of the seeds
    (t,) = summarise([*rows, _row(3, "governor", 0.999, 100.0)])
    assert t["strategies"]["governor"]["share_pooled"] is None and t["strategies"]["governor"]["within_noise"] is None


def _cli(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "governor.cli", *args, "--json"], capture_output=True, text=True, check=True, timeout=600
    )
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def test_each_seed_is_the_bench_control_run_of_that_seed() -> None:
    """The command repeats ``bench control``: seed 1's rows are what ``bench control --seed 1`` prints."""
    common = ["--trace", "mooncake", "--scenario", "replica-loss", "--qps", "4", "--duration-s", "90"]
    seeds = _cli("bench", "seeds", *common, "--seeds", "0-1", "--strategies", "governor,static")
    one = _cli("bench", "control", *common, "--seed", "1", "--strategies", "governor,static", "--out", "/tmp/gv-seeds")
    runs = {(r["seed"], r["strategy"]): r for r in seeds["runs"]}
    assert sorted(runs) == [(0, "governor"), (0, "static"), (1, "governor"), (1, "static")]
    for s in one["strategies"]:
        mine = runs[(1, s["strategy"])]
        assert mine["gpu_seconds"] == s["gpu_seconds"] and mine["share"] == s["attainment_over_ceiling"]
        assert (mine["requests"], mine["attainment"], mine["ceiling"]) == (
            s["requests"],
            s["slo_attainment"],
            s["ceiling"],
        )  # what the pooled share is made of
    assert [sc["scenario"] for sc in seeds["scenarios"]] == ["replica-loss"]


def test_gains_reach_every_governor_run_and_are_named_in_the_output() -> None:
    """``--gain`` sets governor's gains as GOVERNOR_PID_GAINS would: the run changes, the output says so,
    and ``bench seeds`` with the gain is ``bench control`` with it."""
    # 240 s: long enough for the forecast to warm and the fleet to be reclaimed (in 90 s the shipped and
    # the lean plan both hold the warm-start fleet since a lift needs evidence beyond counting noise)
    common = ["--trace", "mooncake", "--scenario", "replica-loss", "--qps", "4", "--duration-s", "240"]
    ctl = ["bench", "control", *common, "--seed", "1", "--strategies", "governor,static", "--out", "/tmp/gv-seeds"]
    shipped = _cli(*ctl)
    lean = _cli(*ctl, "--gain", "ff_error_margin=0", "--gain", "ff_target_util=1.5")
    assert shipped["meta"]["gains"] == {} and lean["meta"]["gains"] == {
        "ff_error_margin": 0.0,
        "ff_target_util": 1.5,
    }
    by = {r["strategy"]: r for r in lean["strategies"]}
    was = {r["strategy"]: r for r in shipped["strategies"]}
    assert by["governor"]["gpu_seconds"] < was["governor"]["gpu_seconds"]  # a leaner plan, measured
    assert by["static"]["gpu_seconds"] == was["static"]["gpu_seconds"]  # the peers are not governor
    seeds = _cli("bench", "seeds", *common, "--seeds", "1", "--strategies", "governor,static",
                 "--gain", "ff_error_margin=0", "--gain", "ff_target_util=1.5")  # fmt: skip
    assert seeds["meta"]["gains"] == lean["meta"]["gains"]
    mine = {r["strategy"]: r for r in seeds["runs"]}
    assert mine["governor"]["gpu_seconds"] == by["governor"]["gpu_seconds"]
    table = markdown({**seeds["meta"], "seeds_arg": "1"}, seeds["scenarios"])
    assert "--gain ff_error_margin=0 --gain ff_target_util=1.5`" in table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bench", "control", "--gain", "ff_headroom=1.2"], "unknown gain 'ff_headroom' (known: kp, ki, kd"),
        (["bench", "seeds", "--gain", "ki"], "'ki': expected NAME=NUMBER"),
        (["bench", "seeds", "--gain", "ki=nan"], "'ki=nan': expected NAME=NUMBER"),
        (["bench", "frontier", "--gain", "ff_target_util=0.9"], "the frontier sweeps governor's headroom"),
    ],
)
def test_unusable_gains_are_refused_with_the_reason(args: list[str], message: str) -> None:
    out = subprocess.run([sys.executable, "-m", "governor.cli", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def test_the_command_a_table_prints_reruns_that_table() -> None:
    """The line above a seeds or frontier table names every setting the run changed (scenario,
    start-up, window, eps_ref, capacity error, strategies, gains), so pasting it reruns the same runs:
    parsed back by the CLI it gives the run's own arguments."""
    from bench import frontier as bench_frontier
    from governor.cli import build_parser

    argv = ["bench", "seeds", "--trace", "mooncake", "--scenario", "replay,diurnal", "--qps", "4",
            "--duration-s", "90", "--seeds", "1-2", "--strategies", "governor", "--startup-s", "45",
            "--window-s", "15", "--eps-ref", "0.01", "--capacity-error", "0.5",
            "--gain", "ff_error_margin=0.25"]  # fmt: skip
    args = build_parser().parse_args(argv)
    meta = {"trace": "mooncake", "qps": 4.0, "duration_s": 90.0, "seeds": [1, 2], "seeds_arg": "1-2",
            "strategies": ["governor"], "setup": setup_of(args), "gains": gains_of(args), "wall_s": 1.0}  # fmt: skip
    line = markdown(meta, []).splitlines()[0]
    again = build_parser().parse_args(shlex.split(line.split("`")[1])[1:])
    keys = ("trace", "scenario", "qps", "duration_s", "seeds", "strategies", "startup_s", "window_s", "eps_ref")
    assert [getattr(again, k) for k in keys] == [getattr(args, k) for k in keys]
    assert (again.capacity_error, gains_of(again)) == (args.capacity_error, gains_of(args))
    fargv = ["bench", "frontier", "--trace", "azure-conv", "--scenario", "step", "--startup-s", "60",
             "--strategies", "governor,static", "--gain", "kp=0.1"]  # fmt: skip
    fargs = build_parser().parse_args(fargv)
    fmeta = {"trace": "azure-conv", "qps": 20.0, "duration_s": 600.0, "seed": 0, "capacity_error": 1.0,
             "strategies": fargs.strategies, "setup": setup_of(fargs), "gains": gains_of(fargs), "wall_s": 1.0}  # fmt: skip
    fline = bench_frontier.markdown(fmeta, []).splitlines()[0]
    fagain = build_parser().parse_args(shlex.split(fline.split("`")[1])[1:])
    fkeys = ("scenario", "startup_s", "strategies", "window_s", "seed", "duration_s")
    assert [getattr(fagain, k) for k in fkeys] == [getattr(fargs, k) for k in fkeys]
    assert gains_of(fagain) == {"kp": 0.1}


def test_a_gain_the_controller_refuses_is_a_one_line_error_not_a_traceback() -> None:
    """``--gain`` checks the name and the number; the range is the controller's, refused by name."""
    out = subprocess.run(
        [sys.executable, "-m", "governor.cli", "bench", "control", "--trace", "mooncake", "--scenario", "replay",
         "--duration-s", "60", "--strategies", "governor", "--gain", "ff_lift_z=-1", "--out", "/tmp/gv-bad-gain"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "governor bench control: bad parameter: lift_z=-1.0: must be >= 0" in out.stderr
    assert "Traceback" not in out.stderr
