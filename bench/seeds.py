"""``governor bench seeds``: governor, static and the oracle over several seeds, every scenario.

One seed is one draw: the seed moves the fleet's service-time jitter, the
zone each request lands in and the capacity profile (profiled per seed, as
each seed's fleet is a different draw of the same hardware), and a
scenario's attainment moves with it by up to several points on the 600 s
runs (Azure burst 97.1-99.5 % at the default headroom over seeds 0-3).  A
claim about a controller should hold over seeds, so this command repeats
``governor bench control`` for each seed and scenario (the same runs, the same
code path, :func:`bench.control.run_all`) and reports per scenario
and strategy the mean and range of attainment as a share of the ceiling,
GPU-seconds and waste, how many seeds reach 99.5 % of the ceiling and, per
seed where both reach it, governor's GPU-seconds over the oracle's (the
oracle is :func:`sim.oracle.tuned_oracle`: the cheapest headroom of its grid
that reaches 99.5 % of the ceiling).

A count of seeds at 99.5 % is coarse on short runs: a 600 s Mooncake run
serves ~2,060 requests in time on an unbounded fleet, so one request is
0.05 points of the ceiling and a run's share scatters by ~0.17 points
(binomial) around what the controller holds on that workload.  So the
summary also pools the seeds (every seed's requests that met the SLO over
those the ceiling says an unbounded fleet serves in time: the share of the
ceiling over all of them at once) and counts the seeds within two binomial
sd of the target (:func:`share_sd`): a seed short of the target but within
that is short by its own counting noise, one beyond it is short.

>>> rows = [
...     {"scenario": "replay", "seed": 0, "strategy": "governor", "share": 0.999, "gpu_seconds": 120.0, "waste": 0.1},
...     {"scenario": "replay", "seed": 0, "strategy": "oracle", "share": 0.998, "gpu_seconds": 100.0, "waste": 0.1},
...     {"scenario": "replay", "seed": 1, "strategy": "governor", "share": 0.990, "gpu_seconds": 110.0, "waste": 0.2},
...     {"scenario": "replay", "seed": 1, "strategy": "oracle", "share": 0.997, "gpu_seconds": 90.0, "waste": 0.1},
... ]
>>> s = summarise(rows)
>>> g = s[0]["strategies"]["governor"]
>>> g["share_mean"], g["share_min"], g["at_target"], round(s[0]["governor_over_oracle_mean"], 2)
(0.9945, 0.99, 1, 1.2)
>>> g["share_pooled"], g["within_noise"]  # rows without request counts: no pooled share, no noise
(None, None)
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.control import add_capacity_error, base_config, run_all, strategy_names
from bench.frontier import TARGET_SHARE, TRACE_QPS
from bench.gains import add_gain, gain_flags, gains_of, publish, setup_flags, setup_of
from sim.profiling import profile
from sim.scenarios import SCENARIOS, scenario_list
from sim.traces import load_trace

__all__ = [
    "DEFAULT_STRATEGIES",
    "NOISE_SD",
    "add_parser",
    "markdown",
    "parse_seeds",
    "pooled",
    "run_seeds",
    "share_sd",
    "summarise",
]

DEFAULT_STRATEGIES = ("governor", "static", "oracle")
MAX_SEEDS = 64


def parse_seeds(text: str) -> list[int]:
    """``"0-4"``, ``"0,2,7"`` or a mix, as a sorted list of distinct seeds (``SystemExit`` when unusable).

    >>> parse_seeds("0-2,7"), parse_seeds("3")
    ([0, 1, 2, 7], [3])
    """
    seeds: set[int] = set()
    try:
        for part in (p.strip() for p in text.split(",")):
            lo, _, hi = part.partition("-")
            a, b = int(lo), int(hi) if hi else int(lo)
            if a < 0 or b < a:
                raise ValueError(part)
            seeds.update(range(a, b + 1))
    except ValueError:
        raise SystemExit(f"--seeds {text!r}: give seeds >= 0 as N, N-M or a comma list of them") from None
    if len(seeds) > MAX_SEEDS:
        raise SystemExit(f"--seeds {text!r}: at most {MAX_SEEDS} seeds")
    return sorted(seeds)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


NOISE_SD = 2.0  # a seed within this many binomial sd of the target is short by its own counting noise


def share_sd(share: float, requests: int, ceiling: float) -> float:
    """The binomial sd of a run's share ``s`` of the ceiling: ``sqrt(s (1 - s) / (ceiling x requests))``.

    The requests the ceiling fails miss on every run (their prefill alone is
    over the SLO): they carry no noise.  The ``ceiling x requests`` servable
    ones each meet the SLO or not, the share of them that do is ``s``.

    >>> round(share_sd(0.9942, 2121, 0.9722), 5)  # Mooncake replica-loss, seed 3: 99.42 % +- 0.17 points
    0.00167
    >>> share_sd(1.0, 100, 1.0), share_sd(0.9, 0, 1.0)
    (0.0, 0.0)
    """
    m = ceiling * requests
    if m <= 0:
        return 0.0
    p = min(max(share, 0.0), 1.0)
    return math.sqrt(p * (1.0 - p) / m)


def pooled(rows: Sequence[Mapping[str, Any]]) -> tuple[float | None, int | None]:
    """The seeds' pooled share of the ceiling and how many are within :data:`NOISE_SD` sd of the
    target (None, None when a row lacks its ``requests``, ``attainment`` or ``ceiling``).

    >>> rows = [{"share": 0.9942, "attainment": 0.9665, "ceiling": 0.9722, "requests": 2121},
    ...         {"share": 0.999, "attainment": 0.9712, "ceiling": 0.9722, "requests": 2000}]
    >>> share, within = pooled(rows); round(share, 4), within
    (0.9965, 2)
    """
    if not rows or any(r.get(k) is None for r in rows for k in ("requests", "attainment", "ceiling")):
        return None, None
    met = sum(float(r["attainment"]) * int(r["requests"]) for r in rows)
    servable = sum(float(r["ceiling"]) * int(r["requests"]) for r in rows)
    within = sum(
        1
        for r in rows
        if float(r["share"]) + NOISE_SD * share_sd(float(r["share"]), int(r["requests"]), float(r["ceiling"]))
        >= TARGET_SHARE
    )
    return (met / servable if servable > 0 else None), within


def summarise(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per scenario (in first-seen order): each strategy's mean / min / max share of the ceiling,
    mean GPU-seconds, mean / max waste, seeds at 99.5 % of the ceiling and, where the rows carry
    their request counts, the pooled share and the seeds within counting noise of the target
    (:func:`pooled`); governor over the oracle on the seeds where both reach it."""
    out: list[dict[str, Any]] = []
    for sc in dict.fromkeys(r["scenario"] for r in rows):
        mine = [r for r in rows if r["scenario"] == sc]
        strategies: dict[str, dict[str, Any]] = {}
        for name in dict.fromkeys(r["strategy"] for r in mine):
            rs = [r for r in mine if r["strategy"] == name]
            shares = [float(r["share"]) for r in rs]
            wastes = [float(r["waste"]) for r in rs if r["waste"] is not None]
            share_pooled, within = pooled(rs)
            strategies[name] = {
                "seeds": len(rs),
                "share_mean": round(_mean(shares), 5),
                "share_min": round(min(shares), 5),
                "share_max": round(max(shares), 5),
                "gpu_seconds_mean": round(_mean([float(r["gpu_seconds"]) for r in rs]), 1),
                "waste_mean": round(_mean(wastes), 4) if wastes else None,
                "waste_max": round(max(wastes), 4) if wastes else None,
                "at_target": sum(1 for v in shares if v >= TARGET_SHARE),
                "share_pooled": None if share_pooled is None else round(share_pooled, 5),
                "within_noise": within,  # seeds at the target or short of it by their counting noise
                **_reversal_stats(rs),
            }
        by_seed = {(r["seed"], r["strategy"]): r for r in mine}
        ratios = [
            float(g["gpu_seconds"]) / float(o["gpu_seconds"])
            for seed in dict.fromkeys(r["seed"] for r in mine)
            if (g := by_seed.get((seed, "governor"))) is not None
            and (o := by_seed.get((seed, "oracle"))) is not None
            and g["share"] >= TARGET_SHARE
            and o["share"] >= TARGET_SHARE
            and float(o["gpu_seconds"]) > 0
        ]
        out.append(
            {
                "scenario": sc,
                "strategies": strategies,
                "governor_over_oracle_mean": round(_mean(ratios), 3) if ratios else None,
                "governor_over_oracle_max": round(max(ratios), 3) if ratios else None,
                "seeds_both_at_target": len(ratios),
            }
        )
    return out


