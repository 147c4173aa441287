"""A command of the ``governor`` CLI as data: its help line and where its parser and code live.

Each room registers its own commands in a table of :class:`Command` (``governor.cli``:
the top level; :mod:`bench.commands`: ``governor bench ...``; :mod:`adapters.source`:
``governor ingest ...``).  A table holds strings, not functions, so reading it imports
nothing: a command's module is imported only when that command is parsed in full or run
(:func:`load`), and ``governor --help`` stays light.

>>> cmd = Command("print a greeting", run="builtins:print", takes="args")
>>> load(cmd.run) is print
True
>>> load("no_colon")
Traceback (most recent call last):
    ...
ValueError: target 'no_colon': want 'module:function'
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Command", "add_parser", "add_stub", "load"]

#: how the command's function is called: ``fn(settings, args)``; ``fn(args)`` (settings are
#: still built and checked first); ``fn(args)`` before any settings (reads no environment)
Takes = Literal["settings", "args", "early"]


@dataclass(frozen=True)
class Command:
    """One subcommand.

    ``help``: the line ``governor --help`` shows (equal to the one the module's parser gives;
    a test holds them equal).  ``run``: ``"module:function"`` returning the exit code.
    ``parser``: ``"module:function"`` that adds the command's subparser to a subparsers action
    (``add_parser(sub)``); empty: a subparser with no arguments.  ``needs``: (kafka, redis)
    checked up front, where ``"env"`` checks only a server named in the environment (else it is
    embedded).  ``keys``: refuses to start without command signing keys.
    """

    help: str
    run: str
    parser: str = ""
    takes: Takes = "settings"
    needs: tuple[bool | str, bool | str] = (False, False)
    keys: bool = False


def load(target: str) -> Callable[..., Any]:
    """Import ``"module:function"`` and return the function."""
    module, sep, name = target.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"target {target!r}: want 'module:function'")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn


def add_parser(sub: Any, name: str, cmd: Command) -> None:
    """The command's full subparser (imports its module)."""
    if cmd.parser:
        load(cmd.parser)(sub)
    else:
        sub.add_parser(name, help=cmd.help)


def add_stub(sub: Any, name: str, cmd: Command) -> argparse.ArgumentParser:
    """A stand-in subparser: the name and help line only, every argument left unparsed."""
    stub: argparse.ArgumentParser = sub.add_parser(name, help=cmd.help, add_help=False)
    return stub
