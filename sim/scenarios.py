"""Named benchmark scenarios: a workload shape over a real trace, plus faults.

Every scenario keeps the trace's own texture (burstiness, prompt and output
lengths) and changes only its rate over time (:func:`sim.workloads.warp`) or
injects faults into the fleet.  ``qps`` is the scenario's base rate.
``step`` and ``spike`` follow the design source (docs/model.md §19 (sim)).

=============  ==============================================================
replay         the trace at ``qps`` (its own minute-to-minute swings kept)
step           the design source's stepped load test: 50 -> 500 QPS in 10 equal steps
               (scaled by qps/50 so a smaller base keeps the 10x shape)
burst          base rate with three 3x bursts of 60 s (a fifth of a run shorter than 300 s)
diurnal        a compressed day: rate follows 0.4 .. 1.6 x qps sinusoidally
spike          the design source's injected I/O-delay spikes: service time x3
               on half of a zone's replicas for 120 s, twice
replica-loss   one replica of each zone fails every 300 s
zone-cut       the second zone is cut off at 40 % of the run for 30 % of it (at
               most 300 s; 240-420 s of a 600 s run): its replicas and
               ingress are gone, the balancer sends its traffic to the others
slow-start     replica start-up becomes 3x slower a third of the way in
=============  ==============================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.fastloop import Fault
from sim.traces import Trace
from sim.workloads import Workload, from_trace


class ScenarioError(ValueError):
    """Unknown scenario or unusable scenario parameter."""


@dataclass(frozen=True)
class Scenario:
    name: str
    workload: Workload
    faults: tuple[Fault, ...]
    duration_s: float


SCENARIOS = ("replay", "step", "burst", "diurnal", "spike", "replica-loss", "zone-cut", "slow-start")


def scenario_list(text: str) -> tuple[list[str], list[str]]:
    """A command's ``--scenario`` value (``all`` or a comma list) as (the scenarios, the unknown names in it).

    >>> scenario_list("all")[0] == list(SCENARIOS), scenario_list("replay, nope")
    (True, (['replay', 'nope'], ['nope']))
    """
    chosen = list(SCENARIOS) if text == "all" else [s.strip() for s in text.split(",")]
    return chosen, [s for s in chosen if s not in SCENARIOS]


def _segments_sine(duration_s: float, lo: float, hi: float, n: int = 48) -> list[tuple[float, float]]:
    ts = np.linspace(0.0, duration_s, n, endpoint=False)
    mid, amp = (hi + lo) / 2, (hi - lo) / 2
    return [(float(t), float(mid - amp * np.cos(2 * np.pi * t / duration_s))) for t in ts]


def build(
    name: str, trace: Trace, qps: float, duration_s: float, zones: tuple[str, ...] = ("az-a", "az-b")
) -> Scenario:
    """Build scenario ``name`` on ``trace`` at base rate ``qps`` for ``duration_s``."""
    if duration_s <= 0 or qps <= 0:
        raise ScenarioError("duration_s and qps must be > 0")
    faults: tuple[Fault, ...] = ()
    if name in ("replay", "spike", "replica-loss", "zone-cut", "slow-start"):
        w = from_trace(trace, qps, duration_s)
        if name == "spike":
            faults = (
                Fault("spike", zones[0], duration_s * 0.25, 120.0, 0.5, 3.0),
                Fault("spike", zones[-1], duration_s * 0.6, 120.0, 0.5, 3.0),
            )
        elif name == "replica-loss":
            faults = tuple(
                Fault("replica_lost", z, float(t)) for t in np.arange(300.0, duration_s, 300.0) for z in zones
            )
        elif name == "zone-cut":
            if len(zones) < 2:
                raise ScenarioError("zone-cut needs at least two zones")
            faults = (Fault("zone_cut", zones[1], duration_s * 0.4, min(300.0, duration_s * 0.3)),)
        elif name == "slow-start":
            faults = (Fault("slow_start", zones[0], duration_s / 3, factor=3.0),)
    elif name == "step":
        steps = 10
        segs = [(duration_s * k / steps, float(k + 1)) for k in range(steps)]  # 1x .. 10x of qps
        w = from_trace(trace, qps, duration_s, segs)
    elif name == "burst":
        segs = [(0.0, 1.0)]
        length = min(60.0, 0.2 * duration_s)  # bursts 60 s long; shorter runs keep them apart, in order
        for frac in (0.25, 0.5, 0.75):
            start = duration_s * frac
            segs += [(start, 3.0), (start + length, 1.0)]
        w = from_trace(trace, qps, duration_s, segs)
    elif name == "diurnal":
        w = from_trace(trace, qps, duration_s, _segments_sine(duration_s, 0.4, 1.6))
    else:
        raise ScenarioError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")
    return Scenario(name=name, workload=w, faults=faults, duration_s=duration_s)