def _reversal_stats(rs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean and max reversals (direction changes of the desired count, summed over the zones) of the
    rows that carry them; rows without (older JSON) give None."""
    revs = [int(r["reversals"]) for r in rs if r.get("reversals") is not None]
    return {
        "reversals_mean": round(_mean(revs), 2) if revs else None,
        "reversals_max": max(revs) if revs else None,
    }


def markdown(meta: Mapping[str, Any], summary: Sequence[Mapping[str, Any]]) -> str:
    """The summary as a markdown table (what docs/benchmarks.md shows)."""
    names = list(meta["strategies"])
    n = len(meta["seeds"])
    head = (
        f"`governor bench seeds --trace {Path(str(meta['trace'])).name} --qps {meta['qps']:g} "
        f"--duration-s {meta['duration_s']:g} --seeds {meta['seeds_arg']}"
        + (f" --strategies {','.join(names)}" if tuple(names) != DEFAULT_STRATEGIES else "")
        + setup_flags(meta.get("setup", {}))
        + gain_flags(meta.get("gains", {}))
        + f"` ({meta['wall_s']:.0f} s)\n\n"
        "| scenario | "
        + " | ".join(
            f"{s}: of ceiling, mean [range] / seeds at 99.5 % (within 2 sd) / pooled / GPU-s / waste [max] "
            "/ reversals [max]"
            for s in names
        )
        + " | governor / oracle where both reach it |\n|---|"
        + "---|" * (len(names) + 1)
        + "\n"
    )
    rows = []
    for s in summary:
        cells = []
        for name in names:
            v = s["strategies"].get(name)
            if v is None:
                cells.append("-")
                continue
            waste = "-" if v["waste_mean"] is None else f"{v['waste_mean']:.1%} [{v['waste_max']:.1%}]"
            within = "" if v.get("within_noise") is None else f" ({v['within_noise']})"
            pool = "-" if v.get("share_pooled") is None else f"{v['share_pooled']:.2%}"
            revs = "-" if v.get("reversals_mean") is None else f"{v['reversals_mean']:g} [{v['reversals_max']}]"
            cells.append(
                f"{v['share_mean']:.2%} [{v['share_min']:.2%}-{v['share_max']:.2%}] / {v['at_target']} of {n}{within} "
                f"/ {pool} / {v['gpu_seconds_mean']:,.0f} / {waste} / {revs}"
            )
        ratio = (
            "-"
            if s["governor_over_oracle_mean"] is None
            else f"{s['governor_over_oracle_mean']:.2f}x (max {s['governor_over_oracle_max']:.2f}x, "
            f"{s['seeds_both_at_target']} of {n} seeds)"
        )
        rows.append(f"| {s['scenario']} | " + " | ".join(cells) + f" | {ratio} |")
    return head + "\n".join(rows) + "\n"


def run_seeds(args: argparse.Namespace) -> int:
    wall0 = time.perf_counter()
    trace = load_trace(args.trace)
    tname = Path(str(args.trace)).name
    if not args.qps:
        args.qps = TRACE_QPS.get(tname, 20.0)
    seeds = parse_seeds(args.seeds)
    scenarios, unknown = scenario_list(args.scenario)
    if unknown:
        raise SystemExit(f"unknown scenarios {unknown}; choose from {SCENARIOS}")
    names = strategy_names(args.strategies)
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        run_args = argparse.Namespace(**{**vars(args), "seed": seed, "strategies": ",".join(names)})
        capacity, headroom = profile(trace, base_config(run_args))  # each seed's fleet is profiled
        for sc in scenarios:
            run_args.scenario = sc
            results, meta = run_all(run_args, trace, capacity, headroom)
            for r in results:
                share = r.metrics.get("attainment_over_ceiling")
                rows.append(
                    {
                        "scenario": sc,
                        "seed": seed,
                        "strategy": r.strategy,
                        "share": 0.0 if share is None else share,
                        "gpu_seconds": r.metrics["gpu_seconds"],
                        "waste": r.metrics.get("waste"),
                        "attainment": r.metrics.get("slo_attainment"),
                        "ceiling": r.metrics.get("ceiling"),
                        "requests": r.metrics.get("requests"),  # finished: the attainment's denominator
                        "reversals": r.metrics.get("reversals"),
                        "replica_capacity_rps": meta["replica_capacity_rps"],
                        "replica_headroom": meta["replica_headroom"],
                    }
                )
            if not args.json:
                line = "  ".join(f"{r.strategy} {r.metrics.get('attainment_over_ceiling') or 0:.2%}" for r in results)
                print(
                    f"seed {seed} {sc:<13} capacity {meta['replica_capacity_rps']} headroom {meta['replica_headroom']}  {line}"
                )
                sys.stdout.flush()
    summary = summarise(rows)
    meta_out = {
        "trace": str(args.trace),
        "qps": args.qps,
        "duration_s": args.duration_s,
        "seeds": seeds,
        "seeds_arg": args.seeds,
        "strategies": names,
        "target_share_of_ceiling": TARGET_SHARE,
        "setup": setup_of(args),
        "gains": gains_of(args),
        "wall_s": round(time.perf_counter() - wall0, 1),
    }
    publish(args, markdown(meta_out, summary), {"meta": meta_out, "runs": rows, "scenarios": summary})
    return 0


def add_parser(sub: Any) -> None:
    bs = sub.add_parser("seeds", help="governor, static and the oracle over several seeds and every scenario")
    bs.add_argument("--trace", default="azure-conv", help="trace name (azure-conv, mooncake) or file path")
    bs.add_argument("--scenario", default="all", help="a scenario, comma-separated ones, or 'all'")
    bs.add_argument("--qps", type=float, default=0.0, help="base rate (0 = azure-conv 20, mooncake 4, else 20)")
    bs.add_argument("--duration-s", type=float, default=600.0)
    bs.add_argument("--seeds", default="0-4", help="N, N-M or a comma list of them (default 0-4)")
    bs.add_argument(
        "--strategies",
        default=",".join(DEFAULT_STRATEGIES),
        help="comma-separated strategies of bench control (default: governor,static,oracle)",
    )
    bs.add_argument("--startup-s", type=float, default=30.0)
    bs.add_argument("--window-s", type=float, default=10.0)
    bs.add_argument("--eps-ref", type=float, default=0.02)
    add_capacity_error(bs)
    add_gain(bs)
    bs.add_argument("--json", action="store_true")
    bs.add_argument("--markdown", default="", help="append the summary table, as markdown, to this file")
