"""``governor bench sim-vs-real``: the simulator against the real engines, on one arrival schedule.

A ``governor demo --platform local`` run profiled its engine (the service-time
knots: unloaded TTFT by prompt size, ITL by batch; the capacity at the SLO;
the measured cold start) and replayed a trace through the real router under
the closed loop.  This command configures the simulated fleet from that
profile (:func:`perf_from_knots`: a :class:`sim.perf_model.PerfModel` whose
knots are the engine's, the batch limit its ``--max-num-seqs``, the start-up
its measured cold start), runs the *same* arrival schedule (the trace, rates
and steps of the run, :func:`sim.workloads.from_trace`) through the fast
closed loop (:mod:`sim.fastloop`, the worker's own control loop), and prints
the two timelines side by side per window: ready replicas, P95 TTFT and SLO
attainment of the requests that arrived in the window.  The gap is the
simulator's fidelity on this machine:

* ``replicas``: mean |sim - real| ready replicas over the windows;
* ``p95 ttft``: median of sim/real per window (1.0 = the same);
* ``attainment``: sim - real over the whole run, in points.

Only requests the client sent count on the real side (a failed or cut request is
a miss), as in the demo report.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engines.profiling import nearest_rank
from sim.fastloop import LoopConfig, run
from sim.perf_model import PerfModel
from sim.traces import load_trace
from sim.workloads import Workload, from_trace

__all__ = ["add_parser", "compare", "perf_from_knots", "run_sim_vs_real", "timeline"]

# The tiny model's KV bytes per token: 2 (K, V) x 2 layers x 4 KV heads x head_dim 64 x 2 bytes (bfloat16).
TINY_KV_BYTES_PER_TOKEN = 2 * 2 * 4 * 64 * 2
GIB = 1 << 30


def _increasing(points: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Knots strictly increasing in x and non-decreasing in y (a noisy measurement made monotone).

    >>> _increasing([(16, 5.0), (64, 4.0), (256, 9.0)])
    ((16.0, 64.0, 256.0), (5.0, 5.0, 9.0))
    """
    xs: list[float] = []
    ys: list[float] = []
    top = 0.0
    for x, y in sorted((float(a), float(b)) for a, b in points):
        if xs and x <= xs[-1]:
            continue
        top = max(top, y)
        xs.append(x)
        ys.append(top)
    if not xs:
        raise ValueError("knots: no measured point")
    return tuple(xs), tuple(ys)


def perf_from_knots(knots: Mapping[str, Sequence[Sequence[float]]], kv_cache_gib: float = 1.0) -> PerfModel:
    """A simulated replica with the real engine's measured service times (module docstring).

    >>> pm = perf_from_knots({"prefill": [(16, 8.0), (1024, 20.0)], "decode": [(1, 3.0), (4, 5.0)]})
    >>> round(pm.prefill_ms(16), 1), round(pm.decode_step_ms(4), 1), pm.kv_capacity_tokens
    (8.0, 5.0, 524288)
    """
    px, py = _increasing(knots["prefill"])
    dx, dy = _increasing(knots["decode"])
    return PerfModel(
        model="tiny-llama",
        hardware="cpu",
        tensor_parallel=1,
        prefill_tokens=px,
        prefill_knots_ms=py,
        decode_batch=dx,
        decode_knots_ms=dy,
        decode_ctx_slope_ms=0.0,
        kv_bytes_per_token=TINY_KV_BYTES_PER_TOKEN,
        weight_bytes=0,
        hbm_bytes=int(kv_cache_gib * GIB),
        gpu_memory_utilization=1.0,
    )


def clipped(workload: Workload, max_prompt_tokens: int, max_output_tokens: int) -> Workload:
    """The workload's lengths clipped as the load client clipped them (:func:`engines.loadgen.schedule`:
    each in ``[1, max]``), so both fleets serve the same requests; the arrival times are unchanged.

    >>> import numpy as np
    >>> w = Workload(np.array([0.0, 1.0]), np.array([900, 10]), np.array([300, 0]), None, "w")
    >>> c = clipped(w, 512, 64)
    >>> c.prompt_tokens.tolist(), c.output_tokens.tolist()
    ([512, 10], [64, 1])
    """
    return dataclasses.replace(
        workload,
        prompt_tokens=np.clip(np.asarray(workload.prompt_tokens), 1, max_prompt_tokens),
        output_tokens=np.clip(np.asarray(workload.output_tokens), 1, max_output_tokens),
    )


