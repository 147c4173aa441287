"""The traffic figures measure the product: routing, breaker, canary and agent weights decide only in their
drivers, and the benchmarks reach them through the control loop (issue 32, item 1).

* Outside ``controllers/``, the drivers (``*_driver.py``) and ``tests/``, no code calls the step functions
  of those controllers (``routing.step``, ``breaker.step``, ``canary.step``, ``agent_weights.weights``).
* The benchmark modules import none of those controllers nor the gateway's weights (also an import
  contract in pyproject.toml: "the benchmarks reach the traffic controllers only through the loop").
* The routing benchmark's controlled arm publishes what the shipped ``RoutingDriver`` decided: the
  gateway's weights are the last route command's.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from bench import traffic as bt
from bench.traffic_sim import PRIMARY, LoopPolicy, run_arm

ROOT = Path(__file__).resolve().parents[2]
# module -> the functions that decide (a controller's step)
STEPS = {
    "controllers.routing": {"step"},
    "controllers.breaker": {"step"},
    "controllers.canary": {"step"},
    "controllers.agent_weights": {"weights"},
}
TRAFFIC_CONTROLLERS = {*STEPS, "controllers.gateway_weights"}
# The benchmark modules: every module of the bench package.
BENCH_GLOBS = ("bench/**/*.py",)


def _sources() -> list[Path]:
    skip = {"tests", "controllers", ".venv", "node_modules", "build", "dist"}
    return [
        p for p in ROOT.rglob("*.py") if not skip & set(p.relative_to(ROOT).parts) and not p.name.endswith("_driver.py")
    ]


def _imports(tree: ast.AST) -> tuple[set[str], dict[str, str], dict[str, str]]:
    """(modules imported, alias -> controller module, name -> the step function it is, ``module.function``)."""
    modules: set[str] = set()
    aliases: dict[str, str] = {}
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                modules.add(a.name)
                if a.name in STEPS:
                    aliases[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
            for a in node.names:
                full = f"{node.module}.{a.name}"
                modules.add(full)
                if full in STEPS:
                    aliases[a.asname or a.name] = full
                elif node.module in STEPS and a.name in STEPS[node.module]:
                    names[a.asname or a.name] = full
    return modules, aliases, names


def step_calls(source: str) -> list[str]:
    """The calls of a traffic controller's step function in ``source`` (``module.function``).

    >>> step_calls("from controllers import routing as rt\\nrt.step(p, s, o, c, 10.0)")
    ['controllers.routing.step']
    >>> step_calls("from controllers.breaker import step as brk_step\\nbrk_step(p, s, o, 1.0)")
    ['controllers.breaker.step']
    >>> step_calls("import controllers.agent_weights as aw\\naw.weights(sig)\\nx.step()")
    ['controllers.agent_weights.weights']
    """
    tree = ast.parse(source)
    _, aliases, names = _imports(tree)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in aliases:
            module = aliases[f.value.id]
            if f.attr in STEPS[module]:
                out.append(f"{module}.{f.attr}")
        elif isinstance(f, ast.Name) and f.id in names:
            out.append(names[f.id])
    return out


def test_no_controller_step_outside_controllers_drivers_and_tests() -> None:
    found = {
        str(p.relative_to(ROOT)): calls for p in _sources() if (calls := step_calls(p.read_text(encoding="utf-8")))
    }
    assert found == {}, "decide in a driver, reach it through the ControlLoop"


def test_benchmarks_import_no_traffic_controller() -> None:
    benches = sorted({p for g in BENCH_GLOBS for p in ROOT.glob(g)})
    assert len(benches) >= 4
    found = {}
    for p in benches:
        modules, _, _ = _imports(ast.parse(p.read_text(encoding="utf-8")))
        if bad := sorted(modules & TRAFFIC_CONTROLLERS):
            found[str(p.relative_to(ROOT))] = bad
    assert found == {}


def _args(**kw: object) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bt.add_parser(p.add_subparsers(dest="bench"))
    ns = p.parse_args(["traffic"])
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


def test_the_routing_arm_routes_by_the_loops_commands() -> None:
    """The weights the gateway ends with are the last route command's, as the RoutingDriver published it."""
    args = _args(duration_s=120.0, spikes=1, spike_start_s=30.0, spike_s=60.0)
    replicas, cfg, arr, caps, base = bt._two_variants(args)
    pol = LoopPolicy(bt.loop_settings(args, cfg, replicas, args.breaker_min_requests))
    _, gw = run_arm(cfg, arr, args.duration_s, base, {t: c for t, c in caps.items() if "bloom" in t}, pol)
    routes = pol.applied("route")
    assert routes and all(c.controller == "routing" for _, c in routes)
    last = routes[-1][1].payload["weights"]
    for cls, ws in last.items():
        got = gw.fleet.router.weights(PRIMARY, None if cls == "*" else cls)
        total = sum(ws.values())
        assert got == pytest.approx({t: w / total for t, w in ws.items() if w > 0})
    assert pol.windows > 0 and pol.scale_commands >= 0
