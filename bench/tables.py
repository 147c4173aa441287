"""``governor bench tables`` / ``governor bench compare``: is a change structure-only?

``tables --out DIR`` runs the deterministic fast-loop benchmarks and writes one
JSON file each: ``bench control`` on both traces and five scenarios (600 s,
seed 0), ``bench traffic --scenario all``, ``bench kv`` and ``bench bandwidth``.
``compare A B`` says, file by file, whether two such directories hold the same
results once the wall-clock fields (``wall_s``, ``sim_speedup``) and the plot
paths are set aside; it exits 1 if any differs.  Run ``tables`` on the old
and the new code (e.g. a ``git worktree`` of the old commit) and ``compare``
them: a restructure that changes no behaviour prints ``13 of 13 identical``.

>>> _strip({"a": 1, "wall_s": 3.2, "runs": [{"plot": "x.png", "b": 2}]})
{'a': 1, 'runs': [{'b': 2}]}
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["TABLES", "add_compare_parser", "add_parser", "run_compare", "run_tables"]

# name -> the governor CLI arguments that print the table as JSON
TABLES: dict[str, list[str]] = {
    **{
        f"control-{trace}-{scenario}": [
            "bench", "control", "--trace", trace, "--scenario", scenario, "--qps", qps,
            "--duration-s", "600", "--seed", "0", "--json",
        ]
        for trace, qps in (("azure-conv", "20"), ("mooncake", "4"))
        for scenario in ("replay", "step", "burst", "spike", "zone-cut")
    },
    "traffic": ["bench", "traffic", "--scenario", "all", "--json"],
    "kv": ["bench", "kv", "--json"],
    "bandwidth": ["bench", "bandwidth", "--json"],
}  # fmt: skip
_WALL_CLOCK = frozenset({"wall_s", "sim_speedup", "plot"})


def add_parser(sub: Any) -> None:
    t = sub.add_parser("tables", help="write every deterministic fast-loop table as JSON (for compare)")
    t.add_argument("--out", required=True, help="directory for the JSON files")
    t.add_argument("--only", default="", help="comma-separated table names (default: all)")


def add_compare_parser(sub: Any) -> None:
    c = sub.add_parser("compare", help="compare two `bench tables` directories, wall-clock fields aside")
    c.add_argument("before")
    c.add_argument("after")


def _strip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in _WALL_CLOCK}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def run_tables(args: argparse.Namespace) -> int:
    from bench.commands import run_argv

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.only.split(",") if n] or list(TABLES)
    unknown = sorted(set(names) - set(TABLES))
    if unknown:
        print(f"governor: unknown tables {unknown}; choose from {sorted(TABLES)}", file=sys.stderr)
        return 2
    for name in names:
        argv = list(TABLES[name])
        if argv[1] == "control":
            argv += ["--out", str(out / "runs")]
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = run_argv(argv[1:])
        if rc != 0:
            print(f"governor: {name} failed ({rc})", file=sys.stderr)
            return rc
        (out / f"{name}.json").write_text(buf.getvalue())
        print(f"{name}: {out / (name + '.json')}", flush=True)
    return 0


def run_compare(args: argparse.Namespace) -> int:
    before, after = Path(args.before), Path(args.after)
    names = sorted(p.name for p in before.glob("*.json"))
    if not names:
        print(f"governor: no tables in {before}", file=sys.stderr)
        return 2
    same = 0
    for name in names:
        other = after / name
        if not other.exists():
            print(f"{name}: missing in {after}")
            continue
        ok = _strip(json.loads((before / name).read_text())) == _strip(json.loads(other.read_text()))
        same += ok
        print(f"{name}: {'identical' if ok else 'DIFFERENT'}")
    print(f"{same} of {len(names)} identical (wall_s, sim_speedup and plot paths set aside)")
    return 0 if same == len(names) else 1
