"""``governor bench control``: every strategy on the same seeded workload, in
the fast deterministic loop (:mod:`sim.fastloop`), one table.

Columns: SLO attainment, the workload's ceiling (attainment of an unbounded
fleet) and attainment as a share of it, P50/P95/P99 end-to-end latency, P95
TTFT, GPU-seconds, waste (idle share of provisioned GPU time), scale actions
and reversals (direction changes of a zone's desired count, summed over the zones).  The summary adds the lower bound on GPU-seconds
(:mod:`sim.oracle`).  Writes a PNG per strategy (latency and replicas over
time) and, with ``--json``, prints one JSON object per strategy.

Strategies: governor's variants, every baseline of :data:`sim.baselines.BASELINES`
and ``oracle`` (:func:`sim.oracle.tuned_oracle`: knows the arrivals, service
times and faults; the cheapest headroom of its grid reaching 99.5 % of the
ceiling, or its plateau).  Warm start (default): every strategy starts at the
size ``static`` uses (the peak-minute sizing), so the first start-up period
no longer decides the gap; ``--no-warm-start`` starts every strategy but
``static`` at ``--replicas`` per zone, as before.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from argparse import Namespace
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.control_report import limits_line, markdown, table
from bench.gains import add_gain, gains_of
from core.defaults import EPS_REF
from core.vocab import default_pid_gains
from sim.fastloop import LoopConfig, RunResult, run
from sim.oracle import ceiling, lower_bound_gpu_seconds, tuned_oracle
from sim.profiling import PLANNED_SHORTFALL, profile, replica_headroom
from sim.scenarios import SCENARIOS, Scenario, build
from sim.traces import Trace, load_trace

# Per-trace SLO defaults: Mooncake prompts are ~7k tokens at the median (prefill
# alone ~0.8 s on the calibrated H100 TP8 model), so a 1 s TTFT SLO would be
# unattainable by any fleet size.
TRACE_SLOS = {"azure-conv": (1000.0, 150.0), "mooncake": (6000.0, 150.0)}


# governor with and without each part (issue: what each part buys).
GOVERNOR_VARIANTS: dict[str, dict[str, Any]] = {
    "governor": {"feedforward": True},  # everything
    "governor-kf": {"feedforward": True, "observer": True},  # + Kalman observer over the loop delay
    "governor-prior": {"feedforward": True, "learn_capacity": False},  # the profiled capacity alone, never learned
    "governor-fb": {"feedforward": False},  # feedback PID only
    "governor-fb-nodc": {"feedforward": False, "dead_time_comp": False},  # ... without delay comp.
    "governor-fpid": {
        "feedforward": True,
        "controller": "fpid",
        "pid_gains": {"kp": 0.2, "ki": 0.05, "alpha": 0.8},
    },  # PID^alpha feedback
    # N+1 zones (GOVERNOR_ZONE_REDUNDANCY=1): every zone sized so the others carry a lost one's share
    "governor-n1": {"feedforward": True, "zone_redundancy": 1},
}

ZONE_NAMES = ("az-a", "az-b", "az-c", "az-d", "az-e")
ORACLE = "oracle"


def strategy_names(selected: str) -> list[str]:
    from sim.baselines import BASELINES

    names = [*GOVERNOR_VARIANTS, *BASELINES, ORACLE]
    if selected == "all":
        return names
    wanted = [s.strip() for s in selected.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in names]
    if unknown:
        raise SystemExit(f"unknown strategies {unknown}; choose from {names}")
    return wanted


def _factory(name: str, cfg: LoopConfig, capacity: float, static_n: int, concurrency: float | None = None):  # type: ignore[no-untyped-def]
    """Per-zone constructor of baseline ``name``; ``concurrency``: KPA's and Ray Serve's per-replica target,
    derived once per model (:attr:`Setup.replica_concurrency`) so every zone gets the same one (None: each
    zone measures its own on its first windows, as before)."""
    from sim.baselines import BASELINES, KpaParams, RayServeParams

    cls = BASELINES[name]
    kwargs: dict[str, Any] = {
        "min_replicas": cfg.min_replicas,
        "max_replicas": cfg.max_replicas,
        "slo_ttft_ms": cfg.ttft_slo_ms,
        "slo_itl_ms": cfg.itl_slo_ms,
        "replica_capacity_rps": capacity,
    }
    if name == "static":
        from sim.baselines.static import StaticParams

        return lambda zone: cls(StaticParams(replicas=static_n), **kwargs)
    if name == "kpa" and concurrency is not None:
        return lambda zone: cls(KpaParams(target_concurrency=concurrency), **kwargs)
    if name == "rayserve" and concurrency is not None:
        return lambda zone: cls(RayServeParams(target_ongoing_requests=concurrency), **kwargs)
    return lambda zone: cls(**kwargs)


def peer_factory(name: str, setup: Setup):  # type: ignore[no-untyped-def]
    """Baseline ``name``'s per-zone constructor on ``setup``, its derived target the model's (one for every zone)."""
    derived = setup.replica_concurrency if name in ("kpa", "rayserve") else None
    return _factory(name, setup.cfg, setup.capacity, setup.static_n, derived)


@dataclasses.dataclass(frozen=True)
class Setup:
    """One benchmark's inputs: the loop configuration (start fleet set), the scenario and the sizing."""

    trace: Trace
    cfg: LoopConfig
    scenario: Scenario
    capacity: float  # req/s per replica every strategy that reads a profile is given (x --capacity-error)
    static_n: int  # static's replicas per zone (the warm-start size)
    warm: bool
    profiled: float = 0.0  # the profile's own value: the oracle's (it knows the truth); 0 = capacity
    headroom: float = PLANNED_SHORTFALL  # the profile's headroom governor's feedforward plans with

    @property
    def true_capacity(self) -> float:
        return self.profiled or self.capacity

    @functools.cached_property
    def replica_concurrency(self) -> float:
        """Requests in flight per replica carrying the capacity the peers are given: Little's law on one light
        profile trial at the true capacity (:func:`sim.baselines.derived.profiled_concurrency`), scaled by the
        capacity error; once per model, the same in every zone."""
        from sim.baselines.derived import profiled_concurrency

        true = self.true_capacity
        return profiled_concurrency(self.trace, self.cfg, true) * self.capacity / true