def timeline(
    requests: Sequence[Mapping[str, Any]],
    replicas: Sequence[tuple[float, int]],
    window_s: float,
    duration_s: float,
    ttft_slo_ms: float,
    itl_slo_ms: float,
) -> list[dict[str, Any]]:
    """Per window of arrival time: ready replicas at its end, P95 TTFT and attainment of its arrivals.

    ``requests``: ``at_s`` (arrival), ``ok``, ``ttft_ms``, ``itl_ms``; ``replicas``: (t_s, ready), sorted.

    >>> reqs = [{"at_s": 1.0, "ok": True, "ttft_ms": 10.0, "itl_ms": 1.0},
    ...         {"at_s": 2.0, "ok": False, "ttft_ms": None, "itl_ms": None}]
    >>> timeline(reqs, [(0.0, 1)], 10.0, 10.0, 50.0, 5.0)
    [{'t_s': 10.0, 'replicas': 1, 'requests': 2, 'p95_ttft_ms': 10.0, 'attainment': 0.5}]
    """
    rows = []
    n = max(1, math.ceil(duration_s / window_s))
    for k in range(n):
        lo, hi = k * window_s, (k + 1) * window_s
        inside = [r for r in requests if lo <= r["at_s"] < hi]
        ready = 0
        for t, c in replicas:
            if t <= hi:
                ready = c
        ok = [r for r in inside if r["ok"]]
        met = sum(1 for r in ok if r["ttft_ms"] <= ttft_slo_ms and (r["itl_ms"] or 0.0) <= itl_slo_ms)
        p95 = nearest_rank([float(r["ttft_ms"]) for r in ok], 0.95)
        rows.append(
            {
                "t_s": hi,
                "replicas": ready,
                "requests": len(inside),
                "p95_ttft_ms": None if p95 is None else round(p95, 1),
                "attainment": round(met / len(inside), 4) if inside else None,
            }
        )
    return rows


def _real(report: Mapping[str, Any], requests: Sequence[Mapping[str, Any]]) -> tuple[list[Any], list[Any]]:
    """The client's requests (``requests.json``'s results: ``spec.at_s``, ``status``, ``ttft_s``, ``itl_s``)."""
    reqs = [
        {
            "at_s": float(r["spec"]["at_s"]),
            "ok": r["status"] == "ok",
            "ttft_ms": None if r.get("ttft_s") is None else 1000.0 * float(r["ttft_s"]),
            "itl_ms": None if r.get("itl_s") is None else 1000.0 * float(r["itl_s"]),
        }
        for r in requests
    ]
    reps = [(float(t), int(ready)) for t, _z, _m, ready, _s, _d in report["replica_series"]]
    return reqs, reps


def _simulated(report: Mapping[str, Any]) -> tuple[list[Any], list[Any], dict[str, Any]]:
    prof = report["profile"]
    slo = report["slo"]
    cap = float(prof["capacity_rps"])
    segments = [tuple(s) for s in report["segments"]]
    workload = clipped(
        from_trace(load_trace(report["trace"]), float(report["base_qps"]), float(report["duration_s"]), segments),
        int(report.get("prompt_tokens_max", 512)),
        int(report.get("output_tokens_max", 64)),
    )
    cfg = LoopConfig.of(
        model="tiny-llama",
        ttft_slo_ms=float(slo["ttft_slo_ms"]),
        itl_slo_ms=float(slo["itl_slo_ms"]),
        replica_capacity_rps=cap,
        min_replicas=1,
        max_replicas=int(report["max_engines"]),
        zones=("local",),
        initial_replicas=1,
        startup_s=float(report["cold_start_s"]),
        seed=int(report.get("seed", 0)),
        gpus_per_replica=1,
    ).replace(perf=perf_from_knots(prof["knots"]), max_batch=int(report["max_num_seqs"]))
    res = run("governor", workload, cfg, duration_s=float(report["duration_s"]))
    epoch = min((r["arrival_ms"] for r in res.finished), default=0)
    t0 = epoch - 1000 * float(workload.arrival_s[0]) if len(workload) else 0
    reqs = [
        {"at_s": (r["arrival_ms"] - t0) / 1000.0, "ok": True, "ttft_ms": r["ttft_ms"], "itl_ms": r["itl_ms"]}
        for r in res.finished
    ]
    ts = res.timeline.get("t_s")
    ready = res.timeline.get("local.ready")
    reps = [] if ts is None or ready is None else [(float(a), int(b)) for a, b in zip(ts, ready, strict=False)]
    return reqs, reps, res.metrics


