"""``governor bench overload``: what running past the profiled capacity costs, per trace and seed.

``bench control`` sizes every strategy from one number, the profiled replica
capacity (:func:`sim.profiling.replica_capacity_rps`: the rate at which the
profile fleet keeps 98 % attainment, or one point under what an idle fleet
reaches).  The headroom a controller needs above that number depends on the
curve around it: where attainment falls off a cliff just past the capacity,
a replica short for one start-up costs violations at once; where it slopes,
the queue and the batches absorb the shortfall.  This command prints that
curve: the profile fleet's attainment, as a share of the idle fleet's, at
load factors around the capacity, each trial the profile's own, and the
headroom the feedforward plans with on that curve
(:func:`sim.profiling.replica_headroom`: 1.25 over the factor where the
share falls to 95 %).

>>> meta = {"trace": "azure-conv", "seeds_arg": "0", "factors": [1.0, 1.1], "replicas": 4, "wall_s": 3.0}
>>> rows = [{"seed": 0, "capacity_rps": 3.1, "idle_attainment": 1.0, "headroom": 1.245,
...          "points": [{"factor": 1.0, "attainment": 0.986, "share": 0.986},
...                     {"factor": 1.1, "attainment": 0.22, "share": 0.22}]}]
>>> print(markdown(meta, rows))  # doctest: +NORMALIZE_WHITESPACE
`governor bench overload --trace azure-conv --seeds 0 --factors 1,1.1` (3 s)
<BLANKLINE>
| seed | capacity, req/s per replica | idle attainment | headroom | share of idle at 1x | 1.1x |
|---|---:|---:|---:|---:|---:|
| 0 | 3.100 | 100.00% | 1.245 | 98.60% | 22.00% |
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.control import base_config
from bench.gains import publish
from bench.seeds import parse_seeds
from sim.profiling import (
    PROFILE_DURATION_S,
    PROFILE_MIN_REQUESTS,
    idle_attainment,
    overload_curve,
    replica_capacity_rps,
    replica_headroom,
)
from sim.traces import load_trace

DEFAULT_FACTORS = "0.9,1,1.05,1.1,1.2,1.3"


def parse_factors(text: str) -> tuple[float, ...]:
    """``"0.9,1,1.1"`` as load factors (positive, finite, at most 12; ``SystemExit`` otherwise).

    >>> parse_factors("1, 1.2")
    (1.0, 1.2)
    """
    try:
        out = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"--factors {text!r}: give a comma list of numbers, e.g. {DEFAULT_FACTORS}") from None
    if not out or len(out) > 12 or any(not math.isfinite(f) or f <= 0.0 or f > 20.0 for f in out):
        raise SystemExit(f"--factors {text!r}: 1 to 12 load factors in (0, 20]")
    return out


def markdown(meta: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    """The curve per seed as a markdown table (what docs/benchmarks.md shows)."""
    factors = list(meta["factors"])
    head = (
        f"`governor bench overload --trace {Path(str(meta['trace'])).name} --seeds {meta['seeds_arg']} "
        f"--factors {','.join(f'{f:g}' for f in factors)}"
        + (f" --replicas {meta['replicas']}" if meta.get("replicas", 4) != 4 else "")
        + f"` ({meta['wall_s']:.0f} s)\n\n"
        "| seed | capacity, req/s per replica | idle attainment | headroom | "
        + " | ".join(("share of idle at " if i == 0 else "") + f"{f:g}x" for i, f in enumerate(factors))
        + " |\n|---|---:|---:|---:|"
        + "---:|" * len(factors)
    )
    lines = [
        f"| {r['seed']} | {r['capacity_rps']:.3f} | {r['idle_attainment']:.2%} | {r['headroom']:.3f} | "
        + " | ".join(f"{p['share']:.2%}" for p in r["points"])
        + " |"
        for r in rows
    ]
    return head + "\n" + "\n".join(lines)


def run_overload(args: argparse.Namespace) -> int:
    wall0 = time.perf_counter()
    trace = load_trace(args.trace)
    seeds = parse_seeds(args.seeds)
    factors = parse_factors(args.factors)
    if not 1 <= args.replicas <= 64:
        raise SystemExit(f"--replicas {args.replicas}: choose 1..64")
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        cfg = base_config(argparse.Namespace(**{**vars(args), "seed": seed}))
        # The idle fleet's trial is the profile's longest: run it once for the capacity and the curve.
        idle = idle_attainment(trace, cfg, args.replicas, PROFILE_DURATION_S, PROFILE_MIN_REQUESTS)
        capacity = replica_capacity_rps(trace, cfg, replicas=args.replicas, idle=idle)
        idle, points = overload_curve(trace, cfg, capacity, factors, replicas=args.replicas, idle=idle)
        headroom = replica_headroom(trace, cfg, capacity, replicas=args.replicas, idle=idle)
        rows.append(
            {
                "seed": seed,
                "capacity_rps": capacity,
                "idle_attainment": idle,
                "headroom": headroom,
                "points": [{"factor": f, "attainment": a, "share": s} for f, a, s in points],
            }
        )
        if not args.json:
            print(
                f"seed {seed} capacity {capacity:.3f} headroom {headroom:.3f}  "
                + "  ".join(f"{f:g}x {s:.2%}" for f, _, s in points)
            )
            sys.stdout.flush()
    meta = {
        "trace": str(args.trace),
        "seeds": seeds,
        "seeds_arg": args.seeds,
        "factors": list(factors),
        "replicas": args.replicas,
        "ttft_slo_ms": cfg.ttft_slo_ms,
        "itl_slo_ms": cfg.itl_slo_ms,
        "wall_s": round(time.perf_counter() - wall0, 1),
    }
    publish(args, markdown(meta, rows), {"meta": meta, "seeds": rows})
    return 0


def add_parser(sub: Any) -> None:
    bo = sub.add_parser("overload", help="the profile fleet's attainment at load factors around its capacity")
    bo.add_argument("--trace", default="azure-conv", help="trace name (azure-conv, mooncake) or file path")
    bo.add_argument("--seeds", default="0-1", help="N, N-M or a comma list of them (default 0-1)")
    bo.add_argument(
        "--factors", default=DEFAULT_FACTORS, help=f"load factors of the capacity (default {DEFAULT_FACTORS})"
    )
    bo.add_argument("--replicas", type=int, default=4, help="the profile fleet's replicas (default 4, the profile's)")
    bo.add_argument("--startup-s", type=float, default=30.0)
    bo.add_argument("--window-s", type=float, default=10.0)
    bo.add_argument("--json", action="store_true")
    bo.add_argument("--markdown", default="", help="append the table, as markdown, to this file")
