"""``governor tune``: Bayesian optimisation of the controller's gains against
the fast simulator, on chosen traces and scenarios.

Optuna's TPE sampler (seeded) proposes the feedback gains (ki, kp, deadband)
and the feedforward sizing (target utilisation, forecast-error headroom,
quiet decay); ki and kp within a box scaled to the plant gain (the
certificate bounds the loop gain b * k), the first trial the shipped
feedforward.  By default every scenario but spike, on seeds 0-2: gains
tuned on one seed or two scenarios overfit them (docs/benchmarks.md,
"Tuned for the workload").  The slew limit |a_k - a_{k-1}| <= 0.3 is not searched: it is
a hard constraint inside every controller step, so every trial honours it
(the design source asks for tuning *subject to* it: docs/model.md §4 (pid)).
Each trial runs every chosen (trace, scenario, seed) in :mod:`sim.fastloop`,
set up as ``governor bench control`` sets it (the trace's SLOs and rate, the
capacity profiled on that seed's fleet, every run starting at the
peak-minute fleet); the objective is

    mean over runs of  GPU-seconds / reference GPU-seconds
                     + penalty * max(0, target_share - attainment / ceiling)

where the reference is the run with the current default gains, so 1.0 is
"as costly as today", the ceiling is the attainment of an unbounded fleet
on that run (:func:`sim.oracle.ceiling`: requests no capacity can bring
within the SLO do not count against a trial), and a missed target costs
more than any saving (``--penalty 1000``: 0.1 point below it weighs as much
as the defaults' whole GPU-seconds; at 50, the old default, trials half a
point short and 40 % cheaper won).  The default target, 99.5 % of the ceiling, is
issue 17's knee; several seeds (``--seeds 0-2``) keep one draw's luck out
of the gains (docs/benchmarks.md, "The knee over seeds").  The best trial is written as a gains file
(``{"gains": {...}, ...}``) that the worker loads with GOVERNOR_GAINS_FILE.

Certified gains only (docs/model.md §22 (certified)): before its runs, each
trial's (kp, ki) should have a quadratic Lyapunov certificate of the loop
linearised at the plant gain ``--plant-gain`` with the loop delay
``--delay-s`` (default start-up + one window), in every mode that
:func:`controllers.stability.assess` checks.  A trial without one runs no
simulation and scores ``UNCERTIFIED`` (more the further its spectral radius
lies above 1); the trial written is the best *certified* one, and when no
trial is certified tune writes nothing and exits 1.  The certificate (modes,
margins, alpha, beta) is recorded in the gains file under ``"certificate"``,
next to ``"gains"`` (which stays a flat object of numbers).
"""

from __future__ import annotations

import json
import logging
import sys
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.analyze_gains import DEFAULT_PLANT_GAIN
from controllers.errors import ParameterError
from controllers.feedforward import FeedforwardParams
from controllers.pid import PidParams
from controllers.retune import objective
from controllers.stability import Assessment, OperatingPoint, assess
from core.vocab import DEFAULT_PID_GAINS
from sim.fastloop import LoopConfig, run
from sim.oracle import ceiling
from sim.scenarios import SCENARIOS, Scenario, scenario_list
from sim.traces import load_trace

TARGET_UTIL_BOX = (0.6, 1.0)  # ff_target_util's range: headroom 1.0 (a slope the queue absorbs) to 1.67

log = logging.getLogger(__name__)

#: what a trial runs by default: every scenario but ``spike`` (no strategy, the oracle
#: included, reaches 99.5 % of its ceiling there, so it would weigh the same on every
#: trial).  Tuned on burst and step alone (the default before), the gains held those on
#: every seed and lost diurnal and zone-cut (docs/benchmarks.md, "Tuned for the workload").
DEFAULT_SCENARIOS = tuple(s for s in SCENARIOS if s != "spike")

#: objective of a trial without a certificate (plus as much again per unit of
#: spectral radius above 1): far above any certified trial's
UNCERTIFIED = 1000.0


def add_parser(sub: Any) -> None:
    t = sub.add_parser("tune", help="Bayesian optimisation of the gains on the fast simulator")
    t.add_argument("--trace", action="append", default=None, help="trace (repeatable; default azure-conv)")
    t.add_argument(
        "--scenarios",
        default=",".join(DEFAULT_SCENARIOS),
        help=f"comma-separated from {','.join(SCENARIOS)} (default: all but spike, which no fleet meets)",
    )
    t.add_argument("--qps", type=float, default=0.0, help="base rate (0 = azure-conv 20, mooncake 4, else 20)")
    t.add_argument("--duration-s", type=float, default=600.0)
    t.add_argument("--trials", type=int, default=20)
    t.add_argument(
        "--target-share", type=float, default=0.995, help="attainment as a share of the ceiling each run should reach"
    )
    t.add_argument(
        "--penalty", type=float, default=1000.0, help="objective per unit of share below the target (0.1 point = 1.0)"
    )
    t.add_argument("--seed", type=int, default=0, help="the optimiser's seed")
    t.add_argument(
        "--seeds",
        default="0-2",
        help="the runs' seeds: N, N-M or a comma list (each run on each seed; one seed's gains overfit its draw)",
    )
    t.add_argument("--out", default="governor-gains.json", help="gains file to write")
    t.add_argument("--plant-gain", type=float, default=DEFAULT_PLANT_GAIN, help="b for the certificate")
    t.add_argument("--delay-s", type=float, default=None, help="loop delay for the certificate (start-up + window)")


