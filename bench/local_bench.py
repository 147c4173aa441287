"""``governor bench local``: the closed loop on real engines against a static pool, seed by seed.

For each seed it runs ``governor demo --platform local`` (the shipped command, as a child process,
so this benchmark drives exactly what a user runs), then the same command with ``--static N`` and
``--profile-from`` that run's report: the same SLOs, the same capacity and so the same arrival
schedule, on a static pool of ``N`` = the governed run's mean provisioned engines (ready + starting,
sampled every second over the load), rounded half up.  Every figure is the load client's: a failed,
timed-out or cut request is a miss.

>>> mean_engines([(0.0, "z", "m", 1, 0, 1), (1.0, "z", "m", 1, 1, 2), (2.0, "z", "m", 2, 0, 2)])
1.667
>>> static_size(1.5), static_size(1.49), static_size(0.2)
(2, 1, 1)
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.seeds import parse_seeds

__all__ = ["add_parser", "mean_engines", "run_local_bench", "static_size"]

HELP = "the closed loop on real vLLM engines against a static pool of its mean size, per seed"


def mean_engines(series: Sequence[Sequence[Any]]) -> float:
    """Mean of ready + starting engines over the samples of a report's ``replica_series``."""
    if not series:
        return math.nan
    return round(sum(int(r[3]) + int(r[4]) for r in series) / len(series), 3)


def static_size(mean: float) -> int:
    """The static pool of the same mean size: rounded half up, at least one engine."""
    return max(1, math.floor(mean + 0.5)) if math.isfinite(mean) else 1


def _demo(out: Path, seed: int, extra: Sequence[str], passthrough: Sequence[str]) -> dict[str, Any]:
    argv = [sys.executable, "-m", "governor.cli", "demo", "--platform", "local", "--seed", str(seed)]
    argv += ["--out", str(out), "--no-progress", *extra, *passthrough]
    print(f"[bench local] {' '.join(argv[3:])}", file=sys.stderr, flush=True)
    proc = subprocess.run(argv, check=False)
    if proc.returncode not in (0, 1):  # 1: no command applied (a static pool applies none)
        raise SystemExit(f"governor demo --platform local exited {proc.returncode} (logs in {out})")
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    return report


def _row(seed: int, kind: str, rep: dict[str, Any]) -> dict[str, Any]:
    c = rep["client"]
    return {
        "seed": seed,
        "pool": kind,
        "engines_mean": mean_engines(rep.get("replica_series", [])),
        "attainment": c["attainment"],
        "p95_ttft_ms": c["p95_ttft_ms"],
        "p95_itl_ms": c["p95_itl_ms"],
        "requests": c["requests"],
        "not_ok": c["requests"] - c["counts"]["ok"],
        "scale_ups": sum(1 for a in rep["scale_actions"] if a["outcome"] == "applied" and a["target"] == 2),
        "drained": sum(
            bool(s.get("drained")) for a in rep["scale_actions"] for s in (a.get("detail") or {}).get("stopped", [])
        ),
        "slo": rep["slo"],
    }


def markdown(rows: Sequence[dict[str, Any]], argv: str, wall_s: float) -> str:
    def f(v: Any, pct: bool = False) -> str:
        if v is None:
            return "-"
        return f"{100 * v:.2f}%" if pct else f"{v:,.1f}"

    slo = rows[0]["slo"] if rows else {}
    lines = [
        f"`governor bench local {argv}` ({wall_s / 60:.0f} min; SLOs TTFT {slo.get('ttft_slo_ms')} ms, "
        f"ITL {slo.get('itl_slo_ms')} ms of the first seed's profile)",
        "",
        "| seed | pool | engines (mean) | attainment | P95 TTFT, ms | P95 ITL, ms | requests | not ok | drained stops |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['seed']} | {r['pool']} | {r['engines_mean']:.2f} | {f(r['attainment'], True)} | "
            f"{f(r['p95_ttft_ms'])} | {f(r['p95_itl_ms'])} | {r['requests']} | {r['not_ok']} | {r['drained']} |"
        )
    return "\n".join(lines)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("local", help=HELP)
    p.add_argument("--seeds", default="0-2", help="N, N-M or a comma list (default 0-2)")
    p.add_argument("--out", default="runs/bench-local", help="one demo directory per seed and pool")
    p.add_argument("--json", default="", help="also write the rows here")
    p.add_argument("demo_args", nargs=argparse.REMAINDER, help="after --: flags for every demo run")


def run_local_bench(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    passthrough = [a for a in args.demo_args if a != "--"]
    rows: list[dict[str, Any]] = []
    out = Path(args.out)
    for seed in parse_seeds(args.seeds):
        gov = _demo(out / f"seed{seed}" / "governor", seed, [], passthrough)
        n = static_size(mean_engines(gov.get("replica_series", [])))
        profile = out / f"seed{seed}" / "governor" / "report.json"
        static = _demo(out / f"seed{seed}" / f"static{n}", seed, ["--static", str(n), "--profile-from", str(profile)],
                       passthrough)  # fmt: skip
        rows += [_row(seed, "governor", gov), _row(seed, f"static {n}", static)]
    text = markdown(rows, f"--seeds {args.seeds}" + (" -- " + " ".join(passthrough) if passthrough else ""),
                    time.monotonic() - t0)  # fmt: skip
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str))
    return 0
