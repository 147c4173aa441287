"""``governor bench ...``: the benchmark commands, one table line each.

A new benchmark is a module with ``add_parser(sub)`` and a run function, plus one line
here.  The table holds strings, so ``governor --help`` imports no benchmark
(:mod:`launch.commands`); :func:`run_argv` runs one from its arguments in this process
(what :mod:`bench.tables` does for each table).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from launch.commands import Command, add_parser, load

__all__ = ["COMMANDS", "HELP", "run_argv"]

HELP = "benchmarks"

#: ``governor bench NAME``, in help order
COMMANDS: dict[str, Command] = {
    "pipeline": Command(
        "pipeline ingest (rows, columns; 1 and 2 workers) vs a raw consumer, memory, latency",
        run="bench.pipeline:run_bench",
        parser="bench.pipeline:add_parser",
        needs=("env", "env"),
    ),
    "fleet": Command(
        "the worker's loop fed 10,000 replicas over 1,000 (model, zone) keys: ingest, decisions, RSS, sizing",
        run="bench.fleet:run_fleet",
        parser="bench.fleet:add_parser",
        takes="args",
    ),
    "control": Command(
        "every autoscaler on the same seeded workload (fast simulator)",
        run="bench.control:run_bench",
        parser="bench.control:add_parser",
        takes="args",
    ),
    "frontier": Command(
        "attainment vs GPU-seconds with each strategy's main knob swept",
        run="bench.frontier:run_frontier",
        parser="bench.frontier:add_parser",
        takes="args",
    ),
    "retune": Command(
        "online retuning vs the fixed defaults vs PID^alpha adapting, on a workload that changes half-way",
        run="bench.retune:run_retune",
        parser="bench.retune:add_parser",
        takes="args",
    ),
    "seeds": Command(
        "governor, static and the oracle over several seeds and every scenario",
        run="bench.seeds:run_seeds",
        parser="bench.seeds:add_parser",
        takes="args",
    ),
    "overload": Command(
        "the profile fleet's attainment at load factors around its capacity",
        run="bench.overload:run_overload",
        parser="bench.overload:add_parser",
        takes="args",
    ),
    "local": Command(
        "the closed loop on real vLLM engines against a static pool of its mean size, per seed",
        run="bench.local_bench:run_local_bench",
        parser="bench.local_bench:add_parser",
        takes="args",
    ),
    "sim-vs-real": Command(
        "the simulator against the real engines of a --platform local demo, on its arrival schedule",
        run="bench.sim_vs_real:run_sim_vs_real",
        parser="bench.sim_vs_real:add_parser",
        takes="args",
    ),
    "engines": Command(
        "capacity at the SLO of 1, 2 and 3 real vLLM engines behind the router, and what limits it",
        run="bench.engines:run_engines",
        parser="bench.engines:add_parser",
    ),
    "priority": Command(
        "two request classes overloading a real vLLM engine: on-time share per class with and without priorities",
        run="bench.priority:run_priority",
        parser="bench.priority:add_parser",
    ),
    "kv": Command(
        "KV fragmentation, relocation and cross-zone timing (simulator)",
        run="bench.kv:run_kv_bench",
        parser="bench.kv:add_parser",
        takes="args",
    ),
    "agents-live": Command(
        "agent class routes through the real worker and executors, with and without",
        run="bench.agents_live:run_agents_live",
        parser="bench.agents_live:add_parser",
        needs=("env", "env"),
    ),
    "dispatch": Command(
        "prefix-aware dispatch vs least outstanding tokens on the Mooncake trace",
        run="bench.dispatch:run_dispatch",
        parser="bench.dispatch:add_parser",
        takes="args",
    ),
    "router": Command(
        "the vLLM router's cache_aware vs round_robin on real engines, shared prefixes",
        run="bench.router_policy:run_router_bench",
        parser="bench.router_policy:add_parser",
    ),
    "traffic": Command(
        "routing/fallback, breaker, canary, agent weights: A/B in one run",
        run="bench.traffic:run_traffic_bench",
        parser="bench.traffic:add_parser",
        takes="args",
    ),
    "bandwidth": Command(
        "fit the loop-bandwidth -> violation power law (docs/model.md §21 (bandwidth))",
        run="bench.bandwidth:run_bandwidth",
        parser="bench.bandwidth:add_parser",
        takes="args",
    ),
    "design-source": Command(
        "the design source's experiments (§3.1, §4.1, §4.4, §5), its figures beside governor's",
        run="bench.design_source:run_design_source",
        parser="bench.design_source:add_parser",
        takes="args",
    ),
    "tables": Command(
        "write every deterministic fast-loop table as JSON (for compare)",
        run="bench.tables:run_tables",
        parser="bench.tables:add_parser",
        takes="args",
    ),
    "compare": Command(
        "compare two `bench tables` directories, wall-clock fields aside",
        run="bench.tables:run_compare",
        parser="bench.tables:add_compare_parser",
        takes="args",
    ),
    "soak": Command(
        "the closed loop for many minutes with faults on a schedule",
        run="bench.soak:run_soak",
        parser="bench.soak:add_parser",
        needs=("env", "env"),
    ),
    "scrape": Command(
        "scrape-derived P95 TTFT / violation rate vs per-request truth (no servers)",
        run="bench.scrape:run_scrape_bench",
        parser="bench.scrape:add_parser",
        takes="args",
    ),
    "scrape-scale": Command(
        "one scrape adapter over 1,000 simulated engines: round time, CPU, targets per adapter",
        run="bench.scrape_scale:run_scrape_scale",
        parser="bench.scrape_scale:add_parser",
        takes="args",
    ),
    "admission": Command(
        "one admission review at 100 and 1,000 tasks (no servers)",
        run="bench.admission:run_admission_bench",
        parser="bench.admission:add_parser",
        takes="args",
    ),
}


def run_argv(argv: Sequence[str]) -> int:
    """Run ``governor bench NAME ARGS...`` (``argv`` without ``bench``) of a benchmark that needs no settings."""
    name = argv[0]
    cmd = COMMANDS[name]
    if cmd.takes != "args":
        raise ValueError(f"argv: bench {name} needs settings; run it through the governor CLI")
    parser = argparse.ArgumentParser(prog="governor bench")
    add_parser(parser.add_subparsers(dest="bench", required=True), name, cmd)
    code: int = load(cmd.run)(parser.parse_args(argv))
    return code
