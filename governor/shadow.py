"""``governor shadow-report``: governor's targets next to what an incumbent autoscaler ran.

For adoption: governor runs in advisory mode (``governor pause``, or executors with
``--backend dry-run``) beside the incumbent (HPA, KEDA, a fixed count) that really
scales the fleet.  Two topics are enough to compare them:

* ``<prefix>.commands``: governor's decisions (``kind == "scale"``: ``model``, ``zone``,
  ``target_replicas``, ``basis_ms`` = end of the window it was decided on);
* ``<prefix>.metrics``: zone windows (``scope == "zone"``) with what the fleet ran,
  ``replicas_ready + replicas_starting`` (the incumbent's replicas), and what the SLO
  did (``violation_rate`` over ``count`` requests, ``ttft_p95_ms``).

``<prefix>.results`` is read only as a check: a scale command an executor *applied*
with a real backend means governor drove the fleet, and the run was no shadow run.

Per (model, zone) and zone window, :func:`shadow_report` pairs the incumbent's replicas
with governor's target in force at the window's end: the latest scale command with
``basis_ms + lag <= window_end_ms``.  Before governor's first command of a key its
target is taken equal to the incumbent's (the scaler only issues a command when its
target differs from the fleet's count).  Assumptions, stated in the report too:

* GPU-seconds are replica-seconds: replicas x window length, summed over the windows
  (starting replicas hold a GPU, so they count); windows that never closed (no
  telemetry) count for neither side.
* With ``lag_s = 0`` governor's target counts for the window it was decided on, as if
  realised at once.  Its replicas would have needed start-up time: ``--lag-s`` shifts
  every target later (``window_s``: the target in force *during* the window;
  ``window_s + startup_s``: the replicas governor would have had ready).
* Governor's feedback sees the incumbent's fleet, not its own replicas: where that
  fleet keeps missing the SLO, governor's target keeps rising (its own added replicas
  never show), so its GPU-seconds there are an upper bound of what it would have used.

Pure core (:func:`shadow_report`, :func:`render_text`); :func:`read_topics` is the I/O.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from core.clock import ScaledClock
from core.settings import Settings
from core.transport import kafka_options

KINDS = ("more", "fewer", "same")


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _targets(commands: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], tuple[list[int], list[int]]]:
    """(model, zone) -> (sorted basis_ms, target_replicas) of the scale commands."""
    by_key: dict[tuple[str, str], list[tuple[int, int, int]]] = defaultdict(list)
    for c in commands:
        basis, target = _int(c.get("basis_ms")), _int(c.get("target_replicas"))
        if c.get("kind") != "scale" or basis is None or target is None or target < 0:
            continue
        by_key[(str(c.get("model")), str(c.get("zone")))].append((basis, _int(c.get("issued_at_ms")) or 0, target))
    return {k: ([b for b, _, _ in sorted(v)], [t for _, _, t in sorted(v)]) for k, v in by_key.items()}


def _windows(windows: Iterable[Mapping[str, Any]], since_ms: int | None, until_ms: int | None) -> list[dict[str, Any]]:
    """Zone windows in the period, one per (model, zone, end) (the last copy wins), by time."""
    out: dict[tuple[str, str, int], dict[str, Any]] = {}
    for w in windows:
        end = _int(w.get("window_end_ms"))
        if w.get("scope") != "zone" or end is None:
            continue
        if (since_ms is not None and end <= since_ms) or (until_ms is not None and end > until_ms):
            continue
        start = _int(w.get("window_start_ms"))
        length_s = (end - start) / 1000.0 if start is not None and start < end else _num(w.get("window_s"))
        if not length_s or length_s <= 0:
            continue
        ready, starting = _int(w.get("replicas_ready")) or 0, _int(w.get("replicas_starting")) or 0
        model, zone = str(w.get("model")), str(w.get("zone"))
        out[(model, zone, end)] = {
            "model": model,
            "zone": zone,
            "window_end_ms": end,
            "window_s": length_s,
            "incumbent": ready + starting,
            "violation_rate": _num(w.get("violation_rate")),
            "count": _int(w.get("count")) or 0,
            "ttft_p95_ms": _num(w.get("ttft_p95_ms")),
        }
    return [out[k] for k in sorted(out, key=lambda k: (k[2], k[0], k[1]))]


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Time shares, request-weighted violation rates and GPU-seconds of some rows."""
    total_s = sum(r["window_s"] for r in rows)
    out: dict[str, Any] = {"windows": len(rows), "seconds": round(total_s, 3)}
    for kind in KINDS:
        sel = [r for r in rows if r["governor_wanted"] == kind]
        secs = sum(r["window_s"] for r in sel)
        weighted = [(r["violation_rate"], r["count"]) for r in sel if r["violation_rate"] is not None]
        requests = sum(n for _, n in weighted)
        out[kind] = {
            "windows": len(sel),
            "share_of_time": round(secs / total_s, 4) if total_s else None,
            "requests": requests,
            # request-weighted: the share of the requests of those windows that missed the SLO
            "violation_rate": round(sum(v * n for v, n in weighted) / requests, 5) if requests else None,
        }
    inc = sum(r["incumbent"] * r["window_s"] for r in rows)
    gov = sum(r["governor"] * r["window_s"] for r in rows)
    out["gpu_seconds"] = {
        "incumbent": round(inc, 1),
        "governor": round(gov, 1),
        "governor_minus_incumbent": round(gov - inc, 1),
        "ratio": round(gov / inc, 4) if inc else None,
    }
    diffs = [r["difference"] for r in rows]
    out["max_more"] = max([d for d in diffs if d > 0], default=0)
    out["max_fewer"] = -min([d for d in diffs if d < 0], default=0)
    out["windows_before_first_command"] = sum(1 for r in rows if r["assumed"])
    return out


