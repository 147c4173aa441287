"""``governor bench tables`` names valid commands; ``bench compare`` sets only wall-clock fields aside."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.tables import TABLES, run_compare
from governor.cli import build_parser


def test_every_table_is_a_valid_json_bench_command() -> None:
    parser = build_parser()
    for name, argv in TABLES.items():
        args = parser.parse_args(argv)
        assert args.command == "bench" and args.json, name
    assert len(TABLES) == 13


def _write(d: Path, name: str, obj: object) -> None:
    d.mkdir(exist_ok=True)
    (d / name).write_text(json.dumps(obj))


def _compare(a: Path, b: Path) -> int:
    return run_compare(argparse.Namespace(before=str(a), after=str(b)))


def test_compare_ignores_wall_clock_fields_and_catches_any_other_change(tmp_path: Path, capsys) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    run = {"strategies": [{"slo_attainment": 0.99, "wall_s": 3.0, "sim_speedup": 500.0, "plot": "/a/x.png"}]}
    _write(a, "t.json", run)
    _write(b, "t.json", {"strategies": [{"slo_attainment": 0.99, "wall_s": 9.0, "sim_speedup": 1.0, "plot": "/b"}]})
    _write(c, "t.json", {"strategies": [{"slo_attainment": 0.98, "wall_s": 3.0, "sim_speedup": 500.0}]})
    assert _compare(a, b) == 0
    assert _compare(a, c) == 1
    assert "t.json: DIFFERENT" in capsys.readouterr().out


def test_compare_counts_a_missing_table_as_a_difference(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    _write(a, "t.json", {"x": 1})
    _write(a, "u.json", {"x": 1})
    _write(b, "t.json", {"x": 1})
    assert _compare(a, b) == 1
