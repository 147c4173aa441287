"""Pre-deployment profiling: how many requests per second one replica serves
within the SLO on a given trace -- what Dynamo's planner takes from its
profiling step, and what a capacity planner sizes a static fleet with.

Bisection over the offered rate on a fixed fleet in the fast simulator
(seeded), accepting a rate when SLO attainment stays >= ``target``.  The
bisection is geometric (the midpoint of ``lo`` and ``hi`` is their geometric
mean): the search range spans 200x, and halving it in linear steps left a
low capacity with a coarse bracket (eight linear steps put Mooncake's at
0.178 req/s in a bracket up to 0.255), while twelve
geometric steps give every capacity the same ~0.1 % relative resolution.
Each trial lasts long enough for ``min_requests`` arrivals (at least
``duration_s``): a low-rate trace's 300 s trial held ~270 requests, one
miss moved attainment 0.4 point, and on seed 1 every Mooncake rate failed and
the search returned its floor (0.1 req/s, half the truth).
"""

from __future__ import annotations

import math

from sim.fastloop import LoopConfig
from sim.fleet import Fleet, FleetConfig
from sim.perf_model import PerfModel
from sim.traces import Trace
from sim.workloads import from_trace


def attainment_at(trace: Trace, qps: float, replicas: int, cfg: LoopConfig, duration_s: float) -> float:
    perf = PerfModel.from_splitwise(model=cfg.model, hardware=cfg.hardware, tensor_parallel=cfg.tensor_parallel)
    fleet = Fleet(
        FleetConfig(models={cfg.model: perf}, zones=("profile",), initial_replicas=replicas, seed=cfg.seed), epoch_ms0=0
    )
    w = from_trace(trace, qps, duration_s)
    for i in range(len(w)):
        fleet.submit(
            float(w.arrival_s[i]), "profile", cfg.model, int(w.prompt_tokens[i]), int(w.output_tokens[i]), f"p{i}"
        )
    done = fleet.advance_to(duration_s + 600.0)
    if not done:
        return 1.0
    ok = sum(1 for r in done if r["ttft_ms"] <= cfg.ttft_slo_ms and r["itl_ms"] <= cfg.itl_slo_ms)
    return ok / len(done)


def replica_capacity_rps(
    trace: Trace,
    cfg: LoopConfig | None = None,
    *,
    replicas: int = 4,
    target: float = 0.98,
    duration_s: float = 300.0,
    iters: int = 12,
    min_requests: int = 2000,
) -> float:
    """Requests/s one replica sustains with attainment >= ``target`` (bisection).

    Some requests miss the SLO at any load (a Mooncake prompt of 85k tokens
    takes longer than a 6 s TTFT SLO to prefill on an idle replica), so the
    target is capped at the attainment an almost idle fleet reaches, minus
    one point: capacity is the load the fleet carries without *load* adding
    violations.
    """
    cfg = cfg or LoopConfig()
    lo, hi = 0.1 * replicas, 20.0 * replicas

    def span(qps: float) -> float:  # long enough for min_requests arrivals: attainment to ~0.4 points
        return max(duration_s, min_requests / qps)

    target = min(target, attainment_at(trace, lo, replicas, cfg, max(duration_s * 4, span(lo))) - 0.01)
    for _ in range(iters):
        mid = math.sqrt(lo * hi)  # geometric: the same relative resolution at any capacity
        if attainment_at(trace, mid, replicas, cfg, span(mid)) >= target:
            lo = mid
        else:
            hi = mid
    return lo / replicas