def base_config(args: Namespace) -> LoopConfig:
    """The fast-loop configuration the arguments describe (before the start fleet is set)."""
    slo = TRACE_SLOS.get(Path(str(args.trace)).name, TRACE_SLOS["azure-conv"])
    n_zones = int(getattr(args, "zones", 2))
    if not 2 <= n_zones <= len(ZONE_NAMES):
        raise SystemExit(f"--zones {n_zones}: choose 2..{len(ZONE_NAMES)}")
    return LoopConfig.of(
        initial_replicas=getattr(args, "replicas", 4),
        startup_s=args.startup_s,
        seed=args.seed,
        zones=ZONE_NAMES[:n_zones],
        balancer=getattr(args, "balancer", "uniform"),
        eps_ref=getattr(args, "eps_ref", EPS_REF),
        ttft_slo_ms=getattr(args, "ttft_slo_ms", 0.0) or slo[0],
        itl_slo_ms=getattr(args, "itl_slo_ms", 0.0) or slo[1],
        window_s=args.window_s,
        pid_gains={**default_pid_gains(), **gains_of(args)},
    )


def prepare(
    args: Namespace,
    scenario_name: str,
    trace: Trace | None = None,
    capacity: float | None = None,
    headroom: float | None = None,
) -> Setup:
    """Build the scenario, profile the capacity and headroom (unless given), size static and set the start fleet."""
    trace = trace if trace is not None else load_trace(args.trace)
    cfg = base_config(args)
    scenario = build(scenario_name, trace, args.qps, args.duration_s, cfg.zones)
    if capacity is None:
        capacity, headroom = profile(trace, cfg)
    elif headroom is None:
        headroom = replica_headroom(trace, cfg, capacity)
    profiled, capacity = capacity, capacity * float(getattr(args, "capacity_error", 1.0) or 1.0)
    peak = float(np.max(np.histogram(scenario.workload.arrival_s, bins=max(1, int(args.duration_s // 60)))[0])) / 60.0
    static_n = getattr(args, "static_replicas", 0) or max(1, int(np.ceil(peak / capacity / len(cfg.zones))))
    warm = bool(getattr(args, "warm_start", True))
    if warm:  # every strategy starts from the fleet static holds
        cfg = cfg.replace(initial_replicas=min(max(static_n, cfg.min_replicas), cfg.max_replicas))
    return Setup(trace, cfg, scenario, capacity, static_n, warm, profiled, headroom)


def run_all(
    args: Namespace, trace: Trace | None = None, capacity: float | None = None, headroom: float | None = None
) -> tuple[list[RunResult], dict[str, Any]]:
    """Every strategy of ``args.strategies`` on ``args.scenario`` (the trace and its profile loaded
    and measured here unless given) and the run's meta."""
    setup = prepare(args, args.scenario, trace, capacity, headroom)
    cfg, scenario, capacity, static_n, warm = setup.cfg, setup.scenario, setup.capacity, setup.static_n, setup.warm
    ceil = ceiling(scenario.workload, cfg)
    results = []
    oracle_info: dict[str, Any] = {}
    for name in strategy_names(args.strategies):
        run_cfg = cfg
        if name == ORACLE:
            h, res, tried = tuned_oracle(
                scenario.workload, cfg, setup.true_capacity, scenario.faults, scenario.duration_s
            )
            oracle_info = {"oracle_headroom": h, "oracle_tried": [list(t) for t in tried]}
            results.append(res)
            continue
        if name in GOVERNOR_VARIANTS:
            # feedforward is sized by the same profiled capacity static and Dynamo are given
            variant = dict(GOVERNOR_VARIANTS[name])
            use_ff = variant.pop("feedforward")
            if "pid_gains" in variant:  # the variant's own gains, under what --gain sets
                variant["pid_gains"] = {**variant["pid_gains"], **gains_of(args)}
            run_cfg = cfg.replace(
                replica_capacity_rps=capacity if use_ff else None,
                replica_headroom=setup.headroom if use_ff else None,
                **variant,
            )
            strat: Any = "governor"
        else:
            strat = peer_factory(name, setup)
        results.append(run(strat, scenario.workload, run_cfg, scenario.faults, scenario.duration_s, name=name))
    for r in results:
        att = r.metrics.get("slo_attainment")
        r.metrics["ceiling"] = round(ceil, 5)
        r.metrics["attainment_over_ceiling"] = round(att / ceil, 5) if att is not None and ceil > 0 else None
    meta = {
        "trace": str(args.trace),
        "scenario": args.scenario,
        "qps": args.qps,
        "duration_s": args.duration_s,
        "seed": args.seed,
        "requests": len(scenario.workload),
        "replica_capacity_rps": round(capacity, 3),
        "capacity_error": round(capacity / setup.true_capacity, 3),
        "replica_headroom": round(setup.headroom, 3),
        "static_replicas_per_zone": static_n,
        "ttft_slo_ms": cfg.ttft_slo_ms,
        "itl_slo_ms": cfg.itl_slo_ms,
        "startup_s": cfg.startup_s,
        "window_s": cfg.window_s,
        "eps_ref": cfg.eps_ref,
        "gains": gains_of(args),  # --gain: governor's gains over the shipped ones ({} = as shipped)
        "zones": list(cfg.zones),
        "balancer": cfg.balancer,
        "warm_start": warm,
        "initial_replicas_per_zone": cfg.initial_replicas,
        "ceiling": round(ceil, 5),
        "ceiling_prefix_cache": round(ceiling(scenario.workload, cfg, prefix_cache=True), 5),
        "lower_bound_gpu_seconds": round(lower_bound_gpu_seconds(scenario.workload, cfg), 1),
        **oracle_info,
    }
    return results, meta


def plot(result: RunResult, path: Path, ttft_slo_ms: float, zones: Sequence[str]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.report import latency_panel, replicas_panel, save
    from sim.fastloop import EPOCH_MS0

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    latency_panel(
        ax1,
        result.finished,
        EPOCH_MS0,
        ttft_slo_ms,
        f"{result.strategy}: attainment {result.metrics['slo_attainment']:.2%}, "
        f"{result.metrics['gpu_seconds']:,.0f} GPU-s",
    )
    ts = result.timeline["t_s"]
    replicas_panel(ax2, {z: (ts, result.timeline[f"{z}.ready"], result.timeline[f"{z}.desired"]) for z in zones})
    return save(fig, path, 100)


def run_bench(args: Namespace) -> int:
    results, meta = run_all(args)
    out = Path(args.out)
    cfg_zones = tuple(meta["zones"])
    plots = {
        r.strategy: str(plot(r, out / f"{args.scenario}-{r.strategy}.png", meta["ttft_slo_ms"], cfg_zones))
        for r in results
    }
    if args.markdown:
        with open(args.markdown, "a") as fh:
            fh.write(markdown(results, meta, args) + "\n")
    if args.json:
        print(
            json.dumps(
                {
                    "meta": meta,
                    "strategies": [{"strategy": r.strategy, **r.metrics, "plot": plots[r.strategy]} for r in results],
                }
            )
        )
        return 0
    print(
        f"trace {meta['trace']}  scenario {meta['scenario']}  base {meta['qps']} QPS  "
        f"{meta['duration_s']:.0f} s  {meta['requests']:,} requests  seed {meta['seed']}"
    )
    print(
        f"SLO: TTFT <= {meta['ttft_slo_ms']:.0f} ms and ITL <= {meta['itl_slo_ms']:.0f} ms; "
        f"profiled capacity {meta['replica_capacity_rps']} req/s per replica"
        + (f" ({meta['capacity_error']}x the measured one)" if meta["capacity_error"] != 1.0 else "")
        + f", headroom {meta['replica_headroom']}; static = {meta['static_replicas_per_zone']} per zone; start-up {meta['startup_s']:.0f} s; "
        f"{len(meta['zones'])} zones, {meta['balancer']} balancer"
    )
    print(limits_line(meta))
    print(table(results))
    print(f"plots: {out}/{args.scenario}-<strategy>.png")
    sys.stdout.flush()
    return 0


def add_parser(sub: Any) -> None:
    bc = sub.add_parser("control", help="every autoscaler on the same seeded workload (fast simulator)")
    bc.add_argument("--trace", default="azure-conv", help="trace name (azure-conv, mooncake) or file path")
    bc.add_argument("--scenario", default="step", choices=SCENARIOS)
    bc.add_argument("--qps", type=float, default=20.0, help="base request rate")
    bc.add_argument("--duration-s", type=float, default=1800.0)
    bc.add_argument("--strategies", default="all", help="comma-separated, or 'all'")
    bc.add_argument(
        "--replicas",
        type=int,
        default=4,
        help="initial replicas per zone of every strategy but static (--no-warm-start)",
    )
    bc.add_argument(
        "--warm-start",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="every strategy starts at static's size (default); --no-warm-start: at --replicas, as before",
    )
    bc.add_argument(
        "--static-replicas",
        type=int,
        default=0,
        help="replicas per zone of the static baseline (0 = sized for the peak minute)",
    )
    bc.add_argument("--zones", type=int, default=2, help="number of zones (2..5)")
    bc.add_argument(
        "--balancer",
        default="uniform",
        choices=("uniform", "health"),
        help="global balancer: uniform over reachable zones, or also skip zones with "
        "no ready replica (governor steers it by its zone weights either way)",
    )
    bc.add_argument("--startup-s", type=float, default=30.0)
    bc.add_argument("--window-s", type=float, default=10.0)
    bc.add_argument("--ttft-slo-ms", type=float, default=0.0, help="0 = the trace's default")
    bc.add_argument("--itl-slo-ms", type=float, default=0.0, help="0 = the trace's default")
    bc.add_argument("--seed", type=int, default=0)
    bc.add_argument(
        "--eps-ref", type=float, default=0.02, help="violation-rate reference of governor's PID (seed: 0.02)"
    )
    add_capacity_error(bc)
    add_gain(bc)
    bc.add_argument("--out", default="runs/bench-control")
    bc.add_argument("--json", action="store_true")
    bc.add_argument("--markdown", default="", help="append the table, as markdown, to this file")


def add_capacity_error(parser: Any) -> None:
    parser.add_argument(
        "--capacity-error",
        type=float,
        default=1.0,
        help="the profile every strategy is given, as a multiple of the measured one (e.g. 0.4 or 2.5: a profile "
        "made on another workload); the oracles keep the truth",
    )
