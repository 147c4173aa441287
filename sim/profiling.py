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

PROFILE_DURATION_S = 300.0  # a profile trial's shortest length ...
PROFILE_MIN_REQUESTS = 2000  # ... and its fewest arrivals (attainment to ~0.4 points)
PLANNED_SHORTFALL = 1.25  # the overload a replica short covers: one of five starting or lost
OVERLOAD_KEEP = 0.95  # share of the idle fleet's attainment an overload may cost while it lasts
OVERLOAD_STEP = 0.05  # the grid of load factors the headroom's trials walk


def attainment_at(trace: Trace, qps: float, replicas: int, cfg: LoopConfig, duration_s: float) -> float:
    """SLO attainment of ``replicas`` replicas fed ``trace`` at ``qps`` for ``duration_s`` (then 600 s to drain).

    A request still unserved when the drain ends counts as a miss: at a rate far beyond what the
    replicas serve, the ones that finished are not the workload (an overloaded trial used to read
    as the attainment of its lucky early requests, and a trial with nothing finished as 1.0).
    """
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
    if not len(w):
        return 1.0
    ok = sum(1 for r in done if r["ttft_ms"] <= cfg.ttft_slo_ms and r["itl_ms"] <= cfg.itl_slo_ms)
    return ok / len(w)


def _span(qps: float, duration_s: float, min_requests: int) -> float:
    """A trial long enough for ``min_requests`` arrivals at ``qps`` (attainment to ~0.4 points), at least ``duration_s``."""
    return max(duration_s, min_requests / qps)


def idle_attainment(trace: Trace, cfg: LoopConfig, replicas: int, duration_s: float, min_requests: int) -> float:
    """Attainment of an almost idle fleet (0.1 req/s per replica): what load cannot improve."""
    lo = 0.1 * replicas
    return attainment_at(trace, lo, replicas, cfg, max(duration_s * 4, _span(lo, duration_s, min_requests)))


def replica_capacity_rps(
    trace: Trace,
    cfg: LoopConfig | None = None,
    *,
    replicas: int = 4,
    target: float = 0.98,
    duration_s: float = PROFILE_DURATION_S,
    iters: int = 12,
    min_requests: int = PROFILE_MIN_REQUESTS,
    idle: float | None = None,
) -> float:
    """Requests/s one replica sustains with attainment >= ``target`` (bisection).

    Some requests miss the SLO at any load (a Mooncake prompt of 85k tokens
    takes longer than a 6 s TTFT SLO to prefill on an idle replica), so the
    target is capped at the attainment an almost idle fleet reaches, minus
    one point: capacity is the load the fleet carries without *load* adding
    violations.  ``idle``: that attainment when the caller has it already
    (:func:`idle_attainment` with the same arguments), so it is not run twice.
    """
    cfg = cfg or LoopConfig()
    lo, hi = 0.1 * replicas, 20.0 * replicas
    if idle is None:
        idle = idle_attainment(trace, cfg, replicas, duration_s, min_requests)
    target = min(target, idle - 0.01)
    for _ in range(iters):
        mid = math.sqrt(lo * hi)  # geometric: the same relative resolution at any capacity
        if attainment_at(trace, mid, replicas, cfg, _span(mid, duration_s, min_requests)) >= target:
            lo = mid
        else:
            hi = mid
    return lo / replicas


