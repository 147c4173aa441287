"""``governor bench frontier``: attainment against GPU-seconds, each strategy's main knob swept.

Frontiers, not points: one setting of a knob says little when another
setting trades attainment for GPU-seconds.  Per scenario every strategy runs
at five to seven values of its main knob (:data:`KNOBS`), on the same workload, the
same start fleet (the warm start of ``bench control``: every strategy starts
at static's peak-minute size) and in the same fast loop; the oracle
(:mod:`sim.oracle`, headroom swept) is the achievable limit and the lower
bound on GPU-seconds the physical one.  The causal oracle (the same schedule
read only up to now: exact knowledge of the load so far, none of the future)
splits governor's gap to the oracle into the price of not knowing the future
(oracle -> causal oracle) and the price of measuring and controlling
(causal oracle -> governor).

Summary per scenario: the peer points governor's frontier dominates (some
governor point has attainment >= and GPU-seconds <=, one of them strictly),
counted over the peers alone (:data:`PEERS`: HPA, the queue-depth HPA, KEDA,
KPA, Ray Serve and the two Dynamo planners) as "X of Y" and a share; and
governor's GPU-seconds at 99.5 % of the ceiling (its cheapest point that
reaches it) as a ratio to the oracle's, the causal oracle's and to the lower
bound.  ``static`` is sized on the whole run's busiest minute, which it could
only know in advance: its cheapest point at 99.5 % of the ceiling is shown
beside the oracles', and it is not counted among the peers.  Writes
``<out>/frontier-<trace>-<scenario>.png``; ``--json`` prints one object.

The peers at their best: KPA's concurrency target, Ray Serve's
``target_ongoing_requests`` and the queue-depth HPA's waiting target are swept
over multiples (:data:`DERIVED_MULTIPLES`, 0.25x-2x) of the target each
derives from the profiled capacity on this run (:func:`derived_targets`: one
profile trial per model, the same in every zone), printed per scenario; the
others over ranges that hold their system's default (HPA's 70 % utilisation,
KEDA's and Dynamo's SLO, Dynamo's 180 s interval).

Defaults: 600 s runs, every scenario, seven headroom values for governor
(0.6-1.6: below 1 it plans replicas hotter than their capacity, the cheap
end where the peers' cheapest points are), six multiples for KPA, Ray Serve
and the queue-depth HPA, and five knob values for static, HPA, KEDA, the two
Dynamo planners, the oracle and the causal oracle: 60 runs a scenario, 480 in
all, about 20 minutes a trace on one core.  ``--points N`` sweeps N values of
each knob over the same span instead (its default among them).
"""

from __future__ import annotations

import sys
import time
from argparse import Namespace
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.control import GOVERNOR_VARIANTS, Setup, add_capacity_error, prepare
from bench.gains import add_gain, gain_flags, gains_of, publish, setup_flags, setup_of
from sim.fastloop import run
from sim.oracle import ceiling, lower_bound_gpu_seconds, oracle_factory
from sim.profiling import PLANNED_SHORTFALL, replica_capacity_rps
from sim.scenarios import SCENARIOS, scenario_list
from sim.traces import load_trace

TARGET_SHARE = 0.995  # of the ceiling: where governor's GPU-seconds are compared
TRACE_QPS = {"azure-conv": 20.0, "mooncake": 4.0}
# multiples of a peer's derived target: from a quarter (fewer requests a replica: a much cooler fleet) to
# twice it (a hotter one), so the sweep holds the derived target and the peer's best point on either trace
# (seed 0, 600 s replays: KPA's and Ray Serve's cheapest points at 99.5 % of the ceiling at 1-1.5x)
DERIVED_MULTIPLES = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)

