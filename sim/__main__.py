"""Speed check: replay a trace through a fixed fleet as fast as possible.

``python -m sim --trace azure-conv --qps 200 --duration-s 600 --replicas 40``
prints requests simulated, wall seconds, speed-up over real time and TTFT
percentiles. Requests are submitted in 100 ms slices, as the live driver does.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from sim.fleet import Fleet, FleetConfig
from sim.perf_model import PerfModel
from sim.traces import load_trace


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sim", description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="azure-conv")
    ap.add_argument("--qps", type=float, default=200.0)
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--replicas", type=int, default=40, help="total, split over the zones")
    ap.add_argument("--zones", default="az-a", help="comma-separated")
    ap.add_argument("--model", default="llama2-70b")
    ap.add_argument("--hardware", default="h100-80gb")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--no-jitter", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--slice-s", type=float, default=0.1)
    args = ap.parse_args(argv)

    zones = tuple(z.strip() for z in args.zones.split(",") if z.strip())
    perf = PerfModel.from_splitwise(model=args.model, hardware=args.hardware, tensor_parallel=args.tp)
    tr = load_trace(args.trace).scaled_to_qps(args.qps).loop_to(args.duration_s)
    cfg = FleetConfig(models={args.model: perf}, zones=zones, jitter=not args.no_jitter, seed=args.seed)
    fleet = Fleet(cfg, epoch_ms0=0)
    per_zone = [args.replicas // len(zones) + (i < args.replicas % len(zones)) for i in range(len(zones))]
    for z, n in zip(zones, per_zone, strict=True):
        fleet.set_desired(z, args.model, n, 0.0)
    t_start = cfg.startup_s  # submit once the fleet is ready
    fleet.advance_to(t_start)

    arr, pt, ot, h = tr.arrival_s, tr.prompt_tokens.tolist(), tr.output_tokens.tolist(), tr.hash_ids
    records: list[dict[str, Any]] = []
    wall0 = time.perf_counter()
    i, n = 0, len(tr)
    t = 0.0
    while t < args.duration_s:
        t1 = min(t + args.slice_s, args.duration_s)
        j = int(np.searchsorted(arr, t1, side="left"))
        for k in range(i, j):
            fleet.submit(
                t_start + float(arr[k]),
                zones[k % len(zones)],
                args.model,
                pt[k],
                ot[k],
                str(k),
                None if h is None else h[k],
            )
        i, t = j, t1
        records += fleet.advance_to(t_start + t)
    records += fleet.advance_to(t_start + args.duration_s + 3600.0)  # drain
    wall = time.perf_counter() - wall0
    st = fleet.stats()
    ttft = np.array([r["ttft_ms"] for r in records])
    e2e = np.array([r["e2e_ms"] for r in records])
    print(f"trace={tr.name} requests={n} completed={len(records)} conserved={st['conserved']}")
    print(
        f"simulated {args.duration_s:.0f} s (+drain) in {wall:.2f} s wall: "
        f"{args.duration_s / wall:.1f}x real time, {n / wall:,.0f} requests/s"
    )
    if len(ttft):
        p = np.percentile(ttft, [50, 95, 99])
        q = np.percentile(e2e, [50, 95, 99])
        print(f"TTFT ms P50/P95/P99: {p[0]:.0f} / {p[1]:.0f} / {p[2]:.0f}")
        print(f"E2E  ms P50/P95/P99: {q[0]:.0f} / {q[1]:.0f} / {q[2]:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
