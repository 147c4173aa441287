"""The CLI is a registry: ``governor --help`` / ``--version`` import no command's module, the stub
pass answers as the full parser does, every entry resolves, and ``governor/`` stays a thin room."""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from adapters.source import SOURCES, Source
from governor import cli
from launch.commands import Command, load

ROOT = Path(__file__).resolve().parents[2]

# What a command's module pulls in; none of it may load to print the version or the help.
HEAVY = {"numpy", "river", "scipy", "faust", "sim", "optuna", "matplotlib", "aiokafka", "redis"}


def _imported(argv: list[str]) -> set[str]:
    """Top-level names of every module ``python -X importtime -m governor.cli ARGV`` imports."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "governor.cli", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    names = set()
    for line in out.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":  # the header line
                names.add(name)
    assert {"governor", "launch.commands"} <= names, "importtime output not parsed"
    return names


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_version_and_help_import_no_command_module(flag: str) -> None:
    names = _imported([flag])
    heavy = sorted(n for n in names if n.split(".")[0] in HEAVY)
    assert not heavy, f"governor {flag} imports {heavy}"
    # Nor any command's own module: only the tables (bench.commands, adapters.source).
    commands = sorted(n for n in names if n.split(".")[0] in ("bench", "adapters") and "." in n)
    assert set(commands) <= {"bench.commands", "adapters.source"}, commands


def _help(parser: argparse.ArgumentParser, argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        parser.parse_args(argv)
    return buf.getvalue()


def _keys() -> list[tuple[str, ...]]:
    return [(n,) for n in cli.COMMANDS] + [(g, n) for g, (_, table) in cli.GROUPS.items() for n in table]


def test_the_stub_pass_prints_the_full_help(monkeypatch: pytest.MonkeyPatch) -> None:
    # `governor --help` and `governor GROUP --help` come from the stubs: the same text as the full
    # parser's, so each table's help line equals the one its module's parser gives.
    monkeypatch.setenv("COLUMNS", "200")
    full, stubs = cli.build_parser(), cli.build_parser(full=lambda key: False)
    for argv in (["--help"], *([g, "--help"] for g in cli.GROUPS)):
        assert _help(stubs, argv) == _help(full, argv), argv


@pytest.mark.parametrize("key", _keys(), ids=" ".join)
def test_a_command_parses_as_in_the_full_parser(key: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    # `governor CMD --help` through the two passes == the full parser's help of CMD.
    monkeypatch.setenv("COLUMNS", "200")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        cli.parse([*key, "--help"])
    assert buf.getvalue() == _help(cli.build_parser(), [*key, "--help"])


@pytest.mark.parametrize("key", _keys(), ids=" ".join)
def test_every_entry_resolves(key: tuple[str, ...]) -> None:
    cmd: Command = cli._command(key)
    assert callable(load(cmd.run))
    assert not cmd.parser or callable(load(cmd.parser))


def test_parse_picks_the_command_and_its_group() -> None:
    args = cli.parse(["--log-level", "DEBUG", "bench", "kv", "--json"])
    assert (args.command, args.bench, args.json, args.log_level) == ("bench", "kv", True, "DEBUG")
    assert cli._key(args) == ("bench", "kv")
    args = cli.parse(["executor", "--zone", "az-a"])
    assert cli._key(args) == ("executor",) and args.zone == "az-a"


def test_every_telemetry_source_implements_the_source_interface() -> None:
    for name, cmd in SOURCES.items():
        module = sys.modules.get(cmd.run.split(":")[0]) or __import__(cmd.run.split(":")[0], fromlist=["run"])
        assert isinstance(module, Source), name
        assert cmd.needs == (True, False), name  # every source produces to Kafka


def test_the_dispatch_is_simple() -> None:
    # The old if-chain had mccabe complexity 30; a registry needs no branch per command.
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "C901", "--config", "lint.mccabe.max-complexity=10"]
        + ["--no-cache", "governor/cli.py", "launch/commands.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout


def test_governor_is_a_thin_room() -> None:
    modules = sorted(p.name for p in (ROOT / "governor").glob("*.py"))
    assert len(modules) <= 16, modules
    # No benchmark and no telemetry adapter: every bench and ingest command lives in its room.
    assert not [m for m in modules if m.startswith(("bench", "ingest", "scrape", "tune", "traffic"))], modules
    for group, (_, table) in cli.GROUPS.items():
        room = {"bench": "bench.", "ingest": "adapters.", "engines": "engines."}[group]
        assert all(c.run.startswith(room) and c.parser.startswith(room) for c in table.values()), group
