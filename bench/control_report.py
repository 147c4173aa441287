"""The tables of ``governor bench control``: the terminal table, the markdown block
docs/benchmarks.md shows (its command line, the run's profile and physical limits) and
the columns both print."""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping, Sequence
from typing import Any

from bench.gains import gain_flags
from core.defaults import EPS_REF
from sim.fastloop import RunResult

COLUMNS = (
    ("slo_attainment", "SLO att.", "{:.2%}"),
    ("ceiling", "ceiling", "{:.2%}"),
    ("attainment_over_ceiling", "att./ceil.", "{:.2%}"),
    ("e2e_p50_ms", "e2e P50", "{:,.0f}"),
    ("e2e_p95_ms", "e2e P95", "{:,.0f}"),
    ("e2e_p99_ms", "e2e P99", "{:,.0f}"),
    ("ttft_p95_ms", "TTFT P95", "{:,.0f}"),
    ("gpu_seconds", "GPU-s", "{:,.0f}"),
    ("waste", "waste", "{:.1%}"),
    ("scale_actions", "actions", "{}"),
    ("reversals", "reversals", "{}"),
)


def table(results: Sequence[RunResult]) -> str:
    head = f"{'strategy':<18}" + "".join(f"{h:>11}" for _, h, _ in COLUMNS)
    lines = [head, "-" * len(head)]
    for r in results:
        cells = []
        for key, _, fmt in COLUMNS:
            v = r.metrics.get(key)
            cells.append(f"{'-' if v is None else fmt.format(v):>11}")
        lines.append(f"{r.strategy:<18}" + "".join(cells))
    return "\n".join(lines)


def limits_line(meta: Mapping[str, Any]) -> str:
    """The summary line of the physical limits (ceiling, lower bound, start fleet, oracle headroom)."""
    start = (
        f"every strategy starts at {meta['initial_replicas_per_zone']} per zone (warm start)"
        if meta.get("warm_start", True)
        else f"reactive strategies start at {meta['initial_replicas_per_zone']} per zone (--no-warm-start)"
    )
    oracle = f"; oracle headroom {meta['oracle_headroom']:.2f}" if "oracle_headroom" in meta else ""
    return (
        f"Ceiling (unbounded fleet) {meta['ceiling']:.2%} ({meta['ceiling_prefix_cache']:.2%} with every "
        f"shareable prefix cached); lower bound {meta['lower_bound_gpu_seconds']:,.0f} GPU-s; {start}{oracle}."
    )


def markdown(results: Sequence[RunResult], meta: Mapping[str, Any], args: Namespace) -> str:
    cmd = (
        f"governor bench control --trace {meta['trace']} --scenario {meta['scenario']} "
        f"--qps {meta['qps']:g} --duration-s {meta['duration_s']:g} --seed {meta['seed']}"
        + (f" --eps-ref {meta['eps_ref']:g}" if meta.get("eps_ref", EPS_REF) != EPS_REF else "")
        + (f" --zones {len(meta['zones'])}" if len(meta.get("zones", ())) not in (0, 2) else "")
        + (f" --balancer {meta['balancer']}" if meta.get("balancer", "uniform") != "uniform" else "")
        + (" --no-warm-start" if not meta.get("warm_start", True) else "")
        + (f" --capacity-error {meta['capacity_error']:g}" if meta.get("capacity_error", 1.0) != 1.0 else "")
        + gain_flags(meta.get("gains", {}))
    )
    lines = [
        f"### {meta['trace']} / {meta['scenario']}",
        "",
        f"`{cmd}` -- {meta['requests']:,} requests; SLO TTFT <= {meta['ttft_slo_ms']:.0f} ms and "
        f"ITL <= {meta['itl_slo_ms']:.0f} ms; profiled capacity {meta['replica_capacity_rps']} req/s "
        f"per replica, headroom {meta['replica_headroom']}; static = {meta['static_replicas_per_zone']} per zone. "
        f"{limits_line(meta)}",
        "",
        "| strategy | " + " | ".join(h for _, h, _ in COLUMNS) + " |",
        "|---|" + "---:|" * len(COLUMNS),
    ]
    for r in results:
        cells = []
        for key, _, fmt in COLUMNS:
            v = r.metrics.get(key)
            cells.append("-" if v is None else fmt.format(v))
        lines.append(f"| {r.strategy} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
