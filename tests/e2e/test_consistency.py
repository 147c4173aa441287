"""The fast simulator decides like the real pipeline.

The same short workload runs (1) through the real loop -- embedded broker,
Faust worker, Redis, executors, the live fleet in 5x scaled time -- and (2)
through :mod:`sim.fastloop`, which runs the same window and controller code
with no broker.  The two replica-target timelines of each zone are compared.

Why two runs differ, and what the test does about it:

* The window grid.  The worker's windows are aligned to epoch time (multiples
  of ``window_s``) and the live run starts at an arbitrary instant, so its
  window ends fall at a random phase of trace time (8.686 s, 18.686 s, ...),
  while the fast loop's epoch puts them at 10, 20, ... s.  A different grid
  puts different requests into each window.  The test reads the phase off the
  live decisions (each is stamped with its window's end) and runs the fast
  loop on the same grid, so this input is no longer random.
* Timing inside the live loop, which the test cannot remove: the live fleet is
  advanced in ~50 ms wall ticks and polls its desired counts every 0.2 wall s,
  records reach the worker 0.2-0.4 wall s after they finish (more on a busy
  machine), and a scale command lands 1-3 trace s after its window closes
  where the fast loop assumes 1 s.  A replica ready a second later changes a
  few requests' latencies and so, now and then, a later target by a replica
  (the PID's level is rounded to whole replicas); once the two loops have
  different fleets their paths can drift apart for a while.  The divergence
  is path-dependent, so there is no bound to derive: the thresholds below are
  set from measurements, between the right model and a wrong one.
* So the fast loop is run as a small ensemble over the timing the live loop
  has (``TIMINGS``: the command landing 1, 2 or 3 s after the window, fleet
  ticks of 1, 0.5 or 0.25 s, windows closing 3 s late instead of 2), and each
  zone is compared with the member closest to it: every zone's executor lands
  its commands with its own delay.  The fast loop is as path-dependent against
  itself: its members at 2 or 3 s of actuation delay agree with its 1 s run
  about as badly (within one replica 0.35-0.6 on some seeds) as the worst
  live runs did against the 1 s run alone.  A wrong model gets the same
  ensemble and must still fail in every zone.

The previous version of this test compared on unaligned grids and asserted
70 % of windows within max(1 replica, 25 %), just under its measured 71-92 %.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sim.fastloop
from sim.fastloop import LoopConfig, run
from sim.traces import load_trace
from sim.workloads import step_load

pytestmark = [pytest.mark.e2e, pytest.mark.realtime, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
ARGS = {
    "duration_s": 240.0,
    "step_at_s": 60.0,
    "step_factor": 3.0,
    "qps": 12.0,
    "replicas": 2,
    "startup_s": 20.0,
    "seed": 3,
    "speed": 5.0,
}

# Measured: 12 live runs on a 2-CPU machine (4 of them with a busy process
# holding one CPU), 24 zone timelines of 23-24 windows, each against the fast loop
# on the live grid:
#   share of windows whose targets are at most one replica apart:
#     0.71 (a run with the busy process), 0.83, 0.92, the other 21 >= 0.96
#   replica-seconds live / fast: 0.94-1.09;  final targets: 0 or 1 replica apart
# (on the fast loop's own grid, as before: within one replica 0.67-1.00).
# The negative control, a fast loop without the feedforward path the live
# worker uses, against the same runs:
#   within one replica 0.22-0.38;  replica-seconds 1.10-1.32;  final targets 5-9 apart
# With the controller of b3e58df (running batches in the arrival rate, a 12-window
# forecast warm-up), 5 live runs of 2 zones: within one replica 0.83-1.00 in the
# 4 runs made beside a benchmark holding both CPUs (replica-seconds 0.96-1.02),
# and 0.43 (replica-seconds 1.19) in one zone of the run made while the test
# suite and a benchmark, four processes, shared the 2 CPUs: the paths split
# after the step and did not rejoin within the 240 s.
# With the fix of the count in service (the GPU samples' mean times the nodes
# sampled, not the ready replicas) and the controller of b3e58df, 10 live runs of
# 2 zones, two at a time on the 2 CPUs: against the 1 s fast run alone, within one
# replica 0.35-1.00 (3 of the 20 zones under 0.55), replica-seconds 0.85-1.17,
# final targets 0-3 apart; against the closest member of TIMINGS per zone,
# within one replica 0.78-1.00, replica-seconds 0.96-1.08, final targets 0-1
# apart; the wrong model against the closest member of its TIMINGS, within one
# replica 0.17-0.35, replica-seconds 1.31-1.85, final targets 5-11 apart.
# The thresholds sit between the two (the closest-member figures): MIN_WITHIN_ONE
# about five windows from either side, MAX_END_GAP three replicas from the wrong
# model and one from the worst right run; MAX_AREA_ERROR bounds the cost the fast
# loop reports (what `governor bench control` is used for) with 7 points of margin
# to the right runs and 16 to the wrong model.
MIN_WITHIN_ONE = 0.55
MAX_AREA_ERROR = 0.15
MAX_END_GAP = 2
#: The live loop's timing, as fast-loop settings (each varied alone from the 1 s run).
TIMINGS: tuple[dict[str, float], ...] = (
    {},
    {"actuation_delay_s": 2.0},
    {"actuation_delay_s": 3.0},
    {"tick_s": 0.5},
    {"tick_s": 0.25},
    {"lateness_s": 3.0},
)


def _live_grid_phase_s(decisions: Sequence[Sequence[Any]], window_s: float) -> float:
    """Where the live windows end, modulo ``window_s`` (every decision sits on a window end)."""
    window_ms = round(window_s * 1000)
    phases = {round(t * 1000) % window_ms for t, _, _ in decisions}
    assert len(phases) == 1, phases
    return float(phases.pop() / 1000.0)


def _fast_decisions(
    live: Mapping[str, Any], phase_s: float, **overrides: Any
) -> tuple[LoopConfig, list[tuple[float, str, int]]]:
    """The fast loop on the live run's workload and window grid: (window end, zone, target)."""
    a = ARGS
    workload = step_load(load_trace("azure-conv"), a["qps"], a["duration_s"], a["step_at_s"], a["step_factor"])
    kwargs = {
        "initial_replicas": a["replicas"],
        "startup_s": a["startup_s"],
        "seed": a["seed"],
        "replica_capacity_rps": live["replica_capacity_rps"],
        "window_s": live["window_s"],
        "lateness_s": live["lateness_s"],
        "actuation_delay_s": 1.0,
        "max_replicas": 64,
    }
    cfg = LoopConfig.of(**(kwargs | overrides))
    window_ms = round(cfg.window_s * 1000)
    assert sim.fastloop.EPOCH_MS0 % window_ms == 0  # fast windows end at trace t = k * window_s
    # Shift the fast loop's epoch so its windows end at the live phase too.
    shift_ms = (window_ms - round(phase_s * 1000)) % window_ms
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sim.fastloop, "EPOCH_MS0", sim.fastloop.EPOCH_MS0 + shift_ms)
        fast = run("governor", workload, cfg, duration_s=a["duration_s"])
    # A fast decision is taken at the first tick after its window's end + lateness.
    return cfg, [(t - cfg.lateness_s, z, n) for t, z, n, _ in fast.decisions]