def overload_curve(
    trace: Trace,
    cfg: LoopConfig,
    capacity_rps: float,
    factors: tuple[float, ...],
    *,
    replicas: int = 4,
    duration_s: float = PROFILE_DURATION_S,
    min_requests: int = PROFILE_MIN_REQUESTS,
    idle: float | None = None,
) -> tuple[float, list[tuple[float, float, float]]]:
    """What running above (or below) the profiled capacity costs: ``(idle attainment, [(factor,
    attainment, share of idle)])`` for the fleet fed ``factor x capacity_rps`` per replica.

    The capacity is one point on a curve.  Its shape past that point decides
    how much a short shortfall costs (a replica starting late, a forecast
    that ran behind): where attainment falls off a cliff just past the
    capacity, any shortfall costs violations at once and the fleet needs
    headroom; where it slopes, the queue and the batches absorb a shortfall.
    Each trial is the profile's (same fleet, seed and trial length: at least
    ``min_requests`` arrivals), so the curve at 1.0 is what the bisection
    accepted.  ``idle`` as for :func:`replica_capacity_rps`.
    """
    if idle is None:
        idle = idle_attainment(trace, cfg, replicas, duration_s, min_requests)
    points = []
    for f in factors:
        if not math.isfinite(f) or f <= 0.0:
            raise ValueError(f"load factor {f!r}: must be a positive number")
        qps = f * capacity_rps * replicas
        a = attainment_at(trace, qps, replicas, cfg, _span(qps, duration_s, min_requests))
        points.append((f, a, a / idle if idle > 0 else 0.0))
    return idle, points


def replica_headroom(
    trace: Trace,
    cfg: LoopConfig,
    capacity_rps: float,
    *,
    replicas: int = 4,
    shortfall: float = PLANNED_SHORTFALL,
    keep: float = OVERLOAD_KEEP,
    step: float = OVERLOAD_STEP,
    idle: float | None = None,
) -> float:
    """The headroom the feedforward plans with: ``shortfall / tolerated``, at least 1.

    A fleet sized at its capacity runs over it whenever it is a replica short
    (one starting or lost: ``shortfall`` 1.25 is one of five) or the demand
    runs ahead of the forecast.  What that costs is the curve past the
    capacity (:func:`overload_curve`): ``tolerated`` is the load factor, up
    to ``shortfall``, at which the profile fleet's attainment falls to
    ``keep`` (95 %) of the idle fleet's.  The trials walk up the ``step``
    grid from 1 and stop at the first factor under it; the crossing is
    linear between that trial and the one before (the capacity itself, 1.0,
    when the first step is already under).  Where attainment falls
    off a cliff just past the capacity (Azure conversation: under 80 % of
    idle at 1.05x), almost nothing is tolerated and the headroom is almost the
    whole shortfall (1.24-1.25); where the queue absorbs it within the SLO (Mooncake, 6 s
    TTFT: 95-97 % at 1.25x on most seeds), little or none is needed.  The
    trials are the profile's (same fleet, seed and length), one per factor
    walked (and the capacity's on a cliff): two on a cliff, five on a slope.
    """
    if not (math.isfinite(shortfall) and shortfall >= 1.0 and math.isfinite(step) and step > 0.0):
        raise ValueError(f"shortfall={shortfall!r}, step={step!r}: need shortfall >= 1 and step > 0")
    factors = []
    f = 1.0 + step
    while f <= shortfall + 1e-9:
        factors.append(round(f, 6))
        f += step
    if idle is None:
        idle = idle_attainment(trace, cfg, replicas, PROFILE_DURATION_S, PROFILE_MIN_REQUESTS)
    tolerated, last = 1.0, None
    for f in factors:
        _, points = overload_curve(trace, cfg, capacity_rps, (f,), replicas=replicas, idle=idle)
        share = points[0][2]
        if share < keep:  # the crossing, linear between the last factor kept and this one
            if last is None:
                last = overload_curve(trace, cfg, capacity_rps, (tolerated,), replicas=replicas, idle=idle)[1][0][2]
            if last > keep:
                tolerated += (f - tolerated) * (last - keep) / (last - share)
            break
        tolerated, last = f, share
    return max(1.0, shortfall / tolerated)


def profile(trace: Trace, cfg: LoopConfig | None = None, *, replicas: int = 4) -> tuple[float, float]:
    """``(capacity req/s per replica, headroom)``: :func:`replica_capacity_rps` and
    :func:`replica_headroom` on one idle-fleet trial."""
    cfg = cfg or LoopConfig()
    idle = idle_attainment(trace, cfg, replicas, PROFILE_DURATION_S, PROFILE_MIN_REQUESTS)
    capacity = replica_capacity_rps(trace, cfg, replicas=replicas, idle=idle)
    return capacity, replica_headroom(trace, cfg, capacity, replicas=replicas, idle=idle)
