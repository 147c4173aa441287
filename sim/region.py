"""Feasible region (docs/model.md (region), design source §2.4): operating points that meet the SLO, and their hull.

The design source samples feasible points of (CPU %, memory %, bandwidth,
time window), takes their convex hull and reports its volume as the region's
coverage.  CPU and bandwidth are not in governor's telemetry; the axes here
are ones it measures:

- ``replicas``: ready replicas per zone (the GPU records);
- ``rate_rps``: arrival rate over the fleet (request records per second);
- ``prompt_tokens``: mean prompt length (request records);
- ``output_tokens``: mean output length (request records).

KV usage is not an axis: it is an outcome of the other four (each request
holds ``(prompt + output) x kv_bytes_per_token`` while it runs), so it cannot
be set independently of them; the two token axes span the KV demand.

Sampling: the full grid of :class:`RegionConfig`'s axis values (the set
points: the hull is taken over them; what each run actually sent, the
window's rate and mean lengths, is kept beside them as ``measured``).  Each point
replays ``duration_s`` seconds of a trace (default ``azure-conv``, the demo's)
at ``rate_rps`` with its prompt and output lengths scaled to the point's
means, through the fast simulator (:func:`sim.fastloop.run`) with a static
fleet of ``replicas`` per zone (seeded: the same point gives the same run).
A point is *feasible* when its violation rate (requests that failed, missed
the TTFT or ITL SLO, or did not finish, over the requests sent) is at most
``eps_ref``.

Coverage: every axis is mapped to [0, 1] over the sampled box, so the
convex hull's volume (scipy's Qhull) is the share of the box it covers.  The
feasible set need not be convex (replicas are discrete; latency is not
linear in load), so the hull can over-estimate it: ``hull_overestimate`` is
the share of the sampled points inside the hull that are infeasible.  The
2-D projections are the hulls of the feasible points projected on each pair
of axes (the projection of the 4-D hull) with their areas.

Examples
--------
>>> import numpy as np
>>> sq = np.array([[0, 0], [1, 0], [0, 1], [1, 1], [0.5, 0.5]])
>>> hull_volume(sq)
1.0
>>> inside_hull(sq[:4], np.array([[0.5, 0.5], [2.0, 0.0]])).tolist()
[True, False]
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.spatial import ConvexHull, QhullError

from core.defaults import EPS_REF, ITL_SLO_MS, TTFT_SLO_MS
from sim.fastloop import LoopConfig
from sim.fastloop import run as run_loop
from sim.traces import Trace, load_trace
from sim.workloads import Workload, from_trace

__all__ = [
    "AXES",
    "RegionConfig",
    "RegionError",
    "RegionResult",
    "analyse",
    "hull_volume",
    "inside_hull",
    "locate",
    "run_point",
    "sample",
]

AXES = ("replicas", "rate_rps", "prompt_tokens", "output_tokens")
MAX_POINTS = 5000  # the grid's size is bounded: each point is one simulator run
MAX_REPLICAS = 256  # per zone: the fast loop's replica bound


class RegionError(ValueError):
    """A region parameter is unusable; the message names it."""


def hull_volume(points: np.ndarray) -> float:
    """Volume (area in 2-D) of the convex hull of ``points``; 0 when they are too few or flat."""
    pts = np.asarray(points, dtype=float)
    if pts.ndim != 2 or len(pts) <= pts.shape[1]:
        return 0.0
    try:
        return float(ConvexHull(pts).volume)
    except QhullError:  # flat (lower-dimensional): no volume
        return 0.0


def inside_hull(hull_points: np.ndarray, queries: np.ndarray, tol: float = 1e-9) -> np.ndarray:
    """Whether each query lies in the convex hull of ``hull_points`` (boundary included).

    A flat or too small hull holds nothing but its own points.
    """
    pts, q = np.asarray(hull_points, dtype=float), np.asarray(queries, dtype=float)
    if len(pts) > pts.shape[1]:
        try:
            eq = ConvexHull(pts).equations  # rows (normal, offset): inside when normal . x + offset <= 0
            return np.asarray(np.all(q @ eq[:, :-1].T + eq[:, -1] <= tol, axis=1))
        except QhullError:
            pass
    return np.array([bool(np.any(np.all(np.abs(pts - x) <= tol, axis=1))) for x in q], dtype=bool)


def analyse(points: np.ndarray, feasible: np.ndarray) -> dict[str, Any]:
    """Coverage, hull over-estimate and 2-D projections of sampled ``points`` (rows) with a ``feasible`` mask.

    Axes are normalised to [0, 1] over the sampled box (an axis with one value stays 0).

    >>> pts = np.array([[x, y] for x in range(3) for y in range(3)], dtype=float)
    >>> out = analyse(pts, (pts[:, 0] == 0) | (pts[:, 1] == 0))  # an L: not convex
    >>> out["coverage"], out["inside_hull"], round(out["hull_overestimate"], 4)
    (0.5, 6, 0.1667)
    """
    pts = np.asarray(points, dtype=float)
    ok = np.asarray(feasible, dtype=bool)
    if pts.ndim != 2 or len(pts) != len(ok) or len(pts) == 0:
        raise RegionError("points must be a non-empty 2-D array with one feasible flag per row")
    lo, span = pts.min(axis=0), np.ptp(pts, axis=0)
    unit = np.where(span > 0, (pts - lo) / np.where(span > 0, span, 1.0), 0.0)
    live = span > 0  # axes that vary: the hull lives in their space
    feas = unit[ok][:, live]
    inside = inside_hull(feas, unit[:, live]) if len(feas) else np.zeros(len(pts), dtype=bool)
    n_in = int(inside.sum())
    proj = {}
    d = pts.shape[1]
    for i, j in itertools.combinations(range(d), 2):
        proj[f"{i},{j}"] = hull_volume(unit[ok][:, [i, j]]) if span[i] > 0 and span[j] > 0 else 0.0
    return {
        "points": len(pts),
        "feasible": int(ok.sum()),
        "coverage": hull_volume(feas) if len(feas) else 0.0,
        "inside_hull": n_in,
        "hull_overestimate": float((inside & ~ok).sum() / n_in) if n_in else 0.0,
        "projections": proj,
    }


@dataclass(frozen=True)
class RegionConfig:
    """The sampled grid and the run of each point (see the module docstring).

    ``prompt_scale`` / ``output_scale`` multiply the trace's token lengths;
    the reported axis values are the means actually sent.
    """

    replicas: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    rate_rps: tuple[float, ...] = (2.0, 4.0, 8.0, 12.0, 16.0, 24.0)
    prompt_scale: tuple[float, ...] = (0.5, 1.0, 2.0)
    output_scale: tuple[float, ...] = (0.5, 1.0, 2.0)
    duration_s: float = 120.0
    trace: str = "azure-conv"
    window_start_s: float = 600.0  # the trace from here (azure-conv: its first minutes run at half its mean rate)
    seed: int = 0
    model: str = "llama2-70b"
    zones: tuple[str, ...] = ("az-a", "az-b")
    ttft_slo_ms: float = TTFT_SLO_MS
    itl_slo_ms: float = ITL_SLO_MS
    eps_ref: float = EPS_REF

    def __post_init__(self) -> None:
        axes = {
            "replicas": self.replicas,
            "rate_rps": self.rate_rps,
            "prompt_scale": self.prompt_scale,
            "output_scale": self.output_scale,
        }
        for name, values in axes.items():
            if not values:
                raise RegionError(f"{name}: need at least one value")
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v) or v <= 0:
                    raise RegionError(f"{name}={v!r}: every value must be a finite number > 0")
        if any(not isinstance(r, int) or r > MAX_REPLICAS for r in self.replicas):
            raise RegionError(f"replicas={self.replicas!r}: must be integers <= {MAX_REPLICAS}")
        n = len(self.replicas) * len(self.rate_rps) * len(self.prompt_scale) * len(self.output_scale)
        if n > MAX_POINTS:
            raise RegionError(f"the grid has {n} points: more than {MAX_POINTS}")
        if not 0 < self.duration_s <= 3600:
            raise RegionError(f"duration_s={self.duration_s}: must lie in (0, 3600]")
        if not 0 <= self.window_start_s < 1e6:
            raise RegionError(f"window_start_s={self.window_start_s}: must lie in [0, 1e6)")
        if not 0 < self.eps_ref < 1:
            raise RegionError(f"eps_ref={self.eps_ref}: must lie in (0, 1)")
        if not self.zones:
            raise RegionError("zones: need at least one")

    @property
    def size(self) -> int:
        return len(self.replicas) * len(self.rate_rps) * len(self.prompt_scale) * len(self.output_scale)


@dataclass
class RegionResult:
    config: RegionConfig
    points: np.ndarray  # rows: the set point (replicas, rate_rps, mean prompt tokens, mean output tokens)
    measured: np.ndarray  # rows: what the run sent (rate and means of the replayed window)
    violation_rate: np.ndarray
    feasible: np.ndarray
    analysis: dict[str, Any]
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "axes": list(AXES),
            "eps_ref": self.config.eps_ref,
            "trace": self.config.trace,
            "duration_s": self.config.duration_s,
            "wall_s": round(self.wall_s, 2),
            **self.analysis,
            "samples": [
                {
                    "point": [round(float(x), 2) for x in p],
                    "measured": [round(float(x), 2) for x in m],
                    "violation_rate": round(float(v), 4),
                    "feasible": bool(f),
                }
                for p, m, v, f in zip(self.points, self.measured, self.violation_rate, self.feasible, strict=True)
            ],
        }


def _scaled(wl: Workload, prompt: float, output: float) -> Workload:
    p = np.maximum(1, np.rint(wl.prompt_tokens * prompt)).astype(np.int64)
    o = np.maximum(1, np.rint(wl.output_tokens * output)).astype(np.int64)
    return Workload(wl.arrival_s, p, o, None, f"{wl.name} x{prompt:g}/{output:g}")


def violation_rate(finished: Sequence[dict[str, Any]], submitted: int, ttft_slo_ms: float, itl_slo_ms: float) -> float:
    """Requests not ``ok`` within both SLOs (unfinished ones included) over the requests sent."""
    if submitted <= 0:
        return 0.0
    good = sum(
        1
        for r in finished
        if r.get("status", "ok") == "ok" and r["ttft_ms"] <= ttft_slo_ms and r.get("itl_ms", 0.0) <= itl_slo_ms
    )
    return 1.0 - good / submitted


def window_trace(cfg: RegionConfig) -> Trace:
    """The trace from ``cfg.window_start_s`` on (the whole trace when it is shorter)."""
    full = load_trace(cfg.trace)
    start = cfg.window_start_s if cfg.window_start_s < full.duration_s else 0.0
    return full.window(start, full.duration_s - start)


def run_point(
    cfg: RegionConfig, trace: Trace, replicas: int, rate_rps: float, prompt_scale: float, output_scale: float
) -> tuple[list[float], float]:
    """One operating point through the fast simulator: its measured axis values and violation rate."""
    from sim.baselines.static import StaticParams, StaticReplicas

    wl = _scaled(from_trace(trace, float(rate_rps), cfg.duration_s), prompt_scale, output_scale)
    loop = LoopConfig.of(
        model=cfg.model,
        zones=cfg.zones,
        initial_replicas=replicas,
        min_replicas=1,
        max_replicas=replicas,
        ttft_slo_ms=cfg.ttft_slo_ms,
        itl_slo_ms=cfg.itl_slo_ms,
        eps_ref=cfg.eps_ref,
        seed=cfg.seed,
    )
    res = run_loop(lambda z: StaticReplicas(StaticParams(replicas=replicas)), wl, loop, duration_s=cfg.duration_s)
    sent = len(wl)
    row = [
        float(replicas),
        sent / cfg.duration_s,
        float(wl.prompt_tokens.mean()) if sent else 0.0,
        float(wl.output_tokens.mean()) if sent else 0.0,
    ]
    return row, violation_rate(res.finished, sent, cfg.ttft_slo_ms, cfg.itl_slo_ms)


def sample(cfg: RegionConfig) -> RegionResult:
    """Run every grid point through the fast simulator and analyse the feasible ones."""
    t0 = time.perf_counter()
    trace = window_trace(cfg)
    mean_prompt, mean_output = float(np.mean(trace.prompt_tokens)), float(np.mean(trace.output_tokens))
    rows, measured, viol = [], [], []
    for rate, ps, os_, n in itertools.product(cfg.rate_rps, cfg.prompt_scale, cfg.output_scale, cfg.replicas):
        row, v = run_point(cfg, trace, n, rate, ps, os_)
        rows.append([float(n), float(rate), mean_prompt * ps, mean_output * os_])
        measured.append(row)
        viol.append(v)
    points = np.array(rows, dtype=float)
    v_arr = np.array(viol, dtype=float)
    ok = v_arr <= cfg.eps_ref
    return RegionResult(
        cfg, points, np.array(measured, dtype=float), v_arr, ok, analyse(points, ok), time.perf_counter() - t0
    )


def locate(result: RegionResult, point: Sequence[float]) -> bool:
    """Whether ``point`` (axis units) lies in the hull of ``result``'s feasible points (same normalisation)."""
    pts = result.points
    lo, span = pts.min(axis=0), np.ptp(pts, axis=0)
    live = span > 0
    unit = (np.asarray(point, dtype=float) - lo)[live] / span[live]
    feas = ((pts[result.feasible] - lo)[:, live]) / span[live]
    return bool(len(feas) and inside_hull(feas, unit[None, :])[0])
