"""``governor config check FILE`` and ``governor config show [FILE]``.

``check`` reads a config file (:mod:`core.config_file`) as every process
reads ``GOVERNOR_CONFIG``: the file, then the environment variables that
override it (``--no-env``: the file alone).  It exits 0 with a one-line
summary (models and their class overrides, zones, which source set which
fields), or 2 with the first error: the file, the value's path in it and
why, in plain words (``governor.yaml: models[1].ttft_slo_ms: must be > 0
(got -5)``), including a gain the controllers refuse (``governor.yaml:
pid_gains (model m): lift_z=-1.0: must be >= 0``, as the worker would at
its start).

``show`` prints the effective settings as a config file (one field a line,
each with its source: default, file or env).  Secrets are never printed: a
secret field shows as a comment saying whether it is set, so the output is
itself a valid config file.

Neither needs Kafka or Redis.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from core.settings import CONFIG_ENV, Settings, SettingsError

__all__ = ["add_parser", "run", "run_config", "summary"]


def add_parser(sub: Any) -> None:
    """Register ``governor config check|show``."""
    c = sub.add_parser("config", help=f"check or show the config file ({CONFIG_ENV})")
    csub = c.add_subparsers(dest="config", required=True)
    check = csub.add_parser(
        "check", help="check a config file: exit 0 with a summary, or 2 naming the first bad value's path"
    )
    check.add_argument("file", help="the YAML config file")
    show = csub.add_parser("show", help="print the effective settings as a config file (secrets masked)")
    show.add_argument("file", nargs="?", help=f"the config file (default: ${CONFIG_ENV}, else none)")
    for p in (check, show):
        p.add_argument(
            "--no-env",
            action="store_true",
            help="the file alone (default: with the environment variables that override it, as a process runs)",
        )


def run(args: argparse.Namespace) -> int:
    """``governor config ...`` on this process's environment (GOVERNOR_CONFIG need not be valid)."""
    return run_config(args, os.environ)


def run_config(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Run ``governor config check|show``; 0 on success, 2 on a bad setting."""
    path = args.file if args.file else (env.get(CONFIG_ENV) or None)
    try:
        settings, sources = Settings.load({} if args.no_env else env, path)
    except SettingsError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if args.config == "check":
        from controllers.scaling_law import controller_problem  # the controllers' own ranges, not a copy

        problem = controller_problem(settings)
        if problem:
            print(f"{path or '(environment)'}: {problem}", file=sys.stderr)
            return 2
        print(summary(path or "", settings, sources))
    else:
        print(show(settings, sources, path))
    return 0


def summary(path: str, settings: Settings, sources: Mapping[str, str]) -> str:
    """The one-line summary of a valid config.

    >>> from core.settings import ModelSpec
    >>> s = Settings(models=(ModelSpec("m", classes={"voice": {"ttft_slo_ms": 800.0}}),))
    >>> summary("g.yaml", s, {"models": "file", "kafka_bootstrap": "env"})
    'g.yaml: ok: 1 model (m: classes voice), 2 zones (az-a, az-b); from the file: models; from the environment: kafka_bootstrap; the rest default'
    """
    models = ", ".join(f"{m.name}: classes {', '.join(m.classes)}" if m.classes else m.name for m in settings.models)
    n_models, n_zones = len(settings.models), len(settings.zones)
    parts = [
        f"{path}: ok: {n_models} model{'s' if n_models != 1 else ''} ({models}), "
        f"{n_zones} zone{'s' if n_zones != 1 else ''} ({', '.join(settings.zones)})"
    ]
    from_file = [k for k, v in sources.items() if v == "file"]
    from_env = [k for k, v in sources.items() if v == "env"]
    parts.append(f"from the file: {_names(from_file)}")
    if from_env:
        parts.append(f"from the environment: {_names(from_env)}")
    parts.append("the rest default")
    return "; ".join(parts)


def _names(fields: list[str]) -> str:
    """Up to 12 field names, then how many in all."""
    if not fields:
        return "nothing"
    return ", ".join(fields) if len(fields) <= 12 else f"{', '.join(fields[:12])}, ... ({len(fields)} fields)"


def show(settings: Settings, sources: Mapping[str, str], path: str | None) -> str:
    """The effective settings as a config file, each field with its source; secrets as comments."""
    origin = f"file {path}" if path else "no file"
    lines = [f"# effective governor settings ({origin}; each line says where its value came from)"]
    for f in dataclasses.fields(Settings):
        kind, value, source = f.metadata["kind"], getattr(settings, f.name), sources.get(f.name, "default")
        if kind == "secret":
            lines.append(f"# {f.name}: (secret, {'set' if value else 'unset'})  # {source}")
            continue
        lines.append(f"{f.name}: {json.dumps(_json_form(kind, value))}  # {source}")
    return "\n".join(lines)


def _json_form(kind: str, value: Any) -> Any:
    """A field's value as JSON (which is YAML): the form its schema describes."""
    if kind == "models":
        return [m.to_dict() for m in value]
    if kind in ("gains", "csv", "pairs"):
        return json.loads(json.dumps(dict(value) if kind == "gains" else value))
    return value
