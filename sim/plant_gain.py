"""The plant's static gain around an operating point, measured on the fast
simulator: ``b = -d eps / d log(replicas)`` at a steady load (docs/model.md
§22 (certified)), the number :mod:`controllers.stability` linearises with.

A fixed fleet of ``replicas`` replicas serves a trace at a steady rate
(:func:`sim.profiling.attainment_at`, seeded).  The operating point is the
rate ``q*`` at which the violation rate equals ``eps_ref`` (bisection): the
loop settles there.  The violation rate of a homogeneous fleet depends on the
load *per replica*, so raising the replicas by a factor ``e^h`` is lowering
the rate by ``e^-h``; the fleet size is an integer, the rate is not, so the
derivative is taken on the rate::

    b = (eps(q* e^h) - eps(q* e^-h)) / (2 h)      h = 0.05 (5 %: one replica in 20)

averaged over seeds.  The plant is far from linear there (the queue's knee:
violations jump from ~0 to most requests within 10 % of load), so ``b`` is a
secant over +-``h``; the gain margin of the certificate says how much steeper
it may be.

The gain is not one number: it depends on the secant's width, on the trace
(its prompt and output lengths set the service time and the queue's knee) and
on the fleet size (a larger fleet pools the queueing).  :func:`measure_range`
takes it at several operating points, both traces, a few fleet sizes and the
three secant widths, and reports the interval the certificate must hold over
(``bench.analyze_gains.PLANT_GAIN_RANGE``).

``python -m sim.plant_gain`` prints the numbers docs/model.md quotes;
``python -m sim.plant_gain --range`` the interval.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from core.defaults import EPS_REF
from sim.fastloop import LoopConfig
from sim.profiling import attainment_at
from sim.traces import load_trace

__all__ = ["PlantGain", "measure_plant_gain", "measure_range", "violation_rate"]

#: The TTFT SLO per trace, as ``bench control`` runs it (bench.control.TRACE_SLOS; sim may not import bench).
TRACE_TTFT_SLO_MS = {"azure-conv": 1000.0, "mooncake": 6000.0}


@dataclass(frozen=True)
class PlantGain:
    """The measured operating point and gain."""

    trace: str
    replicas: int
    qps: float
    eps: float
    plant_gain: float
    step: float
    duration_s: float
    seeds: tuple[int, ...]
    reached: bool = True  # False: eps stays above eps_ref even at the lowest rate tried (no operating point)


def violation_rate(trace_name: str, qps: float, replicas: int, duration_s: float, seeds: tuple[int, ...]) -> float:
    """Mean violation rate of ``replicas`` fixed replicas at ``qps`` over ``seeds`` (the trace's TTFT SLO)."""
    trace = load_trace(trace_name)
    slo = TRACE_TTFT_SLO_MS.get(trace_name, TRACE_TTFT_SLO_MS["azure-conv"])
    return sum(
        1.0 - attainment_at(trace, qps, replicas, LoopConfig.of(seed=s, ttft_slo_ms=slo), duration_s) for s in seeds
    ) / len(seeds)


def measure_plant_gain(
    trace_name: str = "azure-conv",
    *,
    replicas: int = 4,
    eps_ref: float = EPS_REF,
    step: float = 0.05,
    duration_s: float = 600.0,
    seeds: tuple[int, ...] = (0, 1, 2),
    iters: int = 12,
) -> PlantGain:
    """Operating point and ``b`` (see the module docstring)."""
    if replicas < 1 or not 0.0 < eps_ref < 1.0 or not 0.0 < step < 1.0 or not seeds:
        raise ValueError("need replicas >= 1, 0 < eps_ref < 1, 0 < step < 1 and at least one seed")

    def eps(q: float) -> float:
        return violation_rate(trace_name, q, replicas, duration_s, seeds)

    lo, hi = 0.1 * replicas, 20.0 * replicas
    reached = eps(lo) <= eps_ref
    for _ in range(iters):
        mid = math.sqrt(lo * hi)
        if eps(mid) <= eps_ref:
            lo = mid
        else:
            hi = mid
    q = math.sqrt(lo * hi)
    b = (eps(q * math.exp(step)) - eps(q * math.exp(-step))) / (2.0 * step)
    return PlantGain(trace_name, replicas, q, eps(q), b, step, duration_s, seeds, reached)


def measure_range(
    traces: tuple[str, ...] = ("azure-conv", "mooncake"),
    replicas: tuple[int, ...] = (4, 8, 16),
    steps: tuple[float, ...] = (0.02, 0.05, 0.1),
    *,
    duration_s: float = 600.0,
    seeds: tuple[int, ...] = (0, 1, 2),
) -> list[PlantGain]:
    """``b`` at every (trace, fleet size, secant width) that has an operating point
    (``reached``): the interval is their min and max.  Fleets of 4 and more: at 2
    replicas one replica is half the fleet, far outside the small-signal model."""
    return [
        measure_plant_gain(t, replicas=n, step=h, duration_s=duration_s, seeds=seeds)
        for t in traces
        for n in replicas
        for h in steps
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.plant_gain", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="azure-conv")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--step", type=float, default=0.05)
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--range", action="store_true", help="both traces, 2/4/8 replicas, three widths: the interval")
    args = ap.parse_args(argv)
    if args.range:
        found = measure_range(duration_s=args.duration_s)
        for pg in found:
            print(
                f"trace {pg.trace:<10}  replicas {pg.replicas}  operating point {pg.qps:.2f} req/s "
                f"(eps {pg.eps:.4f})  step {pg.step:.2f}  b = {pg.plant_gain:.3f}"
                + ("" if pg.reached else "  (no operating point: eps > eps_ref at any rate; left out)")
            )
        bs = [pg.plant_gain for pg in found if pg.reached]
        print(f"plant gain range: {min(bs):.3f} - {max(bs):.3f}")
        return 0
    for step in sorted({args.step, 0.02, 0.1}):
        pg = measure_plant_gain(args.trace, replicas=args.replicas, step=step, duration_s=args.duration_s)
        print(
            f"trace {pg.trace}  replicas {pg.replicas}  operating point {pg.qps:.2f} req/s "
            f"(eps {pg.eps:.4f})  step {pg.step:.2f}  b = {pg.plant_gain:.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
