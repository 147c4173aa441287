"""Every default of a setting is written once (issue 32 item 4).

The packages' syntax trees are scanned for a literal equal to the default of
a :class:`core.settings.Settings` or :class:`core.settings.ModelSpec` field
used as the default of a parameter of the same name: a function parameter's
default, a dataclass field's, ``x.<field> if ... else <literal>``,
``x.<field> or <literal>``, ``mapping.get("<field>", <literal>)`` and
``getattr(x, "<field>", <literal>)``.  Such a
parameter takes its default from :mod:`core.defaults` instead, so a default
changed in one place changes everywhere.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from core import defaults
from core.settings import ModelSpec, Settings

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "controllers", "streams", "executors", "sim", "governor", "telemetry")
# Parameters named differently from the field they default.
ALIASES = {"slo_ttft_ms": "ttft_slo_ms", "slo_itl_ms": "itl_slo_ms"}
# (file, name): a parameter that shares a field's name but not its meaning.
UNRELATED = {("loop/commands.py", "controller")}  # the controller that issued a command, not GOVERNOR_CONTROLLER


def field_defaults() -> dict[str, Any]:
    """Field -> default, for the fields whose default is a number or a non-empty string."""
    out: dict[str, Any] = {}
    for instance in (Settings(), ModelSpec("m")):
        for f in dataclasses.fields(instance):
            v = getattr(instance, f.name)
            if type(v) in (int, float, str) and v not in ("", 0, 0.0):
                out.setdefault(f.name, v)
    return out


def _pairs(node: ast.AST) -> Iterator[tuple[str, ast.expr]]:
    """(parameter name, its default expression) of the forms the module docstring names."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        a = node.args
        pos = a.posonlyargs + a.args
        yield from zip((x.arg for x in pos[len(pos) - len(a.defaults) :]), a.defaults, strict=True)
        yield from ((x.arg, d) for x, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None)
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        yield node.target.id, node.value
    elif isinstance(node, ast.IfExp) and isinstance(node.body, ast.Attribute):
        yield node.body.attr, node.orelse
    elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and isinstance(node.values[0], ast.Attribute):
        yield node.values[0].attr, node.values[-1]
    elif isinstance(node, ast.Call):
        # mapping.get("<field>", <literal>) and getattr(x, "<field>", <literal>)
        getter = isinstance(node.func, ast.Attribute) and node.func.attr == "get" and len(node.args) == 2
        if not getter and isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) == 3:
            getter = True
        key, default = node.args[-2:] if getter else (None, None)
        if isinstance(key, ast.Constant) and default is not None:
            yield str(key.value), default


def repeated_defaults(root: Path = ROOT) -> list[str]:
    """``path:line name=literal`` for every settings default written again as a literal."""
    known = field_defaults()
    found = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in ("core/settings.py", "core/defaults.py"):
                continue
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                for name, default in _pairs(node):
                    name = ALIASES.get(name, name)
                    if (rel, name) in UNRELATED or name not in known or not isinstance(default, ast.Constant):
                        continue
                    if type(default.value) is type(known[name]) and default.value == known[name]:
                        found.append(f"{rel}:{default.lineno} {name}={default.value!r}")
    return found


def test_no_settings_default_is_written_twice() -> None:
    assert repeated_defaults() == []


def test_the_scan_finds_a_repeated_default(tmp_path: Path) -> None:
    pkg = tmp_path / "sim"
    pkg.mkdir()
    (pkg / "peer.py").write_text(
        "def make(slo_ttft_ms: float = 1000.0, window_s=10.0, eps_ref=0.5):\n"
        "    ttft = spec.ttft_slo_ms if spec else 1000.0\n"
        "    return getattr(args, 'eps_ref', 0.02), meta.get('window_s', 10.0)\n"
    )
    assert repeated_defaults(tmp_path) == [
        "sim/peer.py:1 ttft_slo_ms=1000.0",
        "sim/peer.py:1 window_s=10.0",
        "sim/peer.py:2 ttft_slo_ms=1000.0",
        "sim/peer.py:3 eps_ref=0.02",
        "sim/peer.py:3 window_s=10.0",
    ]


def test_the_settings_take_their_defaults_from_core_defaults() -> None:
    s, m = Settings(), ModelSpec("m")
    assert (m.ttft_slo_ms, m.itl_slo_ms) == (defaults.TTFT_SLO_MS, defaults.ITL_SLO_MS)
    assert (m.min_replicas, m.max_replicas) == (defaults.MIN_REPLICAS, defaults.MAX_REPLICAS)
    assert (s.window_s, s.lateness_s, s.eps_ref) == (defaults.WINDOW_S, defaults.LATENESS_S, defaults.EPS_REF)


def test_the_fast_loop_config_holds_no_copy_of_a_settings_field() -> None:
    from sim.fastloop import FAST_LOOP_MAX_REPLICAS, LoopConfig

    own = {f.name for f in dataclasses.fields(LoopConfig)}
    settings_fields = {f.name for cls in (Settings, ModelSpec) for f in dataclasses.fields(cls)}
    assert own & (settings_fields | {"model"}) == set()
    cfg = LoopConfig.of(window_s=5.0, ttft_slo_ms=300.0, zones=("x", "y", "z"), startup_s=12.0)
    assert (cfg.settings.window_s, cfg.settings.models[0].ttft_slo_ms, cfg.settings.zones) == (
        5.0,
        300.0,
        ("x", "y", "z"),
    )
    assert cfg.settings.startup_hint_s == 12.0 and cfg.max_replicas == FAST_LOOP_MAX_REPLICAS
    moved = cfg.replace(window_s=20.0, max_replicas=32, seed=4)
    assert (moved.window_s, moved.settings.command_ttl_s, moved.max_replicas, moved.seed) == (20.0, 60.0, 32, 4)
    assert moved.settings.models[0].ttft_slo_ms == 300.0