def _timeline(decisions: Sequence[Sequence[Any]], zone: str, initial: int, samples: np.ndarray) -> np.ndarray:
    out = np.full(len(samples), initial)
    for t, z, n in sorted(tuple(d) for d in decisions):
        if z == zone:
            out[samples >= t] = n
    return out


def compare(
    live: Mapping[str, Any], fast_decisions: Sequence[tuple[float, str, int]], zones: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Per zone: the two timelines sampled mid-window (a decision stamped at its
    window's end, or up to a tick later, counts from the next sample on) and
    how well they agree."""
    window_s = float(live["window_s"])
    phase_s = _live_grid_phase_s(live["decisions"], window_s)
    samples = np.arange(phase_s + window_s / 2, ARGS["duration_s"], window_s)
    initial = int(ARGS["replicas"])
    out = {}
    for zone in zones:
        lt = _timeline(live["decisions"], zone, initial, samples)
        ft = _timeline(fast_decisions, zone, initial, samples)
        out[zone] = {
            "within_one": float(np.mean(np.abs(lt - ft) <= 1)),
            "area_ratio": float(lt.sum() / ft.sum()),
            "end": (int(lt[-1]), int(ft[-1])),
            "live": lt.tolist(),
            "fast": ft.tolist(),
        }
    return out


def closest(live: Mapping[str, Any], phase_s: float, **overrides: Any) -> dict[str, dict[str, Any]]:
    """Per zone, the comparison with the ``TIMINGS`` member that agrees best (agreement first,
    then the share of windows within one replica, then the replica-seconds)."""
    best: dict[str, tuple[tuple[bool, float, float], dict[str, Any]]] = {}
    for timing in TIMINGS:
        cfg, fast = _fast_decisions(live, phase_s, **(timing | overrides))
        for zone, c in compare(live, fast, cfg.zones).items():
            key = (agrees(c), c["within_one"], -abs(c["area_ratio"] - 1.0))
            if zone not in best or key > best[zone][0]:
                best[zone] = (key, c | {"timing": timing})
    return {zone: c for zone, (_, c) in best.items()}


def agrees(c: Mapping[str, Any]) -> bool:
    return bool(
        c["within_one"] >= MIN_WITHIN_ONE
        and abs(c["area_ratio"] - 1.0) <= MAX_AREA_ERROR
        and abs(c["end"][0] - c["end"][1]) <= MAX_END_GAP
    )


def test_fast_loop_reproduces_the_real_pipelines_decisions(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP", "REDIS_URL")}
    a = ARGS
    # fmt: off
    proc = subprocess.run(
        [sys.executable, "-m", "governor.cli", "--log-level", "WARNING", "demo", "--no-progress",
         "--bad-rate", "0", "--out", str(tmp_path / "live"), "--duration-s", str(a["duration_s"]),
         "--step-at-s", str(a["step_at_s"]), "--step-factor", str(a["step_factor"]), "--qps", str(a["qps"]),
         "--replicas", str(a["replicas"]), "--startup-s", str(a["startup_s"]), "--seed", str(a["seed"]),
         "--speed", str(a["speed"])], cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)
    # fmt: on
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    live = json.loads((tmp_path / "live" / "report.json").read_text())
    assert live["decisions"], "the live loop took no decision"
    phase_s = _live_grid_phase_s(live["decisions"], live["window_s"])

    for zone, c in closest(live, phase_s).items():
        assert agrees(c), (zone, c)

    # Negative control: the check can fail.  A fast loop missing a mechanism the live
    # worker has (feedforward sizing) must not pass it in any zone, with any timing.
    for zone, c in closest(live, phase_s, replica_capacity_rps=None).items():
        assert not agrees(c), (zone, c)