# strategy -> (knob, its values); "_x_" knobs scale a per-run reference (static's size, the TTFT SLO, or the
# peer's derived target: :func:`derived_targets`), the rest are the setting itself
KNOBS: dict[str, tuple[str, tuple[float, ...]]] = {
    # headroom = 1 / the feedforward's target utilisation (default: the profile's); eps_ref moved governor's points
    # little once the feedforward sizes the fleet (0.005 and 0.01 gave the same runs)
    # (below 1 it runs replicas hotter than the capacity says: the frontier's cheap end, where the peers'
    # cheapest points are)
    # (0.5 .. 3: the peers are swept from their cheapest to their dearest points, and governor's frontier is
    # compared with all of them; below 0.5 the feedforward's target utilisation would pass its bound of 2)
    "governor": ("headroom", (0.5, 0.6, 0.8, 1.0, 1.1, 1.25, 1.4, 1.6, 2.0, 2.5, 3.0)),
    "static": ("replicas_x_peak", (0.6, 0.8, 1.0, 1.2, 1.5)),
    "hpa": ("target_utilization", (0.5, 0.6, 0.7, 0.8, 0.9)),
    "hpa-queue": ("target_waiting_x_derived", DERIVED_MULTIPLES),
    "keda": ("threshold_x_slo", (0.25, 0.5, 0.75, 1.0, 1.5)),
    "kpa": ("target_concurrency_x_derived", DERIVED_MULTIPLES),
    "rayserve": ("target_ongoing_requests_x_derived", DERIVED_MULTIPLES),
    "dynamo-load": ("sla_x_slo", (0.25, 0.5, 0.75, 1.0, 1.5)),
    "dynamo-throughput": ("adjustment_interval_s", (30.0, 60.0, 120.0, 180.0, 300.0)),
    "oracle": ("headroom", (0.8, 0.9, 1.0, 1.2, 1.5)),
    "oracle-causal": ("headroom", (0.8, 0.9, 1.0, 1.2, 1.5)),
}
# the knob value each strategy runs at by default (its derived target or its system's default), in KNOBS' unit
DEFAULT_KNOB = {"hpa": 0.70, "dynamo-throughput": 180.0}  # the rest: 1.0 (the reference itself)
LIMITS = ("oracle", "oracle-causal")  # references, not peers
CLAIRVOYANT = ("static",)  # sized on the whole run's busiest minute: shown beside the limits, not a peer
# the peers governor's dominance is counted over (issue 35: the peers at their best)
PEERS = ("hpa", "hpa-queue", "keda", "kpa", "rayserve", "dynamo-load", "dynamo-throughput")
DEFAULT_STRATEGIES = ("governor", *CLAIRVOYANT, *PEERS, *LIMITS)


def knob_values(name: str, points: int = 0) -> tuple[float, ...]:
    """The values ``name``'s knob is swept over: :data:`KNOBS`' own (``points`` 0), or ``points`` values
    spread geometrically over the same span, the default (:data:`DEFAULT_KNOB`) always among them.

    >>> knob_values("kpa", 3)
    (0.25, 0.707, 1.0, 2.0)
    """
    values = KNOBS[name][1]
    if points <= 0:
        return values
    if points == 1:
        return (DEFAULT_KNOB.get(name, 1.0),)
    lo, hi = min(values), max(values)
    grid = {round(lo * (hi / lo) ** (i / (points - 1)), 3) for i in range(points)}
    return tuple(sorted(grid | {DEFAULT_KNOB.get(name, 1.0)}))


def derived_targets(setup: Setup) -> dict[str, dict[str, Any]]:
    """Each baseline's default setting on this run, in its own unit: the capacity-derived per-replica targets
    (KPA, Ray Serve: requests in flight carrying the profiled capacity, one profile trial per model; the queue-depth
    HPA: Little's law on the waiting room) or the system's default, and the setting a knob multiple of 1 means."""
    from sim.baselines import HpaParams, HpaQueueDepth

    cfg = setup.cfg
    waiting = HpaQueueDepth(replica_capacity_rps=setup.capacity, slo_ttft_ms=cfg.ttft_slo_ms).target_waiting
    return {
        "static": {"setting": "replicas per zone", "value": setup.static_n},
        "hpa": {"setting": "target_utilization", "value": HpaParams().target_utilization},
        "hpa-queue": {"setting": "target_waiting", "value": round(waiting, 3)},
        "keda": {"setting": "threshold_ms", "value": cfg.ttft_slo_ms},
        "kpa": {"setting": "target_concurrency", "value": round(setup.replica_concurrency, 3)},
        "rayserve": {"setting": "target_ongoing_requests", "value": round(setup.replica_concurrency, 3)},
        "dynamo-load": {"setting": "ttft_sla_ms", "value": cfg.ttft_slo_ms},
        "dynamo-throughput": {"setting": "adjustment_interval_s", "value": DEFAULT_KNOB["dynamo-throughput"]},
    }


