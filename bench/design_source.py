"""``governor bench design-source``: the design source's own experiments, its figures beside governor's.

docs/model.md §22 (not-built) lists the figures; this command runs each experiment of
§3.1, §4.1, §4.4 and §5 of the design source (docs/model.md states it) as closely as
the simulator allows, through the code the product ships, and prints the figure the design source reports
(:data:`DESIGN_SOURCE`, the one place they are written, each with the line it quotes)
in the next column, with a note on each difference (:data:`NOTES`).  The other figures
of the design source are printed by ``bench bandwidth`` (§3.3) and ``bench kv``
(§4.2, §4.3).

* **§3.1** (delay compensation): the feedback loop alone (``governor-fb`` of
  ``bench control``: the loop the compensation acts on) on one zone, a constant-mean
  replay of azure-conv for ``--sse-duration-s`` (2400 s), at the design source's two
  delays (20 ms and 50 ms: actuation delay, instant start-up) and at the fast loop's
  own (2 s + 30 s start-up), with the compensation (the dead-time hold and the Kalman
  observer predicting over the measured delay) off and on, starting from the needed
  fleet (the smallest static fleet that meets ``eps_ref`` over the last third) and from
  half of it.  Steady-state error over the last third, as the tracked variable (the
  violation rate against ``eps_ref``, in points and relative to it) and as the mean
  desired fleet against the needed one.
* **§4.1** (mixed agent load): ``bench traffic --scenario agents`` (the loop's
  ``agents`` weights against 1:1:1), its mean response and completion.
* **§4.4** (gray release): ``bench traffic --scenario canary`` with one bad version
  (errors and a slower TTFT) calibrated to the design source's big-bang release
  (:func:`calibrate_release`), the canary driver's 1 -> 5 -> 20 -> 100 % rollout against
  a big-bang release: on-time share, TTFT P99 and error rate of all requests; and the
  big-bang of a severe version (2 % errors, TTFT x8), which melts the fleet down.
* **§5** (the elastic controller): one zone, the burst scenario of azure-conv at a
  base rate of 0.4 x what 5 replicas carry at the profiled capacity (bursts at 1.2 x):
  a static fleet of 5, KEDA on utilisation (the KEDA baseline's trigger on the
  window's mean GPU utilisation, threshold 0.70) and governor as shipped; mean and
  P95 end-to-end latency, SLO attainment, waste in the design source's sense (the unused
  share of the ready capacity, :func:`capacity_waste`) and in the simulator's (idle
  GPU time), GPU-seconds and GPU-seconds per 1,000 on-time requests.

Everything is seeded; ``--seeds`` averages several.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.agents import scenario_agents
from bench.canary import scenario_canary
from bench.control import GOVERNOR_VARIANTS
from core.defaults import EPS_REF
from sim.baselines import KedaParams, KedaPrometheus, StaticParams, StaticReplicas
from sim.fastloop import EPOCH_MS0, LoopConfig, RunResult, run
from sim.profiling import profile
from sim.scenarios import build
from sim.traces import load_trace
from sim.workloads import Workload, from_trace

__all__ = ["DESIGN_SOURCE", "NOTES", "SECTIONS", "SourceFigure", "add_parser", "measure", "run_design_source"]

TRACE = "azure-conv"
ZONE = ("az-a",)


@dataclass(frozen=True)
class SourceFigure:
    """One figure the design source reports: its value (in ``unit``) and the line of the source it comes from."""

    value: float
    unit: str
    quote: str


#: §3.1's rows: (tag, delay as printed), the compensation on / off, the start (needed fleet / half of it)
#: and the two measures (the violation rate against eps_ref, the fleet against the needed fleet)
SSE_DELAYS = (("20ms", "20 ms"), ("50ms", "50 ms"), ("32s", "2 s + 30 s start-up"))
SSE_STARTS = (("need", "from the needed fleet"), ("half", "from half of it"))
SSE_MEASURES = (("eps", "violation rate - eps_ref"), ("fleet", "fleet - needed fleet"))
_SSE_SOURCE = {
    "20ms": SourceFigure(1.2, "%", "| tau <= 20 ms | 0.98 | <= 1.2 % |"),
    "50ms": SourceFigure(3.8, "%", "| 20 < tau <= 50 ms | 0.87 | <= 3.8 % |"),
}
#: §4.4's big-bang figures the bad version is calibrated to (the source's, :data:`DESIGN_SOURCE`)
_BIGBANG_P99 = SourceFigure(1120.0, "ms", "P99 1120 -> 342 ms")
_GRAY_P99 = SourceFigure(342.0, "ms", "P99 1120 -> 342 ms")
_BIGBANG_ERRORS = SourceFigure(1.27, "%", "error rate 1.27 % -> 0.03 %")

#: section -> row key -> the design source's figure (None: governor's row has no counterpart there).
#: The one place these numbers are written; printed beside governor's.  Never a constant of a result; §4.4's
#: big-bang error rate and P99 ratio are the targets its bad version is calibrated to (NOTES).
DESIGN_SOURCE: dict[str, dict[str, SourceFigure | None]] = {
    "3.1": {
        f"sse_{tag}_{comp}_{start}_{measure}": _SSE_SOURCE.get(tag) if comp == "comp" else None
        for tag, _ in SSE_DELAYS
        for comp in ("comp", "plain")
        for start, _ in SSE_STARTS
        for measure, _ in SSE_MEASURES
    },
    "4.1": {
        "static_mean_ms": SourceFigure(842.0, "ms", "static 1:1:1 weights 842 ms mean response"),
        "static_completion": SourceFigure(86.3, "%", "static 1:1:1 weights ... 86.3 % task completion"),
        "dynamic_mean_ms": SourceFigure(617.0, "ms", "dynamic weights 617 ms"),
        "dynamic_completion": SourceFigure(93.7, "%", "dynamic weights 617 ms, 93.7 %"),
    },
    "4.4": {
        "v2_error_prob": None,
        "v2_ttft_factor": None,
        "without_attainment": SourceFigure(82.3, "%", "SLO attainment 82.3 % -> 99.7 %"),
        "with_attainment": SourceFigure(99.7, "%", "SLO attainment 82.3 % -> 99.7 %"),
        "without_p99_ms": _BIGBANG_P99,
        "with_p99_ms": _GRAY_P99,
        "without_error_rate": _BIGBANG_ERRORS,
        "with_error_rate": SourceFigure(0.03, "%", "error rate 1.27 % -> 0.03 %"),
        "severe_without_attainment": None,
        "severe_without_p99_ms": None,
    },
    "5": {
        "load_mean": None,
        "static_mean_ms": SourceFigure(427.0, "ms", "| static 5 replicas | 427 ms | 89.2 % | 63 % |"),
        "static_attainment": SourceFigure(89.2, "%", "| static 5 replicas | 427 ms | 89.2 % | 63 % |"),
        "static_waste_capacity": SourceFigure(63.0, "%", "| static 5 replicas | 427 ms | 89.2 % | 63 % |"),
        "static_waste_busy": None,
        "static_p95_ms": None,
        "static_gpu_s": None,
        "static_gpu_s_per_1k": None,
        "keda_mean_ms": SourceFigure(211.0, "ms", "| KEDA on CPU | 211 ms | 95.7 % | 38 % |"),
        "keda_attainment": SourceFigure(95.7, "%", "| KEDA on CPU | 211 ms | 95.7 % | 38 % |"),
        "keda_waste_capacity": SourceFigure(38.0, "%", "| KEDA on CPU | 211 ms | 95.7 % | 38 % |"),
        "keda_waste_busy": None,
        "keda_p95_ms": None,
        "keda_gpu_s": None,
        "keda_gpu_s_per_1k": None,
        "governor_mean_ms": SourceFigure(89.0, "ms", "| this controller | 89 ms | 99.4 % | 11 % |"),
        "governor_attainment": SourceFigure(99.4, "%", "| this controller | 89 ms | 99.4 % | 11 % |"),
        "governor_waste_capacity": SourceFigure(11.0, "%", "| this controller | 89 ms | 99.4 % | 11 % |"),
        "governor_waste_busy": None,
        "governor_p95_ms": None,
        "governor_gpu_s": None,
        "governor_gpu_s_per_1k": None,
    },
}
SECTIONS = tuple(DESIGN_SOURCE)

#: (section, row key) -> what governor's row measures (its unit: :func:`_unit` of the key).
LABELS = {
    ("3.1", f"sse_{tag}_{comp}_{start}_{measure}"): (
        f"tau {delay}, {'compensated' if comp == 'comp' else 'no compensation'}, {start_text}: {measure_text}"
    )
    for tag, delay in SSE_DELAYS
    for comp in ("comp", "plain")
    for start, start_text in SSE_STARTS
    for measure, measure_text in SSE_MEASURES
}
LABELS |= {
    ("4.4", "v2_error_prob"): "bad v2 (calibrated): error probability",
    ("4.4", "v2_ttft_factor"): "bad v2 (calibrated): TTFT factor",
    ("4.4", "severe_without_attainment"): "severe v2 (2 % errors, TTFT x8), big-bang: attainment",
    ("4.4", "severe_without_p99_ms"): "severe v2 (2 % errors, TTFT x8), big-bang: TTFT P99",
    ("5", "load_mean"): "offered load, mean, of static 5's capacity at the SLO",
}
for _key, _release in (("without", "big-bang release"), ("with", "gray release")):
    LABELS |= {
        ("4.4", f"{_key}_attainment"): f"{_release}: attainment (on time)",
        ("4.4", f"{_key}_p99_ms"): f"{_release}: TTFT P99",
        ("4.4", f"{_key}_error_rate"): f"{_release}: error rate",
    }
for _arm, _name in (("static", "static 1:1:1"), ("dynamic", "the loop's agent weights")):
    LABELS |= {
        ("4.1", f"{_arm}_mean_ms"): f"{_name}: mean response",
        ("4.1", f"{_arm}_completion"): f"{_name}: completion",
    }
for _scheme, _name in (("static", "static 5"), ("keda", "KEDA on utilisation"), ("governor", "governor")):
    LABELS |= {
        ("5", f"{_scheme}_mean_ms"): f"{_name}: mean response (e2e)",
        ("5", f"{_scheme}_p95_ms"): f"{_name}: P95 response (e2e)",
        ("5", f"{_scheme}_attainment"): f"{_name}: SLO attainment",
        ("5", f"{_scheme}_waste_capacity"): f"{_name}: waste, unused capacity (source's sense)",
        ("5", f"{_scheme}_waste_busy"): f"{_name}: waste, idle GPU time (busy = a request in flight)",
        ("5", f"{_scheme}_gpu_s"): f"{_name}: GPU-seconds",
        ("5", f"{_scheme}_gpu_s_per_1k"): f"{_name}: GPU-seconds per 1,000 on-time requests",
    }

#: section -> why governor's figures differ from the design source's (printed under the table).
NOTES = {
    "3.1": (
        "governor has no compensation gain k: the controller acts on the state predicted over the measured "
        "delay (Kalman observer, docs/model.md §9) and holds scale-ups while capacity is in flight; 'compensated' "
        "is both on, 'no compensation' both off, on the feedback loop alone.  The source does not define its "
        "error; here it is measured over the last third at a constant mean load, as the violation rate against "
        "eps_ref (points, and in % of eps_ref) and as the mean desired fleet against the needed one (one "
        "replica of 8 is 12.5 %).  The plant is steep: at the default load 8 replicas violate 0.07 %, 7 2.6 %, "
        "so no replica count sits at eps_ref and the violation error is at best -1.9 points (8) or +0.6 (7).  "
        "The loop alone does not settle: from the needed fleet it holds 8 for about 1,000 s, the integral "
        "trims it to 7 (the shipped scale-down gain, ki_down), 7 violates in the load's peaks, a backlog "
        "builds and the loop overshoots while it drains, then gives the surplus back at -0.2 % a window: a "
        "cycle longer than the run, whose last third is the overshoot (no violations, -2 points, and the "
        "fleet error).  From half of it the same overshoot comes at the start.  With 10 s windows a 20 or "
        "50 ms delay is under "
        "a window and there is nothing to compensate: compensation on and off give the same rows (before "
        "the observer predicted what it has no model for as measured and matched its covariance to large "
        "innovations, it trailed a fall of the violations and overshot more: tests/unit/test_observer_lag.py).  "
        "At the fast loop's own delay (30 s start-up) the dead-time hold pays, where the source reports "
        "nothing."
    ),
    "4.1": (
        "an agent turn here is one to four LLM calls of a 70B model on the simulated H100 fleet (seconds each, "
        "bench/agents.py), so the source's sub-second responses are not reachable; completion is within a 12 s "
        "deadline.  The weights follow the source's formula; what the paths cost is governor's stated model."
    ),
    "4.4": (
        "the source does not say how bad its release was; the bad v2 is calibrated to its big-bang outcome: "
        "an error probability of 1.27 % over the share of requests the big-bang sends to v2 (the source's "
        "1.27 % of all requests in expectation) and a TTFT factor bisected so the big-bang's P99 is the "
        "source's 1120/342 of the gray release's (the calibrated rows; these two source figures are "
        "targets, the others are not).  The big-bang starts at 30 s, the gray release's rollback rules are "
        "the source's (0.8 % errors, P99 800 ms) and the figures are over all requests of the run.  The "
        "severe v2 (2 % errors, TTFT x8) cuts a replica's capacity 8-fold: a big-bang release of it "
        "overloads the fleet (P99 in minutes), a meltdown, not the source's release.  The calibrated v2 "
        "(x2 at the defaults) halves a replica's capacity, which the fleet still carries: its big-bang misses "
        "few SLOs (attainment near 97 %, the source 82.3 %); one slow-down factor does not give both the "
        "source's P99 and its attainment here."
    ),
    "5": (
        "'mean response' is end to end: a simulated request decodes hundreds of tokens (seconds), so the "
        "source's 89-427 ms are not reachable and only the order of the schemes compares.  KEDA on CPU is KEDA "
        "on the window's GPU utilisation (the busy share of a replica; a GPU fleet's CPU says nothing).  Waste "
        "in the source's sense is the unused share of the capacity provisioned, 1 - served / (ready replicas "
        "x the profiled capacity at the SLO), per 10 s window (an overloaded window wastes nothing) and "
        "time-weighted; beside it the simulator's idle GPU time, where a replica with any request in flight "
        "reads as busy (a static fleet at half load reads near 0).  The load (a base of 0.4x what 5 replicas "
        "carry, 60 s bursts at 1.2x) is governor's choice: the source does not give its own.  Its static 5 "
        "wasting 63 % means a mean load of at most 37 % of its capacity (waste >= 1 - mean load, equal when "
        "never overloaded); at 600 s the bursts take 30 % of the run and the mean is 57 % (the offered-load "
        "row), heavier than the source's: static 5's waste here is lower and its misses in the bursts more.  "
        "At the defaults KEDA on utilisation, which reads busy whenever requests are in flight, grows to 8x "
        "static's GPU-seconds and leaves most of it unused; governor scales to 13 replicas in the first "
        "burst (about 6 carry its peak, 2 the time between) and its law's target stays at 12-13 between the "
        "bursts to the end of the run, so it wastes far more than the source's 11 %."
    ),
}


def _parse_sections(text: str) -> list[str]:
    chosen = list(SECTIONS) if text == "all" else [s.strip().lstrip("§") for s in text.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown:
        raise SystemExit(f"--section: unknown {unknown}; choose from {', '.join(SECTIONS)} or all")
    return chosen


def _seeds(args: argparse.Namespace) -> list[int]:
    text = getattr(args, "seeds", "") or str(args.seed)
    return [int(s) for s in text.split(",") if s.strip()]


# -- §3.1: steady-state error against delay and compensation ------------------------------------
#: (row tag, actuation delay s, replica start-up s) of the §3.1 runs
DELAYS = (("20ms", 0.02, 0.0), ("50ms", 0.05, 0.0), ("32s", 2.0, 30.0))
#: (row tag, the start as a share of the needed fleet): at the fleet that meets eps_ref, and at half of it
STARTS = (("need", 1.0), ("half", 0.5))
NEED_REPLICAS = 8  # §3.1's load: what 8 replicas carry at the profiled capacity, x 0.8
STEADY_FROM = 2.0 / 3.0  # the steady state is measured over the run's last third


def violation_rate(r: RunResult, workload: Workload, cfg: LoopConfig, from_s: float) -> float:
    """The share of the requests arriving from ``from_s`` on that missed the TTFT or ITL SLO or never finished."""
    start_ms = EPOCH_MS0 + from_s * 1000.0
    arrived = int(np.count_nonzero(workload.arrival_s >= from_s))
    if arrived == 0:
        return 0.0
    ok = sum(
        x["arrival_ms"] >= start_ms and x["ttft_ms"] <= cfg.ttft_slo_ms and x.get("itl_ms", 0.0) <= cfg.itl_slo_ms
        for x in r.finished
    )
    return 1.0 - float(ok) / arrived


def _harness(cfg: LoopConfig, capacity: float | None = None) -> dict[str, Any]:
    """The :class:`~sim.baselines.base.Harness` keywords of a baseline on ``cfg``'s model."""
    return {
        "min_replicas": cfg.min_replicas,
        "max_replicas": cfg.max_replicas,
        "slo_ttft_ms": cfg.ttft_slo_ms,
        "slo_itl_ms": cfg.itl_slo_ms,
        "replica_capacity_rps": capacity,
    }


