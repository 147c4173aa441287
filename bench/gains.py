"""``--gain NAME=VALUE`` of the fast-loop benchmarks (``bench control``, ``seeds``, ``frontier``):
governor's gains as GOVERNOR_PID_GAINS would set them, checked by name and value, and the
flags that give them back in the command line a table prints; and how those commands hand
their result out (:func:`publish`)."""

from __future__ import annotations

import argparse
import json
import math
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.settings import gains_reason

__all__ = ["SETUP_DEFAULTS", "add_gain", "gain_flags", "gains_of", "parse_gain", "publish", "setup_flags", "setup_of"]

# The run settings the fast-loop benchmarks share, with their defaults: a table's command line names
# the ones a run changed, so the line printed above a table reruns that table.
SETUP_DEFAULTS: dict[str, Any] = {
    "scenario": "all",
    "startup_s": 30.0,
    "window_s": 10.0,
    "eps_ref": 0.02,
    "capacity_error": 1.0,
}


def parse_gain(text: str) -> tuple[str, float]:
    """One ``--gain NAME=VALUE``: a gain governor's controller reads (GOVERNOR_PID_GAINS), a finite number.

    >>> parse_gain("ff_error_margin=0.5")
    ('ff_error_margin', 0.5)
    >>> parse_gain("ff_headroom=1.2")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: unknown gain 'ff_headroom' (known: kp, ki, kd, kp_down, ki_down, kd_down, deadband, alpha, eta, gamma, beta, memory, ff_target_util, ff_error_margin, ff_decay_per_step, ff_lift_z)
    """
    name, sep, raw = (x.strip() for x in text.partition("="))
    try:
        value = float(raw) if sep else float("nan")
    except ValueError:
        value = float("nan")
    if not sep or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=NUMBER, e.g. ff_error_margin=0.5")
    reason = gains_reason({name: value})  # the settings' own check: one list of names, one message
    if reason:
        raise argparse.ArgumentTypeError(reason)
    return name, value


def add_gain(parser: Any, swept: str = "") -> None:
    """``--gain NAME=VALUE`` (repeatable): governor's gains on top of the shipped ones (every variant)."""
    note = f"; {swept} is what this command sweeps" if swept else ""
    parser.add_argument(
        "--gain",
        type=parse_gain,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a gain of governor's controller as GOVERNOR_PID_GAINS would set it, e.g. ff_error_margin=0.5 or "
        f"ff_target_util=0.9 (1 / headroom); repeatable{note}",
    )


def gains_of(args: Namespace) -> dict[str, float]:
    """The ``--gain`` values of ``args`` as a gains mapping (later ones win)."""
    return dict(getattr(args, "gain", None) or [])


def gain_flags(gains: Mapping[str, float]) -> str:
    """The ``--gain`` flags that give ``gains`` (for the command line a table prints).

    >>> gain_flags({"ff_error_margin": 0.5, "ff_decay_per_step": 0.03})
    ' --gain ff_error_margin=0.5 --gain ff_decay_per_step=0.03'
    """
    return "".join(f" --gain {k}={v:g}" for k, v in gains.items())


def setup_of(args: Namespace) -> dict[str, Any]:
    """The shared run settings of ``args`` (those of :data:`SETUP_DEFAULTS` it has), for a run's meta."""
    return {k: getattr(args, k) for k in SETUP_DEFAULTS if hasattr(args, k)}


def setup_flags(setup: Mapping[str, Any]) -> str:
    """The flags that give the run settings of ``setup`` that differ from :data:`SETUP_DEFAULTS`.

    >>> setup_flags({"scenario": "replay,diurnal", "startup_s": 30.0, "eps_ref": 0.01})
    ' --scenario replay,diurnal --eps-ref 0.01'
    >>> setup_flags({"scenario": "all", "capacity_error": 1.0})
    ''
    """
    out = []
    for key, default in SETUP_DEFAULTS.items():
        value = setup.get(key, default)
        if value != default:
            flag = "--" + key.replace("_", "-")
            out.append(f" {flag} {value:g}" if isinstance(value, float) else f" {flag} {value}")
    return "".join(out)


def publish(args: Namespace, table: str, doc: Mapping[str, Any], text: str | None = None) -> None:
    """A benchmark's result: ``table`` appended to ``--markdown``'s file, and ``doc`` as JSON
    (``--json``) or ``text`` (default: the table) on stdout."""
    if getattr(args, "markdown", ""):
        with Path(args.markdown).open("a", encoding="utf-8") as fh:
            fh.write(table + "\n")
    print(json.dumps(doc) if getattr(args, "json", False) else (table if text is None else text))
