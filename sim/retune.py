"""The worker's online retuning, simulation half: the fast loop fitted to a model's recent windows,
and the search of the gains there (:func:`propose`; the pure parts are :mod:`controllers.retune`).

:func:`propose` runs in a separate process (the worker's :mod:`streams.retune_shell`) or inline in
the fast loop (``governor bench retune``).  For each key of the model it builds a one-zone run from
the key's :class:`~controllers.retune.PlantFit`:

- **arrivals**: each window's request count, spread uniformly (seeded) over the window; every
  request with its window's mean prompt and output tokens;
- **capacity**: the simulated replica's capacity on those token sizes
  (:func:`sim.profiling.replica_capacity_rps`, a short bisection) against the capacity learned
  live: the arrival rate is scaled by their ratio, so the simulated fleet carries the live load in
  replicas (what the scaling loop acts on), and governor in the simulation plans with the
  simulated capacity as its prior;
- **start-up**: the measured one; the start fleet: the last window's replicas.

The score of a gain set is ``governor tune``'s objective (:func:`controllers.retune.objective`,
mean over the keys; the reference run and the ceiling computed once per key), and a candidate
whose margins the certificate refuses scores :data:`UNCERTIFIED` without a simulation (the margins
only: a second each with the SDP would eat the budget).  The proposal and the gains one bounded step
towards it are then put through the full gate (:func:`controllers.gain_certificate.gate`, the SDP
where cvxpy is importable).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from controllers.gain_certificate import PLANT_GAIN_RANGE, gate
from controllers.retune import PlantFit, RetuneJob, bounded_step, objective, search, search_box
from core.settings import Settings
from sim.fastloop import LoopConfig, fast_loop_settings, run
from sim.oracle import ceiling
from sim.profiling import replica_capacity_rps
from sim.traces import Trace
from sim.workloads import Workload

__all__ = ["UNCERTIFIED", "config_of", "propose", "workload_of"]

#: Score of a candidate the certificate's margins refuse (``governor tune``'s value).
UNCERTIFIED = 1000.0
TARGET_SHARE = 0.995  # governor tune's defaults
PENALTY = 1000.0
PROFILE_ITERS = 6  # the capacity bisection: 1.5 % resolution is ample for a ratio


def workload_of(fit: PlantFit, rate_scale: float = 1.0, seed: int = 0) -> Workload:
    """The fit's arrival schedule (module docstring), each window's count times ``rate_scale``."""
    rng = np.random.default_rng(seed)
    times, prompts, outputs = [], [], []
    for i, n in enumerate(fit.counts):
        k = int(rng.poisson(n * rate_scale)) if rate_scale != 1.0 else n
        times.append(fit.window_s * (i + np.sort(rng.random(k))))
        prompts.append(np.full(k, int(round(fit.prompt_tokens[i]))))
        outputs.append(np.full(k, int(round(fit.output_tokens[i]))))
    return Workload(
        np.concatenate(times), np.concatenate(prompts), np.concatenate(outputs), None, f"fit:{fit.model}|{fit.zone}"
    )


#: What the fitted run keeps of the worker's model and loop settings (the rest: the fast loop's).
_MODEL_FIELDS = ("ttft_slo_ms", "itl_slo_ms", "min_replicas", "max_replicas", "replica_headroom")
_LOOP_FIELDS = ("eps_ref", "controller", "dead_time_comp", "learn_capacity", "scale_down_dwell_windows", "drift")


def config_of(fit: PlantFit, settings: Settings, gains: Mapping[str, float], capacity_rps: float | None) -> LoopConfig:
    """A one-zone fast loop with the key's model (its SLOs and bounds), the settings' loop and ``gains``."""
    spec = settings.model(fit.model)
    if spec is None:
        raise KeyError(f"no model {fit.model!r} in settings")
    s = fast_loop_settings(
        model=spec.name,
        replica_capacity_rps=capacity_rps,
        zones=(fit.zone,),
        window_s=fit.window_s,
        startup_hint_s=fit.startup_s,
        pid_gains=dict(gains),
        **{k: getattr(spec, k) for k in _MODEL_FIELDS},
        **{k: getattr(settings, k) for k in _LOOP_FIELDS},
    )
    n0 = min(max(fit.initial_replicas, spec.min_replicas), spec.max_replicas)
    return LoopConfig(settings=s, initial_replicas=n0, startup_s=fit.startup_s)


@dataclass(frozen=True)
class _KeyRun:
    fit: PlantFit
    workload: Workload
    capacity_rps: float | None
    ceiling: float


def _key_run(fit: PlantFit, settings: Settings, seed: int) -> _KeyRun:
    """The fit's workload at the live load in simulated replicas (module docstring), and its ceiling."""
    base = workload_of(fit, 1.0, seed)
    cfg = config_of(fit, settings, {}, None)
    sim_cap: float | None = None
    scale = 1.0
    if fit.capacity_rps is not None and fit.capacity_rps > 0 and len(base):
        trace = Trace(base.arrival_s, base.prompt_tokens, base.output_tokens, name="fit")
        sim_cap = replica_capacity_rps(trace, cfg, iters=PROFILE_ITERS)
        scale = sim_cap / fit.capacity_rps
    w = workload_of(fit, scale, seed) if scale != 1.0 else base
    return _KeyRun(fit, w, sim_cap, ceiling(w, cfg))