def _static(n: int, cfg: LoopConfig) -> Callable[[str], Any]:
    harness = _harness(cfg)
    return lambda zone: StaticReplicas(StaticParams(replicas=n), **harness)


def needed_fleet(workload: Workload, cfg: LoopConfig, duration_s: float) -> int:
    """The smallest static fleet whose violation rate over the last third is at most ``eps_ref`` (bisection)."""

    def meets(n: int) -> bool:
        c = cfg.replace(initial_replicas=n)
        r = run(_static(n, c), workload, c, (), duration_s)
        return violation_rate(r, workload, c, duration_s * STEADY_FROM) <= cfg.eps_ref

    lo, hi = 0, 1
    while not meets(hi):
        lo, hi = hi, hi * 2
        if hi > cfg.max_replicas:
            return cfg.max_replicas
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if meets(mid) else (mid, hi)
    return hi


def section_3_1(args: argparse.Namespace, seed: int) -> dict[str, float]:
    """The feedback loop at a constant mean load, from the needed fleet and from half of it: the violation
    rate over the last third against ``eps_ref`` (points) and the mean desired fleet there against the
    needed one (%), for each delay with the compensation on and off."""
    trace = load_trace(TRACE)
    base = LoopConfig.of(zones=ZONE, seed=seed)
    capacity, _ = profile(trace, base)
    dur = float(getattr(args, "sse_duration_s", None) or args.duration_s)
    workload = from_trace(trace, NEED_REPLICAS * capacity * 0.8, dur)
    need = needed_fleet(workload, base, dur)
    variant = {k: v for k, v in GOVERNOR_VARIANTS["governor-fb"].items() if k != "feedforward"}
    out = {}
    for tag, act_s, startup_s in DELAYS:
        for comp in (True, False):
            for start, share in STARTS:
                cfg = base.replace(
                    initial_replicas=max(1, round(need * share)),
                    actuation_delay_s=act_s,
                    startup_s=startup_s,
                    dead_time_comp=comp,
                    observer=comp,
                    **variant,
                )
                r = run("governor", workload, cfg, (), dur)
                desired = np.asarray(r.timeline[f"{ZONE[0]}.desired"], dtype=float)
                settled = float(desired[int(len(desired) * STEADY_FROM) :].mean())
                key = f"sse_{tag}_{'comp' if comp else 'plain'}_{start}"
                out[f"{key}_eps"] = 100.0 * (violation_rate(r, workload, cfg, dur * STEADY_FROM) - cfg.eps_ref)
                out[f"{key}_fleet"] = 100.0 * (settled - need) / need
    return out


