"""``governor bench scrape``: what scraping vLLM ``/metrics`` costs against per-request truth.

The demo's load step (same trace, rate, step and seed as ``governor demo``) runs
through the fast simulator (:class:`sim.fleet.Fleet`, no servers, no clock).  The
fleet follows a fixed desired-replica schedule like the one the closed loop
produces (``--replicas`` per zone, ``--scale-to`` from ``--scale-at-s``; new
replicas start ``--startup-s`` later with counters from zero), so the scrape path
sees what it sees in the demo: a load step, queues, replicas coming up.

Every finished request is the truth.  Each replica keeps vLLM's cumulative
series (:mod:`sim.engine_metrics`), rendered as exposition text every ``S``
seconds (``--intervals``, first scrape at ``--phase-s``: real scrapes are not
aligned with windows) and fed to the same :class:`adapters.scrape.runner.Scraper`
as ``governor ingest scrape`` (parse -> deltas -> ``window_records``), once with
the ``upper`` and once with the ``lower`` violation pairing.  A replica's first
scrape is its baseline (Prometheus ``rate()`` semantics), so what a replica
finished before it is never seen: ``missed`` counts those requests.

Per (zone, ``window_s`` window) with at least ``--min-requests`` true requests:
P95 TTFT (numpy, linear) and violation rate (failed, or TTFT/ITL over the SLO) of
the scraped records vs the truth; the table gives the median and P90 of the
absolute errors (ms, percentage points) and the share of windows that got no
scraped request (those have no scraped estimate and are left out of the errors).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import numpy as np

from adapters.scrape.runner import Endpoint, Scraper
from core.settings import Settings
from sim.engine_metrics import FleetMetrics
from sim.fleet import Fleet, FleetConfig
from sim.perf_model import PerfModel
from sim.traces import load_trace
from sim.workloads import step_load

__all__ = ["add_parser", "measure", "run_scrape_bench"]

EPOCH_MS = 1_700_000_000_000  # trace time 0, as epoch ms (records look like real ones)
COMBINES = ("upper", "lower")


def _violates(r: Mapping[str, Any], ttft_slo_ms: float, itl_slo_ms: float) -> bool:
    return bool(r.get("status") != "ok" or r["ttft_ms"] > ttft_slo_ms or float(r.get("itl_ms", 0.0)) > itl_slo_ms)


def _by_window(
    records: Sequence[Mapping[str, Any]], window_ms: int, ttft_slo_ms: float, itl_slo_ms: float
) -> dict[tuple[str, int], tuple[int, float, float]]:
    """(zone, window start ms) -> (requests, P95 TTFT ms, violation rate)."""
    ttft: dict[tuple[str, int], list[float]] = defaultdict(list)
    viol: dict[tuple[str, int], int] = defaultdict(int)
    for r in records:
        key = (str(r["zone"]), int(r["ts_ms"]) - int(r["ts_ms"]) % window_ms)
        ttft[key].append(float(r["ttft_ms"]))
        viol[key] += _violates(r, ttft_slo_ms, itl_slo_ms)
    return {k: (len(v), float(np.percentile(v, 95)), viol[k] / len(v)) for k, v in ttft.items()}


def _stats(errors: Sequence[float]) -> dict[str, float | None]:
    if not errors:
        return {"median": None, "p90": None}
    return {"median": float(np.median(errors)), "p90": float(np.percentile(errors, 90))}


def measure(
    settings: Settings,
    *,
    trace: str = "azure-conv",
    qps: float = 16.0,
    duration_s: float = 600.0,
    step_at_s: float = 200.0,
    step_factor: float = 2.5,
    replicas: int = 4,
    scale_to: int = 10,
    scale_at_s: float = 230.0,
    startup_s: float = 30.0,
    seed: int = 7,
    intervals_s: Sequence[float] = (5.0, 15.0),
    phase_s: float = 2.5,
    min_requests: int = 5,
    dt_s: float = 0.5,
) -> dict[str, Any]:
    """Run the scenario once; the errors of each (interval, combine) against the truth."""
    spec = settings.models[0]
    zones = tuple(settings.zones)
    fleet = Fleet(
        FleetConfig(
            models={spec.name: PerfModel.from_splitwise(model=spec.name)},
            zones=zones,
            startup_s=startup_s,
            seed=seed,
            initial_replicas=replicas,
        ),
        epoch_ms0=EPOCH_MS,
    )
    wl = step_load(load_trace(trace), qps, duration_s, step_at_s, step_factor)
    zone_of = np.random.default_rng(seed).integers(0, len(zones), len(wl.arrival_s))
    registry = FleetMetrics(spec.name)
    scrapers = {(s, c): Scraper(settings, [], "vllm", combine=c) for s in intervals_s for c in COMBINES}
    scraped: dict[tuple[float, str], list[dict[str, Any]]] = {k: [] for k in scrapers}
    next_scrape = dict.fromkeys(intervals_s, phase_s)
    last_scrape_ms = dict.fromkeys(intervals_s, EPOCH_MS)
    truth: list[dict[str, Any]] = []
    scaled, nxt = False, 0
    steps = int(round(duration_s / dt_s))
    for k in range(steps + 1):
        t = k * dt_s
        if not scaled and scale_to > 0 and t >= scale_at_s:
            for z in zones:
                fleet.set_desired(z, spec.name, scale_to, t)
            scaled = True
        while nxt < len(wl.arrival_s) and wl.arrival_s[nxt] <= t:
            fleet.submit(
                float(wl.arrival_s[nxt]),
                zones[int(zone_of[nxt])],
                spec.name,
                int(wl.prompt_tokens[nxt]),
                int(wl.output_tokens[nxt]),
                f"req-{nxt}",
            )
            nxt += 1
        done = fleet.advance_to(t)
        truth.extend(done)
        registry.observe_all(done)
        if k % max(1, int(round(1.0 / dt_s))) == 0:
            registry.update(fleet.gpu_snapshot(t))
        now_ms = EPOCH_MS + int(round(t * 1000))
        for s in intervals_s:
            if t + 1e-9 < next_scrape[s]:
                continue
            next_scrape[s] += s
            last_scrape_ms[s] = now_ms
            endpoints = [Endpoint(f"http://sim/{quote(n, safe='')}/metrics", z) for n, z in registry.targets().items()]
            texts: dict[str, str | BaseException] = {
                ep.url: registry.render(n) for ep, n in zip(endpoints, registry.targets(), strict=True)
            }
            for c in COMBINES:
                sc = scrapers[(s, c)]
                sc.set_endpoints(endpoints)  # discovery: the replicas serving now
                scraped[(s, c)].extend(r for r in sc.step(texts, now_ms) if r["kind"] == "request")
    window_ms = int(settings.window_s * 1000)
    slo = (spec.ttft_slo_ms, spec.itl_slo_ms)
    rows: list[dict[str, Any]] = []
    for (s, c), recs in scraped.items():
        # Windows the scrapes have fully covered: they end before the last scrape.
        horizon = last_scrape_ms[s] - window_ms
        true_w = {
            k: v for k, v in _by_window(truth, window_ms, *slo).items() if v[0] >= min_requests and k[1] <= horizon
        }
        got_w = _by_window(recs, window_ms, *slo)
        p95_err, p95_rel, viol_err, viol_hot, empty = [], [], [], [], 0
        for key, (_, p95, viol) in true_w.items():
            if key not in got_w:
                empty += 1
                continue
            p95_err.append(abs(got_w[key][1] - p95))
            p95_rel.append(100.0 * abs(got_w[key][1] - p95) / p95 if p95 > 0 else 0.0)
            viol_err.append(100.0 * abs(got_w[key][2] - viol))
            if viol > 0:
                viol_hot.append(viol_err[-1])
        covered = [r for r in truth if int(r["ts_ms"]) <= last_scrape_ms[s]]
        rows.append(
            {
                "interval_s": s,
                "combine": c,
                "windows": len(true_w),
                "empty_share": empty / len(true_w) if true_w else 0.0,
                "p95_ttft_abs_err_ms": _stats(p95_err),
                "p95_ttft_rel_err_pct": _stats(p95_rel),
                "violation_abs_err_pp": _stats(viol_err),
                "violating_windows": len(viol_hot),
                "violation_abs_err_pp_violating": _stats(viol_hot),
                "requests_true": len(covered),
                "requests_scraped": len(recs),
            }
        )
    true_all = _by_window(truth, window_ms, *slo)
    return {
        "scenario": {
            "trace": trace,
            "qps": qps,
            "duration_s": duration_s,
            "step": {"at_s": step_at_s, "factor": step_factor},
            "replicas": replicas,
            "scale_to": scale_to,
            "scale_at_s": scale_at_s,
            "startup_s": startup_s,
            "seed": seed,
            "window_s": settings.window_s,
            "phase_s": phase_s,
            "ttft_slo_ms": spec.ttft_slo_ms,
            "itl_slo_ms": spec.itl_slo_ms,
        },
        "truth": {
            "requests": len(truth),
            "p95_ttft_ms_median_window": float(np.median([v[1] for v in true_all.values()])) if true_all else None,
            "violation_rate_median_window": float(np.median([v[2] for v in true_all.values()])) if true_all else None,
        },
        "rows": rows,
    }


def render(result: Mapping[str, Any]) -> str:
    sc, tr = result["scenario"], result["truth"]

    def f(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [
        f"scrape vs truth: {sc['trace']} {sc['qps']:g} req/s x{sc['step']['factor']:g} at {sc['step']['at_s']:g} s, "
        f"{sc['duration_s']:g} s, replicas {sc['replicas']} -> {sc['scale_to']} at {sc['scale_at_s']:g} s, "
        f"{sc['window_s']:g} s windows, seed {sc['seed']}",
        f"truth: {tr['requests']:,} requests; per (zone, window) median P95 TTFT "
        f"{f(tr['p95_ttft_ms_median_window'], ',.0f')} ms, median violation rate "
        f"{f(100 * tr['violation_rate_median_window'] if tr['violation_rate_median_window'] is not None else None, '.1f')} %",
        "",
        "interval  combine  missed  windows  no-scrape  P95 TTFT |err| ms (median / P90)  (relative %)  "
        "violations |err| pp (median / P90)  in windows with violations (n: median / P90)",
    ]
    for r in result["rows"]:
        p, q, v = r["p95_ttft_abs_err_ms"], r["p95_ttft_rel_err_pct"], r["violation_abs_err_pp"]
        h = r["violation_abs_err_pp_violating"]
        lines.append(
            f"{r['interval_s']:>6g} s  {r['combine']:<7}  {r['requests_true'] - r['requests_scraped']:>6}  {r['windows']:>7}  {100 * r['empty_share']:>8.1f}%  "
            f"{f(p['median'], '>14,.0f')} / {f(p['p90'], '<14,.0f')}  "
            f"({f(q['median'], '.0f')} / {f(q['p90'], '.0f')})  "
            f"{f(v['median'], '>16.2f')} / {f(v['p90'], '<6.2f')}  "
            f"{r['violating_windows']:>14}: {f(h['median'], '.2f')} / {f(h['p90'], '.2f')}"
        )
    return "\n".join(lines)


def add_parser(bsub: Any) -> None:
    p = bsub.add_parser("scrape", help="scrape-derived P95 TTFT / violation rate vs per-request truth (no servers)")
    p.add_argument("--trace", default="azure-conv")
    p.add_argument("--qps", type=float, default=16.0)
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--step-at-s", type=float, default=200.0)
    p.add_argument("--step-factor", type=float, default=2.5)
    p.add_argument("--replicas", type=int, default=4, help="initial replicas per zone")
    p.add_argument("--scale-to", type=int, default=10, help="replicas per zone the schedule scales to (0 = never)")
    p.add_argument("--scale-at-s", type=float, default=230.0, help="trace time of the scale-up")
    p.add_argument("--startup-s", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--intervals", default="5,15", help="scrape intervals in seconds, comma-separated")
    p.add_argument("--phase-s", type=float, default=2.5, help="time of the first scrape")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_scrape_bench(args: argparse.Namespace, settings: Settings | None = None) -> int:
    logging.getLogger("adapters.scrape.runner").setLevel(logging.WARNING)  # one line per delta otherwise
    try:
        intervals = tuple(float(x) for x in str(args.intervals).split(",") if x.strip())
    except ValueError:
        intervals = ()
    if not intervals or any(s <= 0 for s in intervals):
        print(f"governor bench scrape: --intervals {args.intervals!r}: want positive seconds, e.g. 5,15")
        return 2
    result = measure(
        settings or Settings(),
        trace=args.trace,
        qps=args.qps,
        duration_s=args.duration_s,
        step_at_s=args.step_at_s,
        step_factor=args.step_factor,
        replicas=args.replicas,
        scale_to=args.scale_to,
        scale_at_s=args.scale_at_s,
        startup_s=args.startup_s,
        seed=args.seed,
        intervals_s=intervals,
        phase_s=args.phase_s,
    )
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0