def certificate(gains: dict[str, float], args: Namespace) -> list[Assessment]:
    """The stability assessment of ``gains`` on the fast loop's configuration."""
    cfg = LoopConfig()
    delay = cfg.startup_s + cfg.window_s if getattr(args, "delay_s", None) is None else args.delay_s
    plant = getattr(args, "plant_gain", DEFAULT_PLANT_GAIN)
    return assess(
        {"kp": gains.get("kp", 0.0), "ki": gains.get("ki", 0.0), "kd": gains.get("kd", 0.0)},
        cfg.controller,
        OperatingPoint(plant_gain=plant),
        delay,
        cfg.window_s,
        dead_time_comp=cfg.settings.dead_time_comp,
    )


@dataclass(frozen=True)
class TuneRun:
    """One (trace, scenario, seed) of the objective, set up as ``bench control`` sets it."""

    name: str  # trace/scenario/seed
    scenario: Scenario
    cfg: LoopConfig  # governor's: the profiled capacity, the warm start
    ceiling: float  # attainment of an unbounded fleet on this run


def _runs(args: Namespace) -> list[TuneRun]:
    from bench.control import prepare
    from bench.frontier import TRACE_QPS
    from bench.seeds import parse_seeds

    scenarios, unknown = scenario_list(args.scenarios)
    if unknown or not scenarios:
        raise ParameterError(f"--scenarios {args.scenarios!r}: choose from {', '.join(SCENARIOS)}")
    runs = []
    for trace_name in args.trace or ["azure-conv"]:
        trace = load_trace(trace_name)
        qps = args.qps or TRACE_QPS.get(Path(trace_name).name, 20.0)
        for seed in parse_seeds(str(getattr(args, "seeds", "0"))):
            ns = Namespace(
                trace=trace_name, qps=qps, duration_s=args.duration_s, seed=seed, startup_s=30.0, window_s=10.0
            )
            capacity = headroom = None
            for scenario in scenarios:
                setup = prepare(ns, scenario, trace, capacity, headroom)
                capacity, headroom = setup.capacity, setup.headroom  # profiled once per trace and seed
                cfg = setup.cfg.replace(replica_capacity_rps=capacity, replica_headroom=headroom)
                ceil = ceiling(setup.scenario.workload, setup.cfg)
                runs.append(TuneRun(f"{trace_name}/{scenario}/{seed}", setup.scenario, cfg, ceil))
    return runs


def evaluate(
    gains: dict[str, float],
    runs: list[TuneRun],
    reference: dict[str, float] | None,
    target: float,
    penalty: float,
) -> tuple[float, dict[str, Any]]:
    """The objective of ``gains`` over ``runs`` (mean; see the module doc) and each run's figures."""
    total, detail = 0.0, {}
    for tr in runs:
        sc = tr.scenario
        r = run("governor", sc.workload, tr.cfg.replace(pid_gains=gains), sc.faults, sc.duration_s)
        att, gpu = r.metrics["slo_attainment"] or 0.0, r.metrics["gpu_seconds"]
        share = att / tr.ceiling if tr.ceiling > 0 else 0.0
        ref = (reference or {}).get(tr.name, gpu)
        total += objective(gpu, ref, att, tr.ceiling, target, penalty)  # the worker's online retuning scores so too
        detail[tr.name] = {
            "slo_attainment": att,
            "share_of_ceiling": round(share, 5),
            "gpu_seconds": gpu,
            "waste": r.metrics.get("waste"),
            "reversals": r.metrics["reversals"],
        }
    return total / len(runs), detail


def _figures(detail: dict[str, Any]) -> str:
    """One run's figures a line: share of the ceiling / GPU-seconds (what the objective weighs)."""
    return "  ".join(f"{k}: {v['share_of_ceiling']:.2%} / {v['gpu_seconds']:,.0f}" for k, v in detail.items())