def setting(name: str, value: float, setup: Setup) -> float:
    """The setting the baseline is given at knob ``value`` (the value itself unless the knob is a multiple)."""
    knob = KNOBS[name][0]
    if knob.endswith("_x_derived"):
        return value * float(derived_targets(setup)[name]["value"])
    if name == "static":
        return max(1, round(value * setup.static_n))
    if knob.endswith("_x_slo"):
        return value * setup.cfg.ttft_slo_ms
    return value


def _strategy(name: str, value: float, setup: Setup) -> tuple[Any, Any]:
    """(strategy for :func:`sim.fastloop.run`, the loop config) at knob ``value``."""
    from sim import baselines as b

    cfg, cap = setup.cfg, setup.capacity
    if name == "governor":
        variant = {k: v for k, v in GOVERNOR_VARIANTS["governor"].items() if k != "feedforward"}
        gains = {**cfg.pid_gains, "ff_target_util": 1.0 / value}
        return "governor", cfg.replace(replica_capacity_rps=cap, pid_gains=gains, **variant)
    if name in LIMITS:  # the references know the true capacity, whatever the profile says
        sc, true = setup.scenario, setup.true_capacity
        return oracle_factory(sc.workload, cfg, true, sc.faults, sc.duration_s, value, causal=name != "oracle"), cfg
    common: dict[str, Any] = {
        "min_replicas": cfg.min_replicas,
        "max_replicas": cfg.max_replicas,
        "slo_ttft_ms": cfg.ttft_slo_ms,
        "slo_itl_ms": cfg.itl_slo_ms,
        "replica_capacity_rps": cap,
    }
    x = setting(name, value, setup)
    params: Callable[[], Any]
    if name == "static":
        params = lambda: b.StaticParams(replicas=int(x))  # noqa: E731
    elif name == "hpa":
        params = lambda: b.HpaParams(target_utilization=x)  # noqa: E731
    elif name == "hpa-queue":
        params = lambda: b.HpaQueueParams(target_waiting=x)  # noqa: E731
    elif name == "keda":
        params = lambda: b.KedaParams(threshold_ms=x)  # noqa: E731
    elif name == "kpa":
        params = lambda: b.KpaParams(target_concurrency=x)  # noqa: E731
    elif name == "rayserve":
        params = lambda: b.RayServeParams(target_ongoing_requests=x)  # noqa: E731
    elif name == "dynamo-load":
        params = lambda: b.DynamoLoadParams(  # noqa: E731
            ttft_sla_ms=x, itl_sla_ms=value * cfg.itl_slo_ms
        )
    elif name == "dynamo-throughput":
        params = lambda: b.DynamoThroughputParams(adjustment_interval_s=x)  # noqa: E731
    else:
        raise SystemExit(f"no knob for strategy {name!r}; choose from {sorted(KNOBS)}")
    cls = b.BASELINES[name]
    return (lambda zone: cls(params(), **common)), cfg


def _dominated(gov: Sequence[Mapping[str, Any]], peers: Sequence[Mapping[str, Any]]) -> list[str]:
    """Peer points some governor point matches or beats on both axes, strictly on one.

    >>> g = [{"slo_attainment": 0.99, "gpu_seconds": 100.0}]
    >>> p = [{"strategy": "s", "knob_value": 1, "slo_attainment": 0.98, "gpu_seconds": 120.0},
    ...      {"strategy": "s", "knob_value": 2, "slo_attainment": 0.995, "gpu_seconds": 90.0}]
    >>> _dominated(g, p)
    ['s@1']
    """
    out = []
    for p in peers:
        pa, pg = p["slo_attainment"] or 0.0, p["gpu_seconds"]
        for g in gov:
            ga, gg = g["slo_attainment"] or 0.0, g["gpu_seconds"]
            if ga >= pa and gg <= pg and (ga > pa or gg < pg):
                out.append(f"{p['strategy']}@{p['knob_value']:g}")
                break
    return out


