"""``governor bench admission``: what one admission review costs at 100 and 1,000 registered tasks.

No servers: the worker's :class:`~loop.admission_driver.AdmissionDriver` on an
in-memory registry, and the analysis alone (:func:`controllers.rta.analyse`) on one
orchestrator's whole set.  Tasks are seeded: C = the model's P99 (100 ms), periods
drawn so each orchestrator's utilisation is about 0.6, priorities rate-monotonic.
Rows (seconds of one call on this machine):

* ``first review``: every task pending, each admitted one at a time, then each
  orchestrator's set re-checked with its margin (the worker does this once);
* ``re-check``: the same registry after the P99 moved (what every window costs);
* ``analyse one set``: the response times and margin of ``n`` tasks on one
  orchestrator (the driver caps an orchestrator at
  :data:`~controllers.admission.MAX_TASKS_PER_ORCHESTRATOR`; the analysis has no cap).

    governor bench admission [--sizes 100,1000] [--seed 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from typing import Any

import orjson

from controllers.admission import MAX_TASKS_PER_ORCHESTRATOR
from controllers.rta import Task, analyse
from controllers.window_record import decode_window
from loop.admission_driver import AdmissionDriver

__all__ = ["add_parser", "measure", "run_admission_bench"]

P99_MS = 100.0
UTILISATION = 0.6


def add_parser(bsub: Any) -> None:
    p = bsub.add_parser("admission", help="one admission review at 100 and 1,000 tasks (no servers)")
    p.add_argument("--sizes", default="100,1000", help="registered task counts, comma-separated")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", action="store_true")


def _periods(rnd: random.Random, n: int) -> list[float]:
    """``n`` periods (ms) whose utilisation at C = P99_MS sums to UTILISATION, shortest first."""
    w = [rnd.uniform(0.5, 1.5) for _ in range(n)]
    total = sum(w)
    return sorted(round(P99_MS / (UTILISATION * x / total), 3) for x in w)


def _window(k: int, p99_ms: float) -> Any:
    return decode_window(
        {
            "scope": "zone",
            "model": "m",
            "zone": "az-a",
            "window_start_ms": k * 10_000,
            "window_end_ms": (k + 1) * 10_000,
            "window_s": 10.0,
            "count": 100,
            "violation_rate": 0.0,
            "e2e_p99_ms": p99_ms,
        }
    )


def _registry(n: int, rnd: random.Random) -> dict[bytes, bytes]:
    per = min(n, MAX_TASKS_PER_ORCHESTRATOR - 3)
    out: dict[bytes, bytes] = {}
    for o in range(math.ceil(n / per)):
        size = min(per, n - o * per)
        for i, period in enumerate(_periods(rnd, size)):
            task = {"orchestrator": f"o{o}", "name": f"t{i}", "model": "m", "period_ms": period, "priority": i}
            out[f"o{o}|t{i}".encode()] = orjson.dumps({**task, "state": "pending", "registered_ms": i})
    return out


def measure(sizes: tuple[int, ...] = (100, 1000), seed: int = 7) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for n in sizes:
        rnd = random.Random(seed + n)
        reg = _registry(n, rnd)
        drv = AdmissionDriver(10.0)
        drv.on_window(_window(0, P99_MS))
        t0 = time.perf_counter()
        writes, _ = drv.review(reg, 1)
        first_s = time.perf_counter() - t0
        reg.update({k.encode(): v for k, v in writes.items()})
        states = [orjson.loads(v)["state"] for v in reg.values()]
        drv.on_window(_window(1, P99_MS * 1.05))
        t0 = time.perf_counter()
        drv.review(reg, 2)
        recheck_s = time.perf_counter() - t0
        tasks = [Task(f"t{i}", P99_MS, t, priority=i) for i, t in enumerate(_periods(rnd, n))]
        t0 = time.perf_counter()
        results, margin = analyse(tasks, slack=False, rel_tol=1e-3)
        analyse_s = time.perf_counter() - t0
        rows.append(
            {
                "tasks": n,
                "orchestrators": len({k.split(b"|")[0] for k in reg}),
                "admitted": states.count("admitted"),
                "first_review_s": round(first_s, 3),
                "recheck_s": round(recheck_s, 3),
                "analyse_one_set_s": round(analyse_s, 3),
                "one_set_feasible": all(r.feasible for r in results),
                "one_set_margin": None if margin is None else round(margin, 3),
            }
        )
    return rows


def run_admission_bench(args: argparse.Namespace) -> int:
    sizes = tuple(int(s) for s in str(args.sizes).split(",") if s.strip())
    rows = measure(sizes, args.seed)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"{'tasks':>6} {'orchs':>5} {'admitted':>8} {'first review s':>14} {'re-check s':>10} {'analyse 1 set s':>15}"
    )
    for r in rows:
        print(
            f"{r['tasks']:>6} {r['orchestrators']:>5} {r['admitted']:>8} {r['first_review_s']:>14.3f} "
            f"{r['recheck_s']:>10.3f} {r['analyse_one_set_s']:>15.3f}"
        )
    return 0