def run_tune(args: Namespace) -> int:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        certificate({"ki": 0.0}, args)  # --plant-gain and --delay-s, before any simulation
        runs = _runs(args)
    except ParameterError as exc:
        print(f"governor tune: {exc}")
        return 2
    default_gains = {"kp": DEFAULT_PID_GAINS["kp"], "ki": DEFAULT_PID_GAINS["ki"], "deadband": PidParams().deadband}
    base_score, base = evaluate(default_gains, runs, None, args.target_share, args.penalty)
    reference = {k: v["gpu_seconds"] for k, v in base.items()}
    base_score, base = evaluate(default_gains, runs, reference, args.target_share, args.penalty)
    print(f"defaults: objective {base_score:.3f}  " + _figures(base))

    # The certificate bounds the loop gain b * k: the box scales with the plant gain so that
    # most trials fall where certificates exist (at b = 3.909: ki <= 0.031, kp <= 0.31; with
    # the old fixed box, 0.005-0.5 and 0-1, two trials in three were refused unsimulated).
    ki_hi = min(0.5, max(0.005, 0.12 / max(args.plant_gain, 1e-9)))
    kp_hi = min(1.0, max(0.05, 1.2 / max(args.plant_gain, 1e-9)))

    def objective(trial: optuna.Trial) -> float:
        gains = {
            "kp": trial.suggest_float("kp", 0.0, kp_hi),
            "ki": trial.suggest_float("ki", ki_hi / 15.0, ki_hi, log=True),
            "deadband": trial.suggest_float("deadband", 0.0, 0.03),
            "ff_target_util": trial.suggest_float("ff_target_util", *TARGET_UTIL_BOX),
            "ff_error_margin": trial.suggest_float("ff_error_margin", 0.0, 3.0),
            "ff_decay_per_step": trial.suggest_float("ff_decay_per_step", 0.02, 0.5),
        }
        found = certificate(gains, args)
        if not all(a.certificate is not None for a in found):
            why = "; ".join(f"{a.mode}: {a.why}" for a in found if a.certificate is None)
            print(
                f"trial {trial.number:>3}: kp {gains['kp']:.3f} ki {gains['ki']:.4f} not certified ({why})", flush=True
            )
            trial.set_user_attr("certified", False)
            # Penalised, not pruned, so that TPE learns where the certified region lies.
            return UNCERTIFIED + UNCERTIFIED * max(0.0, max(x.spectral_radius for x in found) - 1.0)
        trial.set_user_attr("certified", True)
        score, detail = evaluate(gains, runs, reference, args.target_share, args.penalty)
        trial.set_user_attr("detail", detail)
        print(f"trial {trial.number:>3}: objective {score:.3f}  " + _figures(detail), flush=True)
        return score

    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=args.seed))
    # The first trial: the shipped feedforward with the shipped integral action, brought inside the box.
    first = {**default_gains, "ki": min(default_gains["ki"], ki_hi)}
    shipped = FeedforwardParams(capacity_rps=1.0)  # the feedforward's own defaults, not a copy of them
    # ... and the profile's headroom (each run's, averaged), as the defaults run plan with it
    heads = [r.cfg.replica_headroom for r in runs if r.cfg.replica_headroom is not None]
    util = 1.0 / (sum(heads) / len(heads)) if heads else shipped.target_util
    study.enqueue_trial(
        {
            **first,
            "ff_target_util": min(max(util, TARGET_UTIL_BOX[0]), TARGET_UTIL_BOX[1]),
            "ff_error_margin": shipped.error_margin,
            "ff_decay_per_step": shipped.decay_per_step,
        }
    )
    study.optimize(objective, n_trials=args.trials)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs.get("certified")]
    if not done:
        print(
            f"governor tune: none of the {args.trials} trials has certified gains at plant gain "
            f"{args.plant_gain:g} and the loop delay; nothing written (see `governor analyze gains`)"
        )
        return 1
    best = min(done, key=lambda t: float("inf") if t.value is None else t.value)
    gains_out = {**best.params, "kd": 0.0}
    found = certificate(gains_out, args)
    out = {
        "gains": gains_out,
        "certificate": {"plant_gain": args.plant_gain, "modes": [a.to_dict() for a in found]},
        "objective": best.value,
        "defaults_objective": base_score,
        "runs": best.user_attrs["detail"],
        "defaults_runs": base,
        "trials": args.trials,
        "target_share_of_ceiling": args.target_share,
        "seed": args.seed,
        "seeds": getattr(args, "seeds", "0"),
        "constraint": "slew |a_k - a_{k-1}| <= 0.3 enforced inside every controller step",
    }
    Path(args.out).write_text(json.dumps(out, indent=2))
    if best.value is not None and best.value > base_score:
        print(
            f"governor tune: the best certified trial scores {best.value:.3f}, worse than the (uncertified) "
            f"defaults' {base_score:.3f}: more --trials, or fewer scenarios and seeds, may find better"
        )
    print(
        f"best trial {best.number}: objective {best.value:.3f} (defaults {base_score:.3f}); "
        f"gains written to {args.out} (GOVERNOR_GAINS_FILE={args.out})"
    )
    sys.stdout.flush()
    return 0