def _episodes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs of consecutive windows of one key where governor wanted more (or fewer)."""
    eps: list[dict[str, Any]] = []
    for r in rows:
        kind = r["governor_wanted"]
        last = eps[-1] if eps else None
        key = (r["model"], r["zone"])
        if last and (last["model"], last["zone"]) == key and last["wanted"] == kind and last["_open"]:
            last["end_ms"] = r["window_end_ms"]
            last["windows"].append(r)
            continue
        if last:
            last["_open"] = False
        if kind != "same":
            eps.append({"model": key[0], "zone": key[1], "wanted": kind, "_open": True, "windows": [r]})
            eps[-1]["start_ms"] = r["window_end_ms"] - int(r["window_s"] * 1000)
            eps[-1]["end_ms"] = r["window_end_ms"]
    out = []
    for e in eps:
        ws = e.pop("windows")
        e.pop("_open")
        e.update(_summary(ws)[e["wanted"]])
        e["incumbent"] = sorted({w["incumbent"] for w in ws})
        e["governor"] = sorted({w["governor"] for w in ws})
        out.append(e)
    return out


def shadow_report(
    commands: Iterable[Mapping[str, Any]],
    windows: Iterable[Mapping[str, Any]],
    *,
    results: Iterable[Mapping[str, Any]] = (),
    since_ms: int | None = None,
    until_ms: int | None = None,
    lag_s: float = 0.0,
) -> dict[str, Any]:
    """Governor's targets vs the incumbent's replicas, per window and summed (see the module docstring).

    ``commands`` from ``<prefix>.commands``, ``windows`` from ``<prefix>.metrics`` (other
    records are skipped), optional ``results`` from ``<prefix>.results``; only windows
    ending in ``(since_ms, until_ms]`` count.  No I/O.
    """
    targets = _targets(commands)
    lag_ms = int(round(lag_s * 1000))
    rows: list[dict[str, Any]] = []
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for w in _windows(windows, since_ms, until_ms):
        bases, values = targets.get((w["model"], w["zone"]), ([], []))
        i = bisect.bisect_right(bases, w["window_end_ms"] - lag_ms)
        governor = values[i - 1] if i else w["incumbent"]
        diff = governor - w["incumbent"]
        row = {
            **w,
            "governor": governor,
            "assumed": i == 0,  # no command in force yet: governor's target taken as the incumbent's
            "difference": diff,
            "governor_wanted": "more" if diff > 0 else "fewer" if diff < 0 else "same",
        }
        rows.append(row)
        by_key[(w["model"], w["zone"])].append(row)
    real = [
        r
        for r in results
        if r.get("kind") == "scale" and r.get("outcome") == "applied" and r.get("backend") not in ("dry-run", None)
    ]
    return {
        "assumptions": {
            "incumbent": "replicas_ready + replicas_starting of each zone window",
            "governor": f"latest scale command with basis_ms + {lag_s:g} s <= window end;"
            " before the first one, equal to the incumbent",
            "gpu_seconds": "replicas x window length, summed over the closed windows",
            "violation_rate": "request-weighted over the windows of each kind",
            "feedback": "governor saw the incumbent's fleet: where it missed the SLO, governor's target"
            " kept rising, so its GPU-seconds there are an upper bound",
            "lag_s": lag_s,
        },
        "period": {
            "since_ms": since_ms,
            "until_ms": until_ms,
            "first_window_end_ms": rows[0]["window_end_ms"] if rows else None,
            "last_window_end_ms": rows[-1]["window_end_ms"] if rows else None,
        },
        "scale_commands": sum(len(b) for b, _ in targets.values()),
        "applied_for_real": len(real),  # > 0: governor drove the fleet, not a shadow run
        "summary": _summary(rows),
        "keys": [{"model": m, "zone": z, **_summary(rs)} for (m, z), rs in sorted(by_key.items())],
        "episodes": _episodes(sorted(rows, key=lambda r: (r["model"], r["zone"], r["window_end_ms"]))),
        "windows": rows,
    }


def _pct(v: float | None) -> str:
    return "   -  " if v is None else f"{100 * v:5.1f}%"


def render_text(rep: Mapping[str, Any], *, max_episodes: int = 10) -> str:
    """A readable summary: totals, one line per (model, zone), the largest differences."""
    s = rep["summary"]
    g = s["gpu_seconds"]
    lines = [
        f"shadow report: {s['windows']} zone windows ({s['seconds']:.0f} s of windows),"
        f" {rep['scale_commands']} governor scale commands",
        f"  governor wanted more {_pct(s['more']['share_of_time'])} of the time,"
        f" fewer {_pct(s['fewer']['share_of_time'])}, the same {_pct(s['same']['share_of_time'])}",
        f"  SLO violation rate when governor wanted more {_pct(s['more']['violation_rate'])},"
        f" fewer {_pct(s['fewer']['violation_rate'])}, the same {_pct(s['same']['violation_rate'])}",
        f"  GPU-seconds: incumbent {g['incumbent']:.0f}, governor {g['governor']:.0f}"
        f" ({g['governor_minus_incumbent']:+.0f}" + (f", x{g['ratio']:.2f})" if g["ratio"] is not None else ")"),
        f"  assumptions: GPU-seconds = replicas x window length; governor's targets as if realised"
        f" {rep['assumptions']['lag_s']:g} s after their decision (--lag-s; start-up time not included at 0);"
        " governor saw the incumbent's fleet, so where that fleet missed the SLO its targets kept rising",
    ]
    if rep["applied_for_real"]:
        lines.append(f"  WARNING: {rep['applied_for_real']} scale commands were applied to the fleet: not a shadow run")
    head = f"  {'model':<14} {'zone':<8} {'windows':>7} {'more':>6} {'fewer':>6} {'viol+':>6} {'viol-':>6}"
    lines += ["", head + f" {'GPU-s inc':>10} {'GPU-s gov':>10}"]
    for k in rep["keys"]:
        lines.append(
            f"  {k['model']:<14} {k['zone']:<8} {k['windows']:>7} {_pct(k['more']['share_of_time'])}"
            f" {_pct(k['fewer']['share_of_time'])} {_pct(k['more']['violation_rate'])}"
            f" {_pct(k['fewer']['violation_rate'])} {k['gpu_seconds']['incumbent']:>10.0f}"
            f" {k['gpu_seconds']['governor']:>10.0f}"
        )
    eps = sorted(rep["episodes"], key=lambda e: -e["windows"])[:max_episodes]
    if eps:
        t0 = rep["period"]["first_window_end_ms"] or 0
        lines += ["", "  where they differ (longest runs; t in s from the first window):"]
        for e in sorted(eps, key=lambda e: e["start_ms"]):
            lines.append(
                f"  t={(e['start_ms'] - t0) / 1000:>7.0f}..{(e['end_ms'] - t0) / 1000:<7.0f} {e['model']}/{e['zone']}:"
                f" governor wanted {e['wanted']} ({e['governor']} vs {e['incumbent']}),"
                f" SLO violations {_pct(e['violation_rate']).strip()}"
            )
    return "\n".join(lines)


async def read_topics(settings: Settings, timeout_s: float = 60.0) -> dict[str, list[dict[str, Any]]]:
    """Every record of the commands, results and metrics topics, up to their end offsets at start."""
    from aiokafka import AIOKafkaConsumer

    names = {settings.topic(n): n for n in ("commands", "results", "metrics")}
    out: dict[str, list[dict[str, Any]]] = {n: [] for n in names.values()}
    consumer = AIOKafkaConsumer(
        *names,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        **kafka_options(settings),
    )
    ends: dict[Any, int] = {}

    def keep(batch: Mapping[Any, list[Any]]) -> None:
        for tp, msgs in batch.items():
            for m in msgs:
                if tp in ends and m.offset >= ends[tp]:
                    continue  # written after the read began
                try:
                    rec = orjson.loads(m.value)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(rec, dict):
                    out[names[tp.topic]].append(rec)

    try:
        await consumer.start()
        deadline = time.monotonic() + timeout_s
        while not consumer.assignment() and time.monotonic() < deadline:
            keep(await consumer.getmany(timeout_ms=200))  # the metadata assigns the partitions
        ends = await consumer.end_offsets(list(consumer.assignment()))
        left = set(ends)
        while time.monotonic() < deadline:
            left = {tp for tp in left if await consumer.position(tp) < ends[tp]}
            if not left:
                break
            keep(await consumer.getmany(timeout_ms=500, max_records=5000))
        if left:
            print(f"governor: shadow-report: stopped after {timeout_s:.0f} s, some records unread", file=sys.stderr)
    finally:
        await consumer.stop()
    return out


async def build(settings: Settings, since_s: float, lag_s: float, since_ms: int | None = None) -> dict[str, Any]:
    """Read the topics and compute the report of the last ``since_s`` (0 = all) of the run's clock."""
    now_ms = ScaledClock(settings.clock_speed, settings.clock_origin_s).now_ms()
    if since_ms is None and since_s > 0:
        since_ms = now_ms - int(since_s * 1000)
    topics = await read_topics(settings)
    return shadow_report(
        topics["commands"], topics["metrics"], results=topics["results"], since_ms=since_ms, lag_s=lag_s
    )