def compare(report: Mapping[str, Any], requests: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Both timelines and the gap (module docstring)."""
    slo = report["slo"]
    window_s = float(report.get("window_s", 10.0))
    duration = float(report["duration_s"])
    real_reqs, real_reps = _real(report, requests)
    sim_reqs, sim_reps, sim_metrics = _simulated(report)
    args = (window_s, duration, float(slo["ttft_slo_ms"]), float(slo["itl_slo_ms"]))
    real = timeline(real_reqs, real_reps, *args)
    sim = timeline(sim_reqs, sim_reps, *args)
    rep_gap = [abs(a["replicas"] - b["replicas"]) for a, b in zip(sim, real, strict=True)]
    ratios = [
        a["p95_ttft_ms"] / b["p95_ttft_ms"]
        for a, b in zip(sim, real, strict=True)
        if a["p95_ttft_ms"] and b["p95_ttft_ms"]
    ]

    def overall(reqs: Sequence[Mapping[str, Any]]) -> float | None:
        if not reqs:
            return None
        met = sum(1 for r in reqs if r["ok"] and r["ttft_ms"] <= args[2] and (r["itl_ms"] or 0.0) <= args[3])
        return met / len(reqs)

    a_sim, a_real = overall(sim_reqs), overall(real_reqs)
    return {
        "real": real,
        "sim": sim,
        "gap": {
            "replicas_mean_abs": round(sum(rep_gap) / len(rep_gap), 3) if rep_gap else None,
            "p95_ttft_ratio_median": round(sorted(ratios)[len(ratios) // 2], 3) if ratios else None,
            "attainment_real": a_real,
            "attainment_sim": a_sim,
            "attainment_points": None if a_sim is None or a_real is None else round(100 * (a_sim - a_real), 2),
        },
        "sim_metrics": {k: v for k, v in sim_metrics.items() if isinstance(v, (int, float, str))},
    }


def render(out: Mapping[str, Any], source: str) -> str:
    lines = [
        f"`governor bench sim-vs-real --report {source}`",
        "",
        "| window end, s | replicas real | sim | P95 TTFT real, ms | sim | attainment real | sim |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def f(v: Any, pct: bool = False) -> str:
        if v is None:
            return "-"
        return f"{100 * v:.1f}%" if pct else f"{v:g}"

    for a, b in zip(out["real"], out["sim"], strict=True):
        lines.append(
            f"| {a['t_s']:g} | {a['replicas']} | {b['replicas']} | {f(a['p95_ttft_ms'])} | {f(b['p95_ttft_ms'])} "
            f"| {f(a['attainment'], True)} | {f(b['attainment'], True)} |"
        )
    g = out["gap"]
    lines += [
        "",
        f"gap: ready replicas |sim - real| mean {g['replicas_mean_abs']}; P95 TTFT sim/real median "
        f"{g['p95_ttft_ratio_median']}; attainment real {f(g['attainment_real'], True)}, "
        f"sim {f(g['attainment_sim'], True)} ({g['attainment_points']} points)",
    ]
    return "\n".join(lines)


HELP = "the simulator against the real engines of a --platform local demo, on its arrival schedule"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("sim-vs-real", help=HELP)
    p.add_argument("--report", default="runs/demo-local/report.json", help="a `governor demo --platform local` report")
    p.add_argument("--json", default="", help="also write the comparison here")


def run_sim_vs_real(a: argparse.Namespace) -> int:
    path = Path(a.report)
    try:
        report = json.loads(path.read_text())
        requests = json.loads((path.parent / "requests.json").read_text()).get("results")
    except (OSError, ValueError) as exc:
        print(f"governor bench sim-vs-real: {exc} (run `governor demo --platform local` first)", file=sys.stderr)
        return 2
    if not isinstance(report, dict) or report.get("platform") != "local" or not isinstance(requests, list):
        print(f"governor bench sim-vs-real: {path} is not a --platform local report", file=sys.stderr)
        return 2
    try:
        out = compare(report, requests)
    except (KeyError, TypeError, ValueError) as exc:
        print(f"governor bench sim-vs-real: {path}: unusable report ({exc!r})", file=sys.stderr)
        return 2
    print(render(out, str(path)))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2, default=str))
    return 0
