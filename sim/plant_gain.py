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

``python -m sim.plant_gain`` prints the numbers docs/model.md quotes.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from core.defaults import EPS_REF
from sim.fastloop import LoopConfig
from sim.profiling import attainment_at
from sim.traces import load_trace

__all__ = ["PlantGain", "measure_plant_gain", "violation_rate"]


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


def violation_rate(trace_name: str, qps: float, replicas: int, duration_s: float, seeds: tuple[int, ...]) -> float:
    """Mean violation rate of ``replicas`` fixed replicas at ``qps`` over ``seeds``."""
    trace = load_trace(trace_name)
    return sum(1.0 - attainment_at(trace, qps, replicas, LoopConfig.of(seed=s), duration_s) for s in seeds) / len(seeds)


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
    for _ in range(iters):
        mid = math.sqrt(lo * hi)
        if eps(mid) <= eps_ref:
            lo = mid
        else:
            hi = mid
    q = math.sqrt(lo * hi)
    b = (eps(q * math.exp(step)) - eps(q * math.exp(-step))) / (2.0 * step)
    return PlantGain(trace_name, replicas, q, eps(q), b, step, duration_s, seeds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim.plant_gain", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="azure-conv")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--step", type=float, default=0.05)
    ap.add_argument("--duration-s", type=float, default=600.0)
    args = ap.parse_args(argv)
    for step in sorted({args.step, 0.02, 0.1}):
        pg = measure_plant_gain(args.trace, replicas=args.replicas, step=step, duration_s=args.duration_s)
        print(
            f"trace {pg.trace}  replicas {pg.replicas}  operating point {pg.qps:.2f} req/s "
            f"(eps {pg.eps:.4f})  step {pg.step:.2f}  b = {pg.plant_gain:.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