def write(rep: Mapping[str, Any], json_path: Path) -> str:
    """``rep`` as JSON at ``json_path`` and its text next to it (``.txt``); the text."""
    json_path.write_text(json.dumps(rep, indent=2))
    text = render_text(rep)
    json_path.with_suffix(".txt").write_text(text + "\n")
    return text


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "shadow-report",
        help="governor's targets vs the replicas an incumbent autoscaler ran (advisory / dry-run mode)",
    )
    p.add_argument("--since-s", type=float, default=3600.0, help="period: the last N seconds (0 = all)")
    p.add_argument("--lag-s", type=float, default=0.0, help="delay before a target counts (start-up time)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--out", default="", help="also write the JSON report to FILE (and its text to FILE.txt)")


def run_shadow_report(settings: Settings, args: argparse.Namespace) -> int:
    try:
        rep = asyncio.run(build(settings, args.since_s, args.lag_s))
    except Exception as exc:  # noqa: BLE001 - one line for the operator, not a traceback
        print(f"governor: shadow-report: cannot read the topics: {exc!r}", file=sys.stderr)
        return 2
    text = write(rep, Path(args.out)) if args.out else render_text(rep)
    print(json.dumps(rep, indent=2) if args.json else text)
    return 0 if rep["summary"]["windows"] else 1