def peer_dominance(points: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Governor's dominance counted over the peers alone (:data:`PEERS`): static and the oracles are references.

    >>> pt = lambda s, a, g: {"strategy": s, "knob_value": 1, "slo_attainment": a, "gpu_seconds": g}
    >>> d = peer_dominance([pt("governor", 0.99, 100.0), pt("static", 0.9, 200.0), pt("kpa", 0.98, 120.0)])
    >>> d["dominated_by_governor"], d["peer_points"], d["dominated_share"]
    (['kpa@1'], 1, 1.0)
    """
    gov = [p for p in points if p["strategy"] == "governor"]
    peers = [p for p in points if p["strategy"] in PEERS]
    dom = _dominated(gov, peers) if gov else []
    return {
        "peer_points": len(peers),
        "dominated_by_governor": dom,
        "dominated_share": round(len(dom) / len(peers), 3) if peers else None,
        # the rest: peer points no governor point matches on both axes (the goal is none)
        "not_dominated": [n for n in (f"{p['strategy']}@{p['knob_value']:g}" for p in peers) if n not in dom],
    }


def _cheapest_at(points: Sequence[Mapping[str, Any]], goal: float) -> float | None:
    """GPU-seconds of the cheapest point with attainment >= ``goal`` (None when none reaches it)."""
    ok = [p["gpu_seconds"] for p in points if (p["slo_attainment"] or 0.0) >= goal]
    return min(ok) if ok else None


def run_scenario(
    args: Namespace, scenario: str, trace: Any, capacity: float, strategies: Sequence[str]
) -> dict[str, Any]:
    """Every strategy at every knob value on one scenario, and the scenario's summary."""
    # governor's points set their headroom (ff_target_util) themselves: the profile's is not needed
    setup = prepare(args, scenario, trace=trace, capacity=capacity, headroom=PLANNED_SHORTFALL)
    sc, cfg = setup.scenario, setup.cfg
    ceil = ceiling(sc.workload, cfg)
    points: list[dict[str, Any]] = []
    for name in strategies:
        knob = KNOBS[name][0]
        for value in knob_values(name, getattr(args, "points", 0)):
            strat, run_cfg = _strategy(name, value, setup)
            m = run(strat, sc.workload, run_cfg, sc.faults, sc.duration_s, name=name).metrics
            att = m["slo_attainment"]
            points.append(
                {
                    "strategy": name,
                    "scenario": scenario,
                    "knob": knob,
                    "knob_value": value,
                    "setting": None if name == "governor" or name in LIMITS else round(setting(name, value, setup), 3),
                    "slo_attainment": att,
                    "attainment_over_ceiling": round(att / ceil, 5) if att is not None and ceil > 0 else None,
                    "gpu_seconds": m["gpu_seconds"],
                    "waste": m["waste"],
                }
            )
    lb = lower_bound_gpu_seconds(sc.workload, cfg)
    goal = TARGET_SHARE * ceil

    def at(name: str) -> float | None:
        return _cheapest_at([p for p in points if p["strategy"] == name], goal)

    g_at, o_at, c_at, s_at = at("governor"), at("oracle"), at("oracle-causal"), at("static")
    return {
        "scenario": scenario,
        "ceiling": round(ceil, 5),
        "lower_bound_gpu_seconds": round(lb, 1),
        "static_replicas_per_zone": setup.static_n,
        "initial_replicas_per_zone": cfg.initial_replicas,
        "requests": len(sc.workload),
        "derived_targets": {k: v for k, v in derived_targets(setup).items() if k in strategies},
        "points": points,
        **peer_dominance(points),
        "governor_gpu_seconds_at_target": g_at,
        "oracle_gpu_seconds_at_target": o_at,
        "governor_over_oracle": round(g_at / o_at, 3) if g_at and o_at else None,
        "causal_oracle_gpu_seconds_at_target": c_at,
        "governor_over_causal_oracle": round(g_at / c_at, 3) if g_at and c_at else None,
        # static sized on the whole run's busiest minute knows the future: beside the oracles, not a peer
        "static_gpu_seconds_at_target": s_at,
        "governor_over_static": round(g_at / s_at, 3) if g_at and s_at else None,
        "governor_over_lower_bound": round(g_at / lb, 3) if g_at and lb > 0 else None,
    }


def plot(summary: Mapping[str, Any], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.report import save

    fig, ax = plt.subplots(figsize=(9, 5.5))
    by: dict[str, list[Mapping[str, Any]]] = {}
    for p in summary["points"]:
        by.setdefault(p["strategy"], []).append(p)
    for name, pts in by.items():
        pts = sorted(pts, key=lambda p: p["gpu_seconds"])
        xs, ys = [p["gpu_seconds"] for p in pts], [p["slo_attainment"] or 0.0 for p in pts]
        style: dict[str, Any] = (
            {"color": "black", "linestyle": "--" if name == "oracle" else ":"} if name in LIMITS else {}
        )
        if name in CLAIRVOYANT:  # a reference beside the oracles, not a peer
            style = {"color": "dimgrey", "linestyle": "-."}
        ax.plot(xs, ys, marker="o", label=name, linewidth=2.5 if name == "governor" else 1.2, **style)
    ax.axhline(summary["ceiling"], color="grey", linestyle=":", label="ceiling")
    ax.axhline(
        TARGET_SHARE * summary["ceiling"], color="grey", linestyle="-.", linewidth=0.8, label="99.5 % of ceiling"
    )
    ax.axvline(summary["lower_bound_gpu_seconds"], color="red", linestyle=":", label="lower bound")
    ax.set_xscale("log")
    ax.set_ylim(max(0.0, min(0.8, summary["ceiling"] - 0.2)), 1.0)
    ax.set_xlabel("GPU-seconds (log)")
    ax.set_ylabel("SLO attainment")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    return save(fig, path, 100)


def run_frontier(args: Namespace) -> int:
    wall0 = time.perf_counter()
    trace = load_trace(args.trace)
    tname = Path(str(args.trace)).name
    if not args.qps:
        args.qps = TRACE_QPS.get(tname, 20.0)
    scenarios, unknown = scenario_list(args.scenario)
    strategies = list(DEFAULT_STRATEGIES) if args.strategies == "default" else args.strategies.split(",")
    if args.points < 0:
        raise SystemExit(f"--points {args.points}: 0 (each knob's own values) or more")
    unknown += [s for s in strategies if s not in KNOBS]
    if unknown:
        raise SystemExit(f"unknown scenarios/strategies {unknown}; scenarios {SCENARIOS}, strategies {sorted(KNOBS)}")
    if "ff_target_util" in gains_of(args):
        raise SystemExit("--gain ff_target_util: the frontier sweeps governor's headroom (1 / ff_target_util) itself")
    from bench.control import base_config

    capacity = replica_capacity_rps(trace, base_config(args))
    out = Path(args.out)
    summaries = []
    for sc in scenarios:
        s = run_scenario(args, sc, trace, capacity, strategies)
        s["plot"] = str(plot(s, out / f"frontier-{tname}-{sc}.png", f"{tname} / {sc}"))
        summaries.append(s)
        if not args.json:
            print(_line(s))
            print(" " * 14 + _derived_line(s))
            sys.stdout.flush()
    meta = {
        "trace": str(args.trace),
        "qps": args.qps,
        "duration_s": args.duration_s,
        "seed": args.seed,
        "replica_capacity_rps": round(capacity, 3),
        "capacity_error": args.capacity_error,
        "strategies": args.strategies,
        "setup": setup_of(args),
        "gains": gains_of(args),
        "target_share_of_ceiling": TARGET_SHARE,
        "points": args.points,
        "knobs": {k: {"knob": KNOBS[k][0], "values": list(knob_values(k, args.points))} for k in strategies},
        "runs_per_scenario": sum(len(knob_values(k, args.points)) for k in strategies),
        "wall_s": round(time.perf_counter() - wall0, 1),
    }
    text = f"plots: {out}/frontier-{tname}-<scenario>.png  ({meta['wall_s']:.0f} s)"
    publish(args, markdown(meta, summaries), {"meta": meta, "scenarios": summaries}, text)
    return 0


def markdown(meta: Mapping[str, Any], summaries: Sequence[Mapping[str, Any]]) -> str:
    """The per-scenario summary as a markdown table (what docs/benchmarks.md shows), from a run's JSON."""

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f}"

    def ratio(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}x"

    head = (
        f"`governor bench frontier --trace {Path(str(meta['trace'])).name} --qps {meta['qps']:g} "
        f"--duration-s {meta['duration_s']:g} --seed {meta['seed']}"
        + (f" --strategies {meta['strategies']}" if meta.get("strategies", "default") != "default" else "")
        + (f" --points {meta['points']}" if meta.get("points") else "")
        + setup_flags(meta.get("setup", {}))
        + gain_flags(meta.get("gains", {}))
        + f"` ({meta['wall_s']:.0f} s)\n\n"
        "| scenario | ceiling | governor GPU-s at 99.5 % of it | / oracle | / causal oracle | / lower bound "
        "| static (clairvoyant) GPU-s at 99.5 % | peer points dominated | not dominated |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---|\n"
    )
    rows = []
    for s in summaries:
        rows.append(
            f"| {s['scenario']} | {s['ceiling']:.2%} | {fmt(s['governor_gpu_seconds_at_target'])} "
            f"| {ratio(s['governor_over_oracle'])} | {ratio(s.get('governor_over_causal_oracle'))} "
            f"| {ratio(s['governor_over_lower_bound'])} | {fmt(s.get('static_gpu_seconds_at_target'))} "
            f"| {_dominance(s)} | {', '.join(s.get('not_dominated', [])) or '-'} |"
        )
    return head + "\n".join(rows) + "\n"


def _dominance(s: Mapping[str, Any]) -> str:
    """ "X of Y (share)": the peer points governor's frontier dominates, over :data:`PEERS` alone."""
    dom = len(s["dominated_by_governor"])
    peers = s.get("peer_points", dom + len(s.get("not_dominated", [])))
    return f"{dom} of {peers}" + (f" ({dom / peers:.0%})" if peers else "")


def _derived_line(s: Mapping[str, Any]) -> str:
    """The peers' default settings on this run (what a knob multiple of 1 means)."""
    parts = [f"{k} {v['setting']} {v['value']:g}" for k, v in s.get("derived_targets", {}).items()]
    return "derived/default: " + ("; ".join(parts) or "-")


def _line(s: Mapping[str, Any]) -> str:
    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f}"

    return (
        f"{s['scenario']:<13} ceiling {s['ceiling']:.2%}  lower bound {fmt(s['lower_bound_gpu_seconds'])} GPU-s  "
        f"governor @99.5% ceil {fmt(s['governor_gpu_seconds_at_target'])} GPU-s "
        f"(x{s['governor_over_oracle'] or '-'} oracle {fmt(s['oracle_gpu_seconds_at_target'])}, "
        f"x{s['governor_over_causal_oracle'] or '-'} causal oracle {fmt(s['causal_oracle_gpu_seconds_at_target'])}, "
        f"clairvoyant static {fmt(s.get('static_gpu_seconds_at_target'))}, "
        f"x{s['governor_over_lower_bound'] or '-'} bound); dominates {_dominance(s)} peer points"
        + (f", not: {', '.join(s['not_dominated'])}" if s.get("not_dominated") else "")
    )