# -- §4.1 and §4.4: the traffic benchmarks' scenarios ----------------------------------------------
def _traffic_args(args: argparse.Namespace, seed: int) -> argparse.Namespace:
    """``bench traffic``'s defaults at this run's duration and seed."""
    from bench.traffic import add_parser as traffic_parser

    p = argparse.ArgumentParser()
    traffic_parser(p.add_subparsers(dest="bench"))
    d = str(args.duration_s)
    return p.parse_args(["traffic", "--seed", str(seed), "--duration-s", d, "--canary-duration-s", d])


def section_4_1(args: argparse.Namespace, seed: int) -> dict[str, float]:
    res = scenario_agents(_traffic_args(args, seed))
    out = {}
    for arm, key in (("static-1:1:1", "static"), ("dynamic", "dynamic")):
        out[f"{key}_mean_ms"] = float(res[arm]["mean_response_ms"] or math.nan)
        out[f"{key}_completion"] = 100.0 * res[arm]["completion"]
    return out


#: the bisection's steps over the bad version's TTFT factor, and its range (x 1: v2 as fast as stable)
CALIBRATION_STEPS = 6
FACTOR_RANGE = (1.0, 3.0)
SEVERE = (0.02, 8.0)  # the severe bad version (error probability, TTFT factor): a meltdown under big-bang


