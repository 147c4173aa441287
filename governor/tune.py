"""``governor tune``: Bayesian optimisation of the controller's gains against
the fast simulator, on chosen traces and scenarios.

Optuna's TPE sampler (seeded) proposes the feedback gains (ki, kp, deadband)
and the feedforward sizing (target utilisation, forecast-error headroom,
quiet decay).  The slew limit |a_k - a_{k-1}| <= 0.3 is not searched: it is
a hard constraint inside every controller step, so every trial honours it
(the design source asks for tuning *subject to* it: docs/model.md §4 (pid)).
Each trial runs every chosen (trace, scenario) in :mod:`sim.fastloop`; the
objective is

    mean over runs of  GPU-seconds / reference GPU-seconds
                     + penalty * max(0, target_attainment - attainment)

where the reference is the run with the current default gains, so 1.0 is
"as costly as today" and a missed attainment target costs far more than
any saving.  The best trial is written as a gains file
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

import dataclasses
import json
import logging
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

from controllers.errors import ParameterError
from controllers.pid import PidParams
from controllers.stability import Assessment, OperatingPoint, assess
from core.vocab import DEFAULT_PID_GAINS
from governor.analyze_gains import DEFAULT_PLANT_GAIN
from sim.fastloop import LoopConfig, run
from sim.profiling import replica_capacity_rps
from sim.scenarios import SCENARIOS, build
from sim.traces import load_trace

log = logging.getLogger(__name__)

#: objective of a trial without a certificate (plus as much again per unit of
#: spectral radius above 1): far above any certified trial's
UNCERTIFIED = 1000.0


def add_parser(sub: Any) -> None:
    t = sub.add_parser("tune", help="Bayesian optimisation of the gains on the fast simulator")
    t.add_argument("--trace", action="append", default=None, help="trace (repeatable; default azure-conv)")
    t.add_argument("--scenarios", default="burst,step", help=f"comma-separated from {','.join(SCENARIOS)}")
    t.add_argument("--qps", type=float, default=20.0)
    t.add_argument("--duration-s", type=float, default=600.0)
    t.add_argument("--trials", type=int, default=20)
    t.add_argument("--target-attainment", type=float, default=0.994)
    t.add_argument("--penalty", type=float, default=50.0)
    t.add_argument("--seed", type=int, default=0)
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
        dead_time_comp=cfg.dead_time_comp,
    )


def _runs(args: Namespace) -> list[tuple[str, Any, LoopConfig]]:
    runs = []
    for trace_name in args.trace or ["azure-conv"]:
        trace = load_trace(trace_name)
        cfg = LoopConfig(seed=args.seed)
        cfg = dataclasses.replace(cfg, replica_capacity_rps=replica_capacity_rps(trace, cfg))
        for scenario in [s.strip() for s in args.scenarios.split(",") if s.strip()]:
            runs.append((f"{trace_name}/{scenario}", build(scenario, trace, args.qps, args.duration_s), cfg))
    return runs


def evaluate(
    gains: dict[str, float],
    runs: list[tuple[str, Any, LoopConfig]],
    reference: dict[str, float] | None,
    target: float,
    penalty: float,
) -> tuple[float, dict[str, Any]]:
    total, detail = 0.0, {}
    for name, sc, cfg in runs:
        r = run("governor", sc.workload, dataclasses.replace(cfg, pid_gains=gains), sc.faults, sc.duration_s)
        att, gpu = r.metrics["slo_attainment"] or 0.0, r.metrics["gpu_seconds"]
        ref = (reference or {}).get(name, gpu)
        total += gpu / ref + penalty * max(0.0, target - att)
        detail[name] = {"slo_attainment": att, "gpu_seconds": gpu, "reversals": r.metrics["reversals"]}
    return total / len(runs), detail


def run_tune(args: Namespace) -> int:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        certificate({"ki": 0.0}, args)  # --plant-gain and --delay-s, before any simulation
    except ParameterError as exc:
        print(f"governor tune: {exc}")
        return 2
    runs = _runs(args)
    default_gains = {"kp": DEFAULT_PID_GAINS["kp"], "ki": DEFAULT_PID_GAINS["ki"], "deadband": PidParams().deadband}
    base_score, base = evaluate(default_gains, runs, None, args.target_attainment, args.penalty)
    reference = {k: v["gpu_seconds"] for k, v in base.items()}
    base_score, base = evaluate(default_gains, runs, reference, args.target_attainment, args.penalty)
    print(
        f"defaults: objective {base_score:.3f}  "
        + "  ".join(f"{k}: {v['slo_attainment']:.2%} / {v['gpu_seconds']:,.0f} GPU-s" for k, v in base.items())
    )

    def objective(trial: optuna.Trial) -> float:
        gains = {
            "kp": trial.suggest_float("kp", 0.0, 1.0),
            "ki": trial.suggest_float("ki", 0.005, 0.5, log=True),
            "deadband": trial.suggest_float("deadband", 0.0, 0.03),
            "ff_target_util": trial.suggest_float("ff_target_util", 0.6, 0.95),
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
        score, detail = evaluate(gains, runs, reference, args.target_attainment, args.penalty)
        trial.set_user_attr("detail", detail)
        print(
            f"trial {trial.number:>3}: objective {score:.3f}  "
            + "  ".join(f"{k}: {v['slo_attainment']:.2%} / {v['gpu_seconds']:,.0f}" for k, v in detail.items()),
            flush=True,
        )
        return score

    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=args.seed))
    study.enqueue_trial({**default_gains, "ff_target_util": 0.8, "ff_error_margin": 1.5, "ff_decay_per_step": 0.1})
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
        "target_attainment": args.target_attainment,
        "seed": args.seed,
        "constraint": "slew |a_k - a_{k-1}| <= 0.3 enforced inside every controller step",
    }
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(
        f"best trial {best.number}: objective {best.value:.3f} (defaults {base_score:.3f}); "
        f"gains written to {args.out} (GOVERNOR_GAINS_FILE={args.out})"
    )
    sys.stdout.flush()
    return 0
