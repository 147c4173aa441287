"""``governor analyze ...``: the analysis layer (deadlines, coupling, feasible region, gains).

Each subcommand lives in its own module, listed in :data:`SUBCOMMANDS`; a module
provides ``add_parser(subparsers)`` that registers its parser with
``set_defaults(run=fn)``, where ``fn(settings, args) -> int`` is the exit code.
None of them needs Kafka or Redis.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

__all__ = ["SUBCOMMANDS", "add_parser", "run"]

#: module of each ``governor analyze`` subcommand, in help order
SUBCOMMANDS: tuple[str, ...] = (
    "bench.analyze_coupling",
    "bench.analyze_region",
    "bench.analyze_gains",
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("analyze", help="analysis: deadlines, coupling graph, feasible region, certified gains")
    asub = p.add_subparsers(dest="analyze", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(name).add_parser(asub)


def run(settings: Any, args: argparse.Namespace) -> int:
    code: int = args.run(settings, args)
    return code
