"""``governor analyze region``: the feasible operating region of the fleet (docs/model.md (region)).

Samples the grid of :class:`sim.region.RegionConfig` (replicas per zone x
arrival rate x prompt-length scale x output-length scale) through the fast
simulator with the settings' first model, zones, SLOs (``ttft_slo_ms``,
``itl_slo_ms``) and ``eps_ref``; prints the feasible count, the coverage
(convex-hull volume over the sampled box), the hull's over-estimate (share of
the sampled points inside the hull that are infeasible), the 2-D projections'
areas and the current operating point (``--current-replicas`` per zone at
``--current-rate`` with the trace's own lengths: the demo's fleet and load by
default): its violation rate and whether the hull holds it.  ``--png DIR``
draws the six 2-D projections to ``DIR/region.png``; ``--json`` prints one
object. Exit 2 on bad input.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["add_parser", "run"]

_LABELS = {
    "replicas": "replicas per zone",
    "rate_rps": "arrival rate (req/s)",
    "prompt_tokens": "mean prompt tokens",
    "output_tokens": "mean output tokens",
}


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want comma-separated numbers") from None


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want comma-separated integers") from None


def add_parser(asub: Any) -> None:
    """Register ``region`` under ``governor analyze``."""
    from sim.region import RegionConfig

    d = RegionConfig()
    p = asub.add_parser("region", help="feasible region: sampled operating points meeting the SLO, their hull")
    p.add_argument("--replicas", type=_ints, default=d.replicas, help="replicas per zone (comma-separated)")
    p.add_argument("--rates", type=_floats, default=d.rate_rps, help="arrival rates over the fleet, req/s")
    p.add_argument("--prompt-scales", type=_floats, default=d.prompt_scale, help="prompt-length multipliers")
    p.add_argument("--output-scales", type=_floats, default=d.output_scale, help="output-length multipliers")
    p.add_argument("--duration-s", type=float, default=d.duration_s, help="trace seconds per point")
    p.add_argument("--trace", default=d.trace)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--current-replicas", type=int, default=4, help="the current fleet: replicas per zone")
    p.add_argument("--current-rate", type=float, default=16.0, help="the current load, req/s (the demo's)")
    p.add_argument("--png", type=Path, default=None, help="draw the 2-D projections to DIR/region.png")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def draw(result: Any, out_dir: Path) -> Path:
    """Six panels: every pair of axes, points coloured by their feasible share, the projected hull."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scipy.spatial import ConvexHull, QhullError

    from sim.region import AXES

    pts, ok = result.points, result.feasible
    fig, axes = plt.subplots(2, 3, figsize=(14, 8.5), constrained_layout=True)
    proj = result.analysis["projections"]
    for ax, (i, j) in zip(axes.flat, itertools.combinations(range(len(AXES)), 2), strict=True):
        xy = pts[:, [i, j]]
        keys, inv = np.unique(np.round(xy, 6), axis=0, return_inverse=True)
        share = np.bincount(inv.ravel(), weights=ok.astype(float)) / np.bincount(inv.ravel())
        sc = ax.scatter(keys[:, 0], keys[:, 1], c=share, cmap="RdYlGn", vmin=0, vmax=1, s=40, edgecolors="k")
        feas = xy[ok]
        if len(feas) > 2:
            try:
                h = ConvexHull(feas)
                loop = np.append(h.vertices, h.vertices[0])
                ax.plot(feas[loop, 0], feas[loop, 1], "b-", lw=1.2)
            except QhullError:
                pass
        ax.set_xlabel(_LABELS[AXES[i]])
        ax.set_ylabel(_LABELS[AXES[j]])
        ax.set_title(f"hull area {proj[f'{i},{j}']:.2f} of the box", fontsize=9)
    fig.colorbar(sc, ax=axes, label="share of sampled points meeting the SLO", shrink=0.8)
    a = result.analysis
    fig.suptitle(
        f"feasible region: coverage {a['coverage']:.3f}, {a['feasible']} of {a['points']} points feasible, "
        f"hull over-estimate {a['hull_overestimate']:.1%} (blue: hull of the feasible points)"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "region.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run(settings: Any, args: argparse.Namespace) -> int:
    """Sample, print, draw; 2 on bad input."""
    from sim.region import AXES, MAX_REPLICAS, RegionConfig, RegionError, locate, run_point, sample, window_trace
    from sim.traces import TraceError
    from sim.workloads import WorkloadError

    spec = settings.models[0]
    try:
        if not 1 <= args.current_replicas <= MAX_REPLICAS or not (0 < args.current_rate < 1e6):
            raise RegionError(f"--current-replicas must lie in [1, {MAX_REPLICAS}], --current-rate in (0, 1e6)")
        cfg = RegionConfig(
            replicas=args.replicas,
            rate_rps=args.rates,
            prompt_scale=args.prompt_scales,
            output_scale=args.output_scales,
            duration_s=args.duration_s,
            trace=args.trace,
            seed=args.seed,
            model=spec.name,
            zones=tuple(settings.zones),
            ttft_slo_ms=spec.ttft_slo_ms,
            itl_slo_ms=spec.itl_slo_ms,
            eps_ref=settings.eps_ref,
        )
        result = sample(cfg)
        trace = window_trace(cfg)
        sent, cur_v = run_point(cfg, trace, args.current_replicas, args.current_rate, 1.0, 1.0)
        cur = [args.current_replicas, args.current_rate, np.mean(trace.prompt_tokens), np.mean(trace.output_tokens)]
    except (RegionError, TraceError, WorkloadError) as exc:
        print(f"governor analyze region: {exc}", file=sys.stderr)
        return 2
    out: dict[str, Any] = result.to_dict()
    out["current"] = {
        **{k: round(float(v), 2) for k, v in zip(AXES, cur, strict=True)},
        "measured_rate_rps": round(sent[1], 2),
        "violation_rate": round(cur_v, 4),
        "feasible": bool(cur_v <= cfg.eps_ref),
        "inside_hull": locate(result, cur),
    }
    if args.png is not None:
        try:
            out["png"] = str(draw(result, args.png))
        except OSError as exc:
            print(f"governor analyze region: cannot write {args.png}: {exc}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    a, pts = result.analysis, result.points
    print(
        f"feasible region of {cfg.model} over {', '.join(cfg.zones)} (SLO: TTFT <= {cfg.ttft_slo_ms:g} ms, "
        f"ITL <= {cfg.itl_slo_ms:g} ms, violation rate <= {cfg.eps_ref:g})"
    )
    for k, name in enumerate(AXES):
        print(f"  axis {_LABELS[name]:<22} {pts[:, k].min():9.1f} .. {pts[:, k].max():9.1f}")
    print(
        f"  sampled {a['points']} points ({cfg.trace}, {cfg.duration_s:g} s each, seed {cfg.seed}) "
        f"in {result.wall_s:.1f} s: {a['feasible']} feasible"
    )
    print(f"  coverage (hull volume / sampled box): {a['coverage']:.3f}")
    bad = round(a["hull_overestimate"] * a["inside_hull"])
    print(
        f"  hull over-estimate: {bad} of {a['inside_hull']} sampled points inside the hull are infeasible "
        f"({a['hull_overestimate']:.1%})"
    )
    print("  2-D projections (hull area / box area):")
    for i, j in itertools.combinations(range(len(AXES)), 2):
        print(f"    {AXES[i] + ' x ' + AXES[j]:<30} {a['projections'][f'{i},{j}']:.3f}")
    c = out["current"]
    print(
        f"  current fleet ({args.current_replicas} replicas/zone, {c['rate_rps']:g} req/s (sent "
        f"{c['measured_rate_rps']:g}), prompt {c['prompt_tokens']:.0f}, output {c['output_tokens']:.0f} tokens): "
        f"violation rate {c['violation_rate']:.2%}, "
        f"{'feasible' if c['feasible'] else 'infeasible'}, {'inside' if c['inside_hull'] else 'outside'} the hull"
    )
    if args.png is not None:
        print(f"  projections drawn to {out['png']}")
    return 0
