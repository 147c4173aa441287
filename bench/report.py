"""The run report: ground truth from the fleet, what the loop did, a PNG."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def attainment(finished: Sequence[Mapping[str, Any]], ttft_slo_ms: float, itl_slo_ms: float) -> float:
    if not finished:
        return float("nan")
    ok = sum(
        1
        for r in finished
        if r.get("status") == "ok" and r["ttft_ms"] <= ttft_slo_ms and r.get("itl_ms", 0.0) <= itl_slo_ms
    )
    return ok / len(finished)


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    arr = np.asarray(values, dtype=float)
    p50, p95, p99 = np.percentile(arr, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99)}


def build_report(
    *,
    finished: Sequence[Mapping[str, Any]],
    replicas: Sequence[tuple[float, str, str, int, int, int]],
    results: Sequence[Mapping[str, Any]],
    windows: Sequence[Mapping[str, Any]],
    dead_letters: Sequence[Mapping[str, Any]],
    ttft_slo_ms: float,
    itl_slo_ms: float,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    # executors' RTT/offset probes and relayed relocation outcomes are not command results
    relocations = [r for r in results if r.get("record") == "relocation_outcome"]
    results = [r for r in results if r.get("outcome") != "timing" and r.get("record") != "relocation_outcome"]
    outcomes = Counter(r.get("outcome") for r in results)
    latencies = [r["latency_ms"] for r in results if r.get("outcome") == "applied" and "latency_ms" in r]
    zone_windows = [w for w in windows if w.get("scope") == "zone"]
    replica_series: dict[str, list[tuple[float, int, int, int]]] = {}
    for t, zone, _model, ready, starting, desired in replicas:
        replica_series.setdefault(zone, []).append((t, ready, starting, desired))
    return {
        "requests_finished": len(finished),
        "slo": {"ttft_slo_ms": ttft_slo_ms, "itl_slo_ms": itl_slo_ms},
        "slo_attainment": attainment(finished, ttft_slo_ms, itl_slo_ms),
        "e2e_ms": percentiles([r["e2e_ms"] for r in finished]),
        "ttft_ms": percentiles([r["ttft_ms"] for r in finished]),
        "replicas": {
            z: {"start": s[0][1] + s[0][2], "max": max(x[1] + x[2] for x in s), "end": s[-1][1] + s[-1][2]}
            for z, s in replica_series.items()
        },
        "commands": {
            "outcomes": dict(outcomes),
            "applied": outcomes.get("applied", 0),
            "issue_to_apply_ms": percentiles(latencies),
        },
        "relocations": {
            "applied": sum(bool(r.get("applied")) for r in relocations),
            "refused": sum(not r.get("applied") for r in relocations),
        },
        "pipeline": {
            "zone_windows": len(zone_windows),
            "requests_in_windows": int(sum(w.get("count", 0) for w in zone_windows)),
        },
        "dead_letters": {
            "count": len(dead_letters),
            "reasons": dict(Counter(d["reason"].split(":")[0] for d in dead_letters)),
        },
        **extra,
    }


def render_text(rep: Mapping[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f} ms"

    lines = [
        "governor demo report",
        "====================",
        f"requests finished     {rep['requests_finished']:,}",
        f"SLO                   TTFT <= {rep['slo']['ttft_slo_ms']:.0f} ms and ITL <= {rep['slo']['itl_slo_ms']:.0f} ms",
        f"SLO attainment        {100 * rep['slo_attainment']:.2f} %",
        f"end-to-end latency    P50 {ms(rep['e2e_ms']['p50'])}  P95 {ms(rep['e2e_ms']['p95'])}  P99 {ms(rep['e2e_ms']['p99'])}",
        f"time to first token   P50 {ms(rep['ttft_ms']['p50'])}  P95 {ms(rep['ttft_ms']['p95'])}  P99 {ms(rep['ttft_ms']['p99'])}",
    ]
    for zone, r in sorted(rep["replicas"].items()):
        lines.append(f"replicas {zone:<12} start {r['start']}  max {r['max']}  end {r['end']}")
    c = rep["commands"]
    lines.append(
        f"commands              {sum(c['outcomes'].values())} results: "
        + ", ".join(f"{k} {v}" for k, v in sorted(c["outcomes"].items()))
    )
    lines.append(
        f"commands applied      {c['applied']}  (issue -> apply P50 {ms(c['issue_to_apply_ms']['p50'])}, "
        f"P99 {ms(c['issue_to_apply_ms']['p99'])}, trace time)"
    )
    if sum(rep.get("relocations", {}).values()):
        lines.append(
            f"KV relocations        applied {rep['relocations']['applied']}, refused {rep['relocations']['refused']}"
        )
    p = rep["pipeline"]
    lines.append(
        f"pipeline windows      {p['zone_windows']} zone windows holding {p['requests_in_windows']:,} requests"
    )
    d = rep["dead_letters"]
    lines.append(f"dead letters          {d['count']} " + (str(d["reasons"]) if d["reasons"] else ""))
    for key in ("injected_bad_records", "telemetry_records_sent", "wall_s", "speed", "plot"):
        if key in rep:
            lines.append(f"{key.replace('_', ' '):<21} {rep[key]}")
    return "\n".join(lines)


def latency_panel(ax: Any, finished: Sequence[Mapping[str, Any]], t0_ms: int, ttft_slo_ms: float, title: str) -> None:
    """TTFT P95 per 10 s of completion time against the SLO, log scale."""
    if finished:
        t = np.array([(r["ts_ms"] - t0_ms) / 1000 for r in finished])
        ttft = np.array([r["ttft_ms"] for r in finished])
        edges = np.arange(0, t.max() + 10, 10)
        idx = np.digitize(t, edges)
        p95 = [(edges[i - 1] + 5, np.percentile(ttft[idx == i], 95)) for i in np.unique(idx) if (idx == i).sum() > 5]
        if p95:
            ax.plot(*zip(*p95, strict=True), color="tab:red", label="TTFT P95 (10 s)")
    ax.axhline(ttft_slo_ms, color="k", ls="--", lw=1, label="TTFT SLO")
    ax.set_yscale("log")
    ax.set_ylabel("ms")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(title)


def replicas_panel(
    ax: Any,
    series: Mapping[str, tuple[Sequence[float] | np.ndarray, Sequence[int] | np.ndarray, Sequence[int] | np.ndarray]],
) -> None:
    """Ready (solid) and desired (dashed) replicas per zone: zone -> (t, ready, desired)."""
    for zone, (ts, ready, desired) in sorted(series.items()):
        ax.step(ts, ready, where="post", label=f"{zone} ready")
        ax.step(ts, desired, where="post", ls="--", label=f"{zone} desired")
    ax.set_ylabel("replicas")
    ax.set_xlabel("trace time (s)")
    ax.legend(loc="upper left", fontsize=8)


def save(fig: Any, path: Path, dpi: int) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def plot(
    path: Path,
    finished: Sequence[Mapping[str, Any]],
    replicas: Sequence[tuple[float, str, str, int, int, int]],
    windows: Sequence[Mapping[str, Any]],
    t0_ms: int,
    ttft_slo_ms: float,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    if finished:
        t = np.array([(r["ts_ms"] - t0_ms) / 1000 for r in finished])
        ttft = np.array([r["ttft_ms"] for r in finished])
        ax1.scatter(t, ttft, s=2, alpha=0.25, color="tab:blue", label="TTFT per request")
    latency_panel(ax1, finished, t0_ms, ttft_slo_ms, "latency (ground truth from the fleet)")
    series = {}
    for zone in sorted({z for _, z, *_ in replicas}):
        rows = [(t, ready, desired) for t, z, _m, ready, _starting, desired in replicas if z == zone]
        if rows:
            ts, ready, desired = zip(*rows, strict=True)
            series[zone] = (ts, ready, desired)
    replicas_panel(ax2, series)
    return save(fig, path, 110)