def add_parser(sub: Any) -> None:
    bf = sub.add_parser("frontier", help="attainment vs GPU-seconds with each strategy's main knob swept")
    bf.add_argument("--trace", default="azure-conv", help="trace name (azure-conv, mooncake) or file path")
    bf.add_argument("--scenario", default="all", help="a scenario, comma-separated ones, or 'all'")
    bf.add_argument("--qps", type=float, default=0.0, help="base rate (0 = azure-conv 20, mooncake 4, else 20)")
    bf.add_argument("--duration-s", type=float, default=600.0)
    bf.add_argument(
        "--strategies", default="default", help=f"comma-separated (default: {','.join(DEFAULT_STRATEGIES)})"
    )
    bf.add_argument("--startup-s", type=float, default=30.0)
    bf.add_argument("--window-s", type=float, default=10.0)
    bf.add_argument("--seed", type=int, default=0)
    bf.add_argument(
        "--points",
        type=int,
        default=0,
        help="values per knob, spread geometrically over its span with its default among them "
        "(0 = each knob's own values: 5-7, 60 runs a scenario)",
    )
    add_capacity_error(bf)
    add_gain(bf, swept="ff_target_util")
    bf.add_argument("--out", default="runs/bench-frontier")
    bf.add_argument("--json", action="store_true")
    bf.add_argument("--markdown", default="", help="append the summary table, as markdown, to this file")
