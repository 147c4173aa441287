"""``governor bench traffic``: routing, breaker, canary and agent weights, A/B in one run.

Every scenario runs its arms on the same seeded workload (same arrivals,
classes and token counts) and the same fixed replicas, so the GPU-seconds
of the arms are equal; only the traffic policy differs.  The controlled arms
run the product (:class:`bench.traffic_sim.LoopPolicy`): the stream
worker's control loop makes ``window_s`` windows from the fleet's telemetry
and decides with its drivers; their commands reach the simulated gateway as
an executor applies them.

* ``routing``: latency spikes (``Fleet.inject_latency_spike``: the design
  source's injected I/O delays, docs/model.md §19 (sim)) on the primary
  ``bloom-176b`` in ``az-a``.  Arms:
  ``static-primary`` (weights by capacity over the primary's zones, the
  fallback replicas idle), ``static-all`` (by capacity over every target),
  ``routing`` (the worker's ``RoutingDriver``: gathered windows of both
  variants, a ``route`` command when a weight moved by over 5 % or a class
  entered or left fallback to ``llama2-70b``, the scaler's rate forecast).
  ``fallback_share``: the share of requests the smaller model served.
* ``breaker``: ``az-a``'s primary returns errors at ``--error-rate`` for a
  while.  Arms: ``no-breaker`` (static to the primary, by capacity),
  ``routing-only`` (the loop, its breaker never opening: a minimum of 10^9
  requests) and ``breaker``
  (the loop: the worker's ``BreakerDriver`` per target feeding the router,
  half-open probes counted by the gateway).
* ``canary``: a ``llama2-70b@v2`` with 2 % errors, a P99 over 800 ms, 5x
  stable's TTFT, or healthy, rolled out 1 -> 5 -> 20 -> 100 %.  Arms:
  ``big-bang`` (100 % at the start), ``canary`` (the canary driver's steps on
  the loop's windows) and ``canary-abs`` (without the rule relative to stable).
* ``agents``: agent turns take the RAG, tool or plain-LLM path drawn from
  the weights the loop's ``agents`` commands publish (dynamic) or 1:1:1
  (static); see :func:`agent_turn_calls`.

On-time delivery: a request meets its class's SLO (TTFT, and e2e where the
class has one) and did not fail; classes as in :data:`controllers.routing_model.DEFAULT_CLASSES`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from bench.agents import agent_turn_calls, scenario_agents
from bench.canary import scenario_canary
from bench.traffic_sim import (
    FALLBACK,
    PRIMARY,
    ZONES,
    LoopPolicy,
    Policy,
    _fleet,
    _gpu_seconds,
    _row,
    _setup_replicas,
    capacity_rps,
    run_arm,
    static_policy,
    summarize,
    workload,
)
from core.settings import ModelSpec, Settings
from sim.fleet import Fleet

__all__ = [
    "SCENARIOS",
    "add_parser",
    "agent_turn_calls",
    "run_traffic_bench",
    "scenario_agents",
    "scenario_breaker",
    "scenario_canary",
    "scenario_routing",
]


# -- scenarios ---------------------------------------------------------------------------
def _two_variants(args: argparse.Namespace) -> tuple[Any, ...]:
    """What the routing and breaker scenarios share: primary + fallback in every zone."""
    replicas = {PRIMARY: args.primary_replicas, FALLBACK: args.fallback_replicas}
    cfg = _fleet({PRIMARY: PRIMARY, FALLBACK: FALLBACK}, replicas, args.seed)
    arr = workload(args.rate, args.duration_s, args.seed)
    caps = {f"{m}|{z}": capacity_rps(cfg.models[m], n) for m, n in replicas.items() for z in ZONES}
    base = _setup_replicas(replicas)
    return replicas, cfg, arr, caps, base


def loop_settings(args: argparse.Namespace, cfg: Any, replicas: dict[str, int], breaker_min_requests: int) -> Settings:
    """The worker's settings for the family ``PRIMARY=FALLBACK`` on the fixed fleet.

    Each model's per-replica capacity is the harness's (:func:`capacity_rps`), the
    router's capacity input; its replica bounds are the fixed count.
    """
    models = tuple(
        ModelSpec(m, min_replicas=n, max_replicas=n, replica_capacity_rps=capacity_rps(cfg.models[m], 1))
        for m, n in replicas.items()
    )
    return Settings(
        models=models,
        zones=ZONES,
        fallbacks=((PRIMARY, FALLBACK),),
        window_s=args.window_s,
        breaker_min_requests=breaker_min_requests,
    )


def fallback_windows(pol: LoopPolicy, duration_s: float, window_s: float) -> dict[str, int]:
    """Per class, the windows that ended with the class in fallback (by the last route command applied)."""
    routes = pol.applied("route")
    out: dict[str, int] = {}
    for k in range(1, int(duration_s // window_s) + 1):
        last = [c for t, c in routes if t <= k * window_s]
        for c in last[-1].payload["fallback"] if last else ():
            out[c] = out.get(c, 0) + 1
    return out


def scenario_routing(args: argparse.Namespace) -> dict[str, Any]:
    replicas, cfg, arr, caps, base = _two_variants(args)

    def setup(f: Fleet) -> None:
        base(f)
        for k in range(args.spikes):
            start = args.spike_start_s + k * args.spike_every_s
            f.inject_latency_spike("az-a", PRIMARY, args.spike_fraction, args.spike_factor, start, args.spike_s)

    prim = {t: c for t, c in caps.items() if t.startswith(f"{PRIMARY}|")}
    # The breaker never opens here (no errors); it runs as in the worker.
    ctl = LoopPolicy(loop_settings(args, cfg, replicas, args.breaker_min_requests))
    arms: dict[str, tuple[dict[str, float], Policy]] = {
        "static-primary": (prim, static_policy),
        "static-all": (caps, static_policy),
        "routing": (prim, ctl),
    }
    horizon = args.duration_s + 300.0
    res = {}
    for name, (routes, pol) in arms.items():
        recs, _ = run_arm(cfg, arr, args.duration_s, setup, routes, pol)
        res[name] = summarize(recs, _gpu_seconds(cfg, replicas, horizon), len(arr))
        # what the arm paid in quality: requests served by the smaller model
        res[name]["fallback_share"] = sum(r["model"] == FALLBACK for r in recs) / max(1, len(recs))
    res["routing"]["fallback_windows"] = fallback_windows(ctl, args.duration_s, args.window_s)
    res["routing"]["route_commands"] = len(ctl.applied("route"))
    b = res["routing"]
    for base_arm, suffix in (("static-primary", ""), ("static-all", "_vs_static_all")):
        a = res[base_arm]
        res[f"p95_ttft_cut{suffix}_ms"] = a["ttft_p95_ms"] - b["ttft_p95_ms"]
        res[f"p99_ttft_cut{suffix}_ms"] = a["ttft_p99_ms"] - b["ttft_p99_ms"]
        res[f"p95_e2e_cut{suffix}_ms"] = a["e2e_p95_ms"] - b["e2e_p95_ms"]
    return res


def scenario_breaker(args: argparse.Namespace) -> dict[str, Any]:
    replicas, cfg, arr, caps, base = _two_variants(args)

    def setup(f: Fleet) -> None:
        base(f)
        f.inject_errors("az-a", PRIMARY, args.error_rate, args.fault_start_s, args.fault_s)

    prim = {t: c for t, c in caps.items() if t.startswith(f"{PRIMARY}|")}
    never = 10**9  # requests a breaker window must exceed: never
    ctl_nb = LoopPolicy(loop_settings(args, cfg, replicas, never))
    ctl = LoopPolicy(loop_settings(args, cfg, replicas, args.breaker_min_requests))
    arms: dict[str, tuple[dict[str, float], Policy]] = {
        "no-breaker": (prim, static_policy),
        "routing-only": (prim, ctl_nb),
        "breaker": (prim, ctl),
    }
    res: dict[str, Any] = {}
    for name, (routes, pol) in arms.items():
        recs, _ = run_arm(cfg, arr, args.duration_s, setup, routes, pol)
        res[name] = summarize(recs, _gpu_seconds(cfg, replicas, args.duration_s + 300), len(arr))
        res[name]["errors"] = sum(r.get("status") == "error" for r in recs)
    res["breaker"]["timeline"] = [
        {"t_s": t, "target": c.payload["target"], "state": c.payload["state"], "reason": c.reason}
        for t, c in ctl.applied("breaker")
    ]
    return res


SCENARIOS = {
    "routing": scenario_routing,
    "breaker": scenario_breaker,
    "canary": scenario_canary,
    "agents": scenario_agents,
}


def add_parser(sub: Any) -> None:
    """Register ``traffic`` under ``governor bench``."""
    b = sub.add_parser("traffic", help="routing/fallback, breaker, canary, agent weights: A/B in one run")
    b.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--duration-s", type=float, default=600.0)
    b.add_argument("--window-s", type=float, default=10.0)
    b.add_argument("--rate", type=float, default=8.0, help="routing/breaker arrival rate (rps)")
    b.add_argument("--primary-replicas", type=int, default=3, help="per zone")
    b.add_argument("--fallback-replicas", type=int, default=1, help="per zone")
    b.add_argument("--spikes", type=int, default=2)
    b.add_argument("--spike-start-s", type=float, default=120.0)
    b.add_argument("--spike-every-s", type=float, default=240.0)
    b.add_argument("--spike-s", type=float, default=120.0)
    b.add_argument("--spike-fraction", type=float, default=1.0)
    b.add_argument("--spike-factor", type=float, default=4.0)
    b.add_argument("--error-rate", type=float, default=0.05)
    b.add_argument("--fault-start-s", type=float, default=120.0)
    b.add_argument("--fault-s", type=float, default=300.0)
    b.add_argument("--canary-rate", type=float, default=40.0)
    b.add_argument("--canary-duration-s", type=float, default=1500.0)
    b.add_argument(
        "--breaker-min-requests",
        type=int,
        default=100,
        help="scaled to the per-target rate (design source: 1000, docs/model.md §13 (breaker))",
    )
    b.add_argument("--canary-replicas", type=int, default=4, help="per zone and version")
    b.add_argument("--canary-start-s", type=float, default=30.0)
    b.add_argument("--hold-s", type=float, default=60.0)
    b.add_argument("--min-stage-requests", type=int, default=250)
    b.add_argument("--canary-error-rate", type=float, default=0.02)
    b.add_argument(
        "--canary-latency-factor",
        type=float,
        default=5.0,
        help="TTFT factor of the 'slow' version (P99 under 800 ms at low load)",
    )
    b.add_argument(
        "--canary-p99-factor",
        type=float,
        default=8.0,
        help="TTFT factor of the 'p99' version (P99 over 800 ms at any load)",
    )
    b.add_argument("--agent-rate", type=float, default=6.0, help="agent turns per second")
    b.add_argument("--agent-conversations", type=int, default=200)
    b.add_argument("--agent-replicas", type=int, default=4)
    b.add_argument("--agent-deadline-ms", type=float, default=12_000.0)
    b.add_argument("--json", action="store_true")


def _print(name: str, res: dict[str, Any]) -> None:
    print(f"== {name}")
    for arm, s in res.items():
        if isinstance(s, dict) and "ttft_p95_ms" in s:
            print(_row(arm, s))
            extra = {
                k: v
                for k, v in s.items()
                if k.startswith("v2_") or k in ("final", "rollout_s", "errors", "fallback_windows", "fallback_share")
            }
            if extra:
                print("      " + json.dumps(extra, default=float))
            for ev in s.get("events", []) + s.get("timeline", []):
                print("      " + json.dumps(ev))
        elif isinstance(s, dict):
            print(f"  {arm:15s} " + json.dumps(s, default=float))
        else:
            print(f"  {arm}: {s:.1f}")


def run_traffic_bench(args: argparse.Namespace) -> int:
    """Run the chosen scenarios; print a table per scenario (or JSON with ``--json``)."""
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    out = {n: SCENARIOS[n](args) for n in names}
    if args.json:
        print(json.dumps(out, indent=2, default=float))
    else:
        for n, res in out.items():
            _print(n, res)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="governor bench")
    add_parser(p.add_subparsers(dest="bench", required=True))
    return run_traffic_bench(p.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