def _run_release(targs: argparse.Namespace, error_prob: float, factor: float) -> dict[str, dict[str, Any]]:
    """The 'both' bad version (errors and a slower TTFT) released big-bang and gray: arm -> summary."""
    targs.canary_versions, targs.canary_error_rate, targs.canary_p99_factor = ("both",), error_prob, factor
    res = scenario_canary(targs)
    return {arm: res[f"both/{arm}"] for arm in ("big-bang", "canary")}


def _p99_ratio(res: dict[str, dict[str, Any]]) -> float:
    """The big-bang release's TTFT P99 over the gray release's."""
    return float(res["big-bang"]["ttft_p99_ms"] or math.inf) / float(res["canary"]["ttft_p99_ms"] or math.inf)


def calibrate_release(targs: argparse.Namespace) -> tuple[float, float, dict[str, dict[str, Any]]]:
    """The bad version as the design source's big-bang release shows it: its error probability such that the
    big-bang's errors are the source's 1.27 % of all requests in expectation (1.27 % over the share of requests
    the big-bang sends to v2, read from a first run), and its TTFT factor such that the big-bang's P99 is the
    source's 1120/342 of the gray release's (bisection over :data:`FACTOR_RANGE`, log-ratio closest wins).
    Returns (error probability, factor, the runs at them)."""
    first = _run_release(targs, 0.0, 1.0)
    error_prob = min(1.0, _BIGBANG_ERRORS.value / 100.0 / max(first["big-bang"]["v2_share_of_all"], 1e-9))
    target = math.log(_BIGBANG_P99.value / _GRAY_P99.value)
    lo, hi = FACTOR_RANGE
    best: tuple[float, float, dict[str, dict[str, Any]]] | None = None
    for _ in range(CALIBRATION_STEPS):
        mid = (lo + hi) / 2.0
        res = _run_release(targs, error_prob, mid)
        miss = math.log(_p99_ratio(res)) - target
        if best is None or abs(miss) < best[0]:
            best = (abs(miss), mid, res)
        lo, hi = (mid, hi) if miss < 0 else (lo, mid)
    assert best is not None
    return error_prob, best[1], best[2]


