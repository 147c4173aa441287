"""``governor bench retune``: online retuning against the fixed defaults and PID^alpha adapting, side by side
on one fast-loop run whose workload changes character half-way (azure-conv, then Mooncake).

One seeded workload: ``--first`` at ``--qps-first`` for the first half of ``--duration-s``, then
``--second`` at ``--qps-second`` (each trace's bench rate by default), with the first trace's SLOs
throughout; the capacity profiled on the first trace (as ``bench control`` profiles it), every arm
starting at the first half's peak-minute fleet.  Arms:

- ``retune``: governor with online retuning in ``apply`` mode (:mod:`loop.retune_driver`), its search
  (:func:`sim.retune.propose`) run inline every ``--period-s`` with ``--trials`` trials;
- ``defaults``: governor with the shipped gains, fixed;
- ``fpid-adaptive``: PID^alpha (``GOVERNOR_CONTROLLER=fpid``, its shipped gains) with the order's
  adaptation on: ``eta``, ``gamma``, ``beta`` of :data:`FPID_ADAPTATION` (module constant: how chosen).

Prints attainment (and the ceiling), GPU-seconds and reversals per arm, and the retunes' actions.
"""

from __future__ import annotations

import logging
import time
from argparse import Namespace
from typing import Any

import numpy as np

from bench.control import prepare
from bench.frontier import TRACE_QPS
from controllers.fpid import FpidParams
from sim.fastloop import run
from sim.oracle import ceiling
from sim.retune import propose
from sim.traces import load_trace
from sim.workloads import Workload, from_trace

__all__ = ["FPID_ADAPTATION", "add_parser", "run_retune"]

#: PID^alpha's adaptation ``alpha' = alpha + eta (e + gamma sum(e) - beta de/dt)``, chosen by scale, not tuned
#: (the design source gives no values): the error is a violation rate, ~0.1-0.5 in an overload; eta = 0.5
#: moves the order by 0.05-0.25 a window there; gamma = 0.05 makes a persistent 5 % error over the 64-window
#: memory (sum 3.2) weigh as much again; beta = 1 s at 10 s windows weighs a jump of the error a tenth as much.
FPID_ADAPTATION = {"eta": 0.5, "gamma": 0.05, "beta": 1.0}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "retune",
        help="online retuning vs the fixed defaults vs PID^alpha adapting, on a workload that changes half-way",
    )
    p.add_argument("--first", default="azure-conv", help="trace of the first half")
    p.add_argument("--second", default="mooncake", help="trace of the second half")
    p.add_argument("--qps-first", type=float, default=0.0, help="0 = the trace's bench rate")
    p.add_argument("--qps-second", type=float, default=0.0, help="0 = the trace's bench rate")
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--period-s", type=float, default=120.0, help="GOVERNOR_RETUNE_PERIOD_S of the retune arm")
    p.add_argument("--trials", type=int, default=8, help="GOVERNOR_RETUNE_TRIALS of the retune arm")
    p.add_argument("--seed", type=int, default=0)


def _switch(args: Namespace) -> Workload:
    half = args.duration_s / 2.0
    parts = []
    for i, name in enumerate((args.first, args.second)):
        qps = (args.qps_first, args.qps_second)[i] or TRACE_QPS.get(name, 20.0)
        w = from_trace(load_trace(name), qps, half)
        parts.append((w.arrival_s + i * half, w.prompt_tokens, w.output_tokens))
    return Workload(
        np.concatenate([p[0] for p in parts]),
        np.concatenate([p[1] for p in parts]),
        np.concatenate([p[2] for p in parts]),
        None,
        f"{args.first}->{args.second}",
    )


def run_retune(args: Namespace) -> int:
    logging.getLogger("loop").setLevel(logging.ERROR)  # the drift and retune lines of three runs: the table says it
    ns = Namespace(
        trace=args.first, qps=args.qps_first or TRACE_QPS.get(args.first, 20.0), duration_s=args.duration_s / 2,
        seed=args.seed, startup_s=30.0, window_s=10.0,
    )  # fmt: skip
    setup = prepare(ns, "replay")
    cfg = setup.cfg.replace(replica_capacity_rps=setup.capacity, replica_headroom=setup.headroom, retune="off")
    workload = _switch(args)
    ceil = ceiling(workload, cfg)
    fpid = FpidParams()
    arms = {
        "retune": (cfg.replace(retune="apply", retune_period_s=args.period_s, retune_trials=args.trials), propose),
        "defaults": (cfg, None),
        "fpid-adaptive": (
            cfg.replace(controller="fpid", pid_gains={"kp": fpid.kp, "ki": fpid.ki, "kd": fpid.kd, **FPID_ADAPTATION}),
            None,
        ),
    }
    print(
        f"governor bench retune --first {args.first} --second {args.second} --duration-s {args.duration_s:g} "
        f"--period-s {args.period_s:g} --trials {args.trials} --seed {args.seed}"
    )
    print(f"workload {workload.name}: {len(workload)} requests; ceiling (unbounded fleet) {ceil:.2%}")
    print(f"{'arm':<14} {'attainment':>10} {'GPU-s':>10} {'reversals':>9} {'wall s':>7}")
    for name, (arm_cfg, search) in arms.items():
        t0 = time.perf_counter()
        r = run("governor", workload, arm_cfg, (), args.duration_s, name=name, retune=search)
        m = r.metrics
        print(
            f"{name:<14} {m['slo_attainment']:>10.2%} {m['gpu_seconds']:>10,.0f} {m['reversals']:>9d} "
            f"{time.perf_counter() - t0:>7.1f}",
            flush=True,
        )
        for ev in (e for e in r.events if e.get("kind") == "retune"):
            prop = ev.get("proposal") or {}
            exp = prop.get("expected") or {}
            print(
                f"  t={ev['t_s']:>4.0f} s {ev['action']:<8} in force {_g(ev['in_force'])}  proposed "
                f"{_g(prop.get('proposed'))}  fit objective {(exp.get('current') or {}).get('objective')} -> "
                f"{(exp.get('proposed') or {}).get('objective')}, {prop.get('trials')} trials "
                f"({prop.get('trials_refused')} refused by the margins) ({ev['reason']})"
            )
    return 0


def _g(g: Any) -> str:
    return (
        "-" if not isinstance(g, dict) else " ".join(f"{k}={g[k]:.4g}" for k in ("kp", "ki", "kd", "ki_down") if k in g)
    )
