"""The shape of the loop and the worker around it (issue 32, items 1 and 3): what a reviewer would count by hand."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_scaling_driver_keeps_only_bookkeeping() -> None:
    # The composed law is controllers/scaling_law.py; the driver keeps per-key state and makes commands.
    driver = (ROOT / "loop" / "scaler_driver.py").read_text()
    assert driver.count("\n") <= 300
    assert "from controllers import scaling_law" in driver


SHELL = ROOT / "streams" / "agents.py"


def test_the_worker_shell_has_no_nested_functions() -> None:
    # One short method per agent, timer or effect: state lives on the Worker, not in closures.
    tree = ast.parse(SHELL.read_text())
    funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
    nested = [
        f"{outer.name} > {getattr(inner, 'name', 'lambda')} (line {inner.lineno})"
        for outer in ast.walk(tree)
        if isinstance(outer, funcs)
        for inner in ast.walk(outer)
        if inner is not outer and isinstance(inner, (*funcs, ast.Lambda))
    ]
    assert not nested, nested


def test_the_worker_shell_passes_mccabe_12() -> None:
    argv = [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "C901"]
    out = subprocess.run(
        [*argv, "--config", "lint.mccabe.max-complexity = 12", str(SHELL)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_status_writer_reads_no_driver_state() -> None:
    # Status rows come from the loop as effects (loop.effects.StatusRow); the shell only writes them.
    text = SHELL.read_text()
    assert "loop.scaler" not in text and "loop.watch" not in text and ".states" not in text
