"""``governor bench dispatch``: prefix-aware dispatch against least outstanding tokens on the Mooncake trace.

One static fleet (``--replicas`` of one model in one zone), the Mooncake
conversation trace (its prefix ``hash_ids``: 512-token blocks) cut to
``--duration-s`` and time-scaled to ``--qps``, replayed once per dispatch
policy (:mod:`controllers.dispatch`) with the same seed: the simulated
replicas skip the prefill of a request's cached leading blocks
(:mod:`sim.replica`), so where a request lands decides what it prefills.
Printed side by side: SLO attainment (TTFT and mean ITL within the
model's SLOs), P95 TTFT, the prefix hit rate (cached leading blocks over
all prefix blocks) and the GPU-seconds the replicas were busy (provisioned
GPU-seconds are the same in every arm).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from controllers.dispatch import DispatchParams
from core.defaults import ITL_SLO_MS, TTFT_SLO_MS
from sim.fleet import Fleet, FleetConfig
from sim.perf_model import PerfModel
from sim.traces import load_trace

__all__ = ["add_parser", "run_dispatch"]

MODEL, ZONE = "llama2-70b", "az-a"


def add_parser(sub: Any) -> None:
    """Register ``dispatch`` under ``governor bench``."""
    p = sub.add_parser("dispatch", help="prefix-aware dispatch vs least outstanding tokens on the Mooncake trace")
    p.add_argument("--replicas", type=int, default=8)
    p.add_argument("--qps", type=float, default=2.0, help="mean arrival rate the trace is scaled to")
    p.add_argument("--duration-s", type=float, default=600.0, help="trace seconds replayed (after scaling)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-threshold", type=float, default=DispatchParams.cache_threshold)
    p.add_argument("--balance-abs-threshold", type=int, default=DispatchParams.balance_abs_threshold)
    p.add_argument("--balance-rel-threshold", type=float, default=DispatchParams.balance_rel_threshold)
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def arm(args: argparse.Namespace, params: DispatchParams) -> dict[str, Any]:
    """One replay of the trace under ``params``; its figures."""
    trace = load_trace("mooncake").scaled_to_qps(args.qps).window(0.0, args.duration_s)
    perf = PerfModel.from_splitwise(model=MODEL)
    cfg = FleetConfig(
        models={MODEL: perf}, zones=(ZONE,), initial_replicas=args.replicas, seed=args.seed, dispatch=params
    )
    f = Fleet(cfg)
    ids = trace.hash_ids or [[] for _ in range(len(trace))]
    for i in range(len(trace)):
        f.submit(
            float(trace.arrival_s[i]),
            ZONE,
            MODEL,
            int(trace.prompt_tokens[i]),
            int(trace.output_tokens[i]),
            f"r{i}",
            hash_ids=list(ids[i]),
        )
    end = args.duration_s + 1800.0
    recs = f.advance_to(end)
    busy_s = sum(g["gpu_util"] * end for g in f.gpu_snapshot(end)) * perf.tensor_parallel
    ttft = [r["ttft_ms"] for r in recs]
    on_time = [r["ttft_ms"] <= TTFT_SLO_MS and (r["output_tokens"] <= 1 or r["itl_ms"] <= ITL_SLO_MS) for r in recs]
    blocks = sum(len(h) for h in ids)
    return {
        "requests": len(trace),
        "completed": len(recs),
        "attainment": sum(on_time) / max(1, len(trace)),
        "p95_ttft_ms": float(np.percentile(ttft, 95)) if ttft else None,
        "prefix_hit_rate": sum(int(r.get("kv_hit_blocks", 0)) for r in recs) / max(1, blocks),
        "gpu_busy_seconds": busy_s,
        "gpu_seconds_provisioned": args.replicas * perf.tensor_parallel * end,
    }


def run_dispatch(args: argparse.Namespace) -> int:
    prefix = DispatchParams(
        policy="prefix-aware",
        cache_threshold=args.cache_threshold,
        balance_abs_threshold=args.balance_abs_threshold,
        balance_rel_threshold=args.balance_rel_threshold,
    )
    res = {"least-outstanding": arm(args, DispatchParams()), "prefix-aware": arm(args, prefix)}
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(
        f"Mooncake trace, {args.duration_s:g} s at {args.qps:g} req/s, {args.replicas} x {MODEL}; "
        f"prefix-aware: cache {prefix.cache_threshold:g}, balance abs {prefix.balance_abs_threshold} "
        f"rel {prefix.balance_rel_threshold:g}; SLO TTFT {TTFT_SLO_MS:g} ms, ITL {ITL_SLO_MS:g} ms"
    )
    print(f"{'':20}{'attainment':>12}{'P95 TTFT ms':>14}{'prefix hits':>13}{'GPU-s busy':>12}")
    for name, r in res.items():
        p95 = r["p95_ttft_ms"]
        print(
            f"{name:20}{r['attainment']:>12.1%}{(p95 if p95 is not None else float('nan')):>14.0f}"
            f"{r['prefix_hit_rate']:>13.1%}{r['gpu_busy_seconds']:>12.0f}"
        )
    return 0