def section_4_4(args: argparse.Namespace, seed: int) -> dict[str, float]:
    targs = _traffic_args(args, seed)
    error_prob, factor, res = calibrate_release(targs)
    out = {"v2_error_prob": 100.0 * error_prob, "v2_ttft_factor": factor}
    for arm, key in (("big-bang", "without"), ("canary", "with")):
        s = res[arm]
        out[f"{key}_attainment"] = 100.0 * s["on_time"]
        out[f"{key}_p99_ms"] = float(s["ttft_p99_ms"] or math.nan)
        out[f"{key}_error_rate"] = 100.0 * s["error_rate"]
    severe = _run_release(targs, *SEVERE)["big-bang"]
    out["severe_without_attainment"] = 100.0 * severe["on_time"]
    out["severe_without_p99_ms"] = float(severe["ttft_p99_ms"] or math.nan)
    return out


# -- §5: static 5, KEDA on utilisation, governor -------------------------------------------------
STATIC_REPLICAS = 5
BASE_LOAD = 0.4  # §5's base rate, as a share of what the static fleet carries (its bursts are 3x)
KEDA_UTILISATION = 0.70  # KEDA's target utilisation (the HPA's usual 70 %)


def capacity_waste(r: RunResult, capacity_rps: float, window_s: float) -> float:
    """The design source's resource waste: the unused share of the capacity provisioned,
    ``1 - served / (ready x capacity)``, time-weighted over the run.

    Per window of ``window_s``: the capacity is the ready replicas (each tick's, summed over the zones)
    times ``capacity_rps`` (one replica's at the SLO, profiled); the load served is the requests that
    arrived in the window and finished.  A window asked for more than its capacity wastes nothing (its
    excess queues, it does not make up for idle windows): waste = sum(max(0, capacity - served)) /
    sum(capacity).
    """
    t = np.asarray(r.timeline["t_s"], dtype=float)
    ready = sum(np.asarray(v, dtype=float) for k, v in r.timeline.items() if k.endswith(".ready"))
    if len(t) == 0:
        return math.nan
    tick = np.diff(t, prepend=0.0)
    n_bins = int(math.ceil(t[-1] / window_s))
    cap = np.bincount(np.minimum(((t - tick) // window_s).astype(int), n_bins - 1), ready * capacity_rps * tick, n_bins)
    arrival_s = (np.array([x["arrival_ms"] for x in r.finished], dtype=float) - EPOCH_MS0) / 1000.0
    arrival_s = arrival_s[(arrival_s >= 0.0) & (arrival_s < t[-1])]
    served = np.bincount((arrival_s // window_s).astype(int), minlength=n_bins)[:n_bins]
    total = float(cap.sum())
    return float(np.maximum(cap - served, 0.0).sum()) / total if total > 0 else math.nan


def section_5(args: argparse.Namespace, seed: int) -> dict[str, float]:
    trace = load_trace(TRACE)
    cfg = LoopConfig.of(zones=ZONE, initial_replicas=STATIC_REPLICAS, seed=seed)
    capacity, headroom = profile(trace, cfg)
    sc = build("burst", trace, BASE_LOAD * STATIC_REPLICAS * capacity, args.duration_s, cfg.zones)
    harness = _harness(cfg, capacity)
    # The trigger's query is the window's mean GPU utilisation; its threshold is in the query's unit
    # (KedaParams names it for the default TTFT query).
    keda = KedaParams(metric_key="gpu_util_mean", threshold_ms=KEDA_UTILISATION)
    arms: dict[str, tuple[Any, LoopConfig]] = {
        "static": (_static(STATIC_REPLICAS, cfg), cfg),
        "keda": (lambda zone: KedaPrometheus(keda, **harness), cfg),
        "governor": ("governor", cfg.replace(replica_capacity_rps=capacity, replica_headroom=headroom)),
    }
    out = {"load_mean": 100.0 * len(sc.workload) / sc.duration_s / (STATIC_REPLICAS * capacity)}
    for key, (strategy, run_cfg) in arms.items():
        r = run(strategy, sc.workload, run_cfg, sc.faults, sc.duration_s, name=key)
        m = r.metrics
        on_time = float(m["slo_attainment"] or 0.0) * m["requests"]
        out[f"{key}_mean_ms"] = float(np.mean([x["e2e_ms"] for x in r.finished])) if r.finished else math.nan
        out[f"{key}_p95_ms"] = float(m["e2e_p95_ms"] if m["e2e_p95_ms"] is not None else math.nan)
        out[f"{key}_attainment"] = 100.0 * float(m["slo_attainment"] or 0.0)
        out[f"{key}_waste_capacity"] = 100.0 * capacity_waste(r, capacity, cfg.window_s)
        out[f"{key}_waste_busy"] = 100.0 * float(m["waste"] if m["waste"] is not None else math.nan)
        out[f"{key}_gpu_s"] = float(m["gpu_seconds"])
        out[f"{key}_gpu_s_per_1k"] = 1000.0 * float(m["gpu_seconds"]) / on_time if on_time else math.nan
    return out


RUNNERS: dict[str, Callable[[argparse.Namespace, int], dict[str, float]]] = {
    "3.1": section_3_1,
    "4.1": section_4_1,
    "4.4": section_4_4,
    "5": section_5,
}


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per figure of the chosen sections: governor's (the mean over the seeds) beside the source's."""
    seeds = _seeds(args)
    rows = []
    for section in _parse_sections(args.section):
        per_seed = [RUNNERS[section](args, s) for s in seeds]
        for key, src in DESIGN_SOURCE[section].items():
            values = [d[key] for d in per_seed]
            rows.append(
                {
                    "section": section,
                    "key": key,
                    "figure": LABELS[(section, key)],
                    "unit": _unit(key),
                    "governor": _finite(float(np.mean(values))),
                    "per_seed": [_finite(v) for v in values],
                    "design_source": None if src is None else src.value,
                    "source_unit": None if src is None else src.unit,
                    "quote": None if src is None else src.quote,
                }
            )
    return rows


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None  # JSON has no NaN: a figure not measured (no request finished) is null


def _unit(key: str) -> str:
    """A row's unit from its key: ms, GPU-s, points of violation rate (``_eps``), a factor, else %."""
    suffixes = (("_ms", "ms"), ("_gpu_s", "GPU-s"), ("_per_1k", "GPU-s"), ("_eps", "pt"), ("_factor", "x"))
    return next((unit for suffix, unit in suffixes if key.endswith(suffix)), "%")


def _fmt(v: float | None, unit: str | None, signed: bool = False) -> str:
    if v is None or unit is None:
        return "-"
    if not math.isfinite(v):
        return "n/a"
    if unit == "pt":  # points of violation rate against eps_ref, and the same relative to eps_ref
        return f"{v:+.2f} pt ({100.0 * v / (100.0 * EPS_REF):+.0f} %)"
    if unit == "x":
        return f"x {v:.2f}"
    if unit == "%":
        digits = 2 if abs(v) < 2 else 1
        return f"{v:+.{digits}f} %" if signed else f"{v:.{digits}f} %"
    return f"{v:,.0f} {unit}"


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a markdown table (section, figure, governor, design source), then the notes."""
    lines = ["| § | figure | governor | design source |", "|---|---|---|---|"]
    for r in rows:
        bound = r["key"].startswith("sse_")  # §3.1: a signed error; the source gives a bound on its size
        src = _fmt(r["design_source"], r["source_unit"])
        lines.append(
            f"| {r['section']} | {r['figure']} | {_fmt(r['governor'], r['unit'], bound)} "
            f"| {'<= ' + src if bound and r['design_source'] is not None else src} |"
        )
    lines.append("")
    for section in dict.fromkeys(r["section"] for r in rows):
        lines.append(f"§{section}: {NOTES[section]}")
    return "\n".join(lines)


def add_parser(sub: Any) -> None:
    b = sub.add_parser(
        "design-source",
        help="the design source's experiments (§3.1, §4.1, §4.4, §5), its figures beside governor's",
    )
    b.add_argument("--section", default="all", help=f"comma-separated of {', '.join(SECTIONS)}, or all")
    b.add_argument("--duration-s", type=float, default=600.0, help="simulated seconds of each run (§4.1, §4.4, §5)")
    b.add_argument(
        "--sse-duration-s",
        type=float,
        default=2400.0,
        help="simulated seconds of §3.1's runs (a steady state: measured over the last third)",
    )
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--seeds", default="", help="comma-separated seeds (the mean is printed); overrides --seed")
    b.add_argument("--json", action="store_true")


def run_design_source(args: argparse.Namespace) -> int:
    rows = measure(args)
    if args.json:
        meta = {"duration_s": args.duration_s, "sse_duration_s": args.sse_duration_s, "seeds": _seeds(args)}
        print(json.dumps({**meta, "rows": rows, "notes": NOTES}))
    else:
        print(
            f"design source vs governor: {args.duration_s:g} s simulated (§3.1: {args.sse_duration_s:g} s), "
            f"seeds {_seeds(args)}"
        )
        print(table(rows))
    sys.stdout.flush()
    return 0