def _simulate(kr: _KeyRun, settings: Settings, gains: Mapping[str, float]) -> dict[str, Any]:
    r = run("governor", kr.workload, config_of(kr.fit, settings, gains, kr.capacity_rps), (), kr.fit.duration_s)
    m = r.metrics
    return {"attainment": m["slo_attainment"] or 0.0, "gpu_seconds": m["gpu_seconds"], "reversals": m["reversals"]}


def _score(runs: list[dict[str, Any]], refs: list[dict[str, Any]], keys: list[_KeyRun]) -> float:
    terms = [
        objective(r["gpu_seconds"], ref["gpu_seconds"], r["attainment"], k.ceiling, TARGET_SHARE, PENALTY)
        for r, ref, k in zip(runs, refs, keys, strict=True)
    ]
    return float(np.mean(terms))


def _expected(runs: list[dict[str, Any]], score: float) -> dict[str, Any]:
    """The figures ``governor status`` shows: mean attainment, total GPU-seconds, reversals, objective."""
    return {
        "attainment": round(float(np.mean([r["attainment"] for r in runs])), 5),
        "gpu_seconds": round(float(sum(r["gpu_seconds"] for r in runs)), 1),
        "reversals": int(sum(r["reversals"] for r in runs)),
        "objective": round(score, 5),
    }


def propose(job: RetuneJob) -> dict[str, Any]:
    """Search ``job``'s model (module docstring): the proposal, one bounded step towards it, both gated,
    and the expected effect of the current and the proposed gains on the fit (plain data)."""
    settings, current = job.settings, dict(job.current)
    delay_s = max(f.startup_s for f in job.fits) + settings.window_s  # the slowest key's loop delay
    # A key whose fitted requests no fleet serves within the SLO (a window's mean prompt beyond what
    # prefill does in time) tells nothing of the gains: it is left out of the objective.
    keys = [k for i, f in enumerate(job.fits) if (k := _key_run(f, settings, job.seed + i)).ceiling > 0]
    if not keys:
        return _nothing(job, "no fitted key has a request any fleet serves within the SLO")
    refs = [_simulate(k, settings, current) for k in keys]
    ref_score = _score(refs, refs, keys)
    box = search_box(PLANT_GAIN_RANGE.hi)
    figures: dict[tuple[tuple[str, float], ...], list[dict[str, Any]]] = {}
    refused = {"n": 0}

    def score(gains: dict[str, float]) -> float:
        if gains == current:
            return ref_score
        g = {**current, **gains}
        if not gate(g, settings, delay_s=delay_s, sdp=False).accepted:
            refused["n"] += 1
            return UNCERTIFIED
        runs = [_simulate(k, settings, g) for k in keys]
        figures[tuple(sorted(g.items()))] = runs
        return _score(runs, refs, keys)

    # the search's first trial is the gains in force (their score known: no simulation spent)
    found = search(score, current, box, job.trials)
    proposed = {**current, **found.best}
    step = bounded_step(current, proposed, box, job.max_step)
    prop_runs = figures.get(tuple(sorted(proposed.items())), refs)
    verdict = gate(proposed, settings, delay_s=delay_s, sdp=job.sdp)
    step_verdict = verdict if step == proposed else gate(step, settings, delay_s=delay_s, sdp=job.sdp)
    return {
        "model": job.model,
        "at_ms": job.at_ms,
        "current": current,
        "proposed": proposed,
        "step": step,
        "gate": verdict.to_dict(),
        "step_gate": step_verdict.to_dict(),
        "expected": {
            "current": _expected(refs, ref_score),
            "proposed": _expected(prop_runs, found.best_score if math.isfinite(found.best_score) else ref_score),
        },
        "trials": len(found.trials),
        "trials_refused": refused["n"],
        "keys": [f"{k.fit.model}|{k.fit.zone}" for k in keys],
        "fit": [_fit_figures(k) for k in keys],
    }


def _fit_figures(k: _KeyRun) -> dict[str, Any]:
    f = k.fit
    return {"zone": f.zone, "windows": len(f.counts), "rate_rps": round(f.rate_rps, 3), "capacity_rps": f.capacity_rps,
            "simulated_capacity_rps": k.capacity_rps, "startup_s": f.startup_s, "ceiling": round(k.ceiling, 5)}  # fmt: skip


def _nothing(job: RetuneJob, why: str) -> dict[str, Any]:
    """A result that proposes the gains in force (no trial run): what the driver holds on."""
    same = dict(job.current)
    verdict = {"accepted": False, "reasons": [], "sdp": False, "note": why}
    return {"model": job.model, "at_ms": job.at_ms, "current": same, "proposed": same, "step": same,
            "gate": verdict, "step_gate": verdict, "expected": {}, "trials": 0, "trials_refused": 0, "keys": [],
            "fit": []}  # fmt: skip
