"""``governor bench priority``: two request classes overloading a real vLLM engine, with and without
engine priorities, side by side (issue 36 item 5).

One run starts the vLLM router and one engine of the tiny model (:class:`engines.pool.EnginePool`,
the engine venv) for a model whose classes configure priorities, so the pool starts it as the
``local`` backend would: with ``--scheduling-policy priority``.  The priorities are the config's
(``--config-model``, default the first of ``GOVERNOR_MODELS``: ``classes.<class>.priority``) when it
configures any, else the router's class priorities (trading 0, voice 1, batch 2).  Then, through the
router:

1. the unloaded latency (requests one at a time; :func:`engines.profiling.unloaded`): trading's
   TTFT SLO is ``--slo-multiple`` x its P95, the other classes' in the router's proportions
   (:func:`class_slos_ms`: batch 33x trading's, at most ``--timeout-s``), the ITL SLO ``--itl-slo-multiple`` x the unloaded
   time per output token (:func:`bench.engines.itl_basis`);
2. the engine's capacity: ``--probe-requests`` with the engine's batch always full, completed per
   second (a burst all in flight at once read 35.6 req/s where 24 req/s were sustained);
3. two arms on the same seeded Poisson schedule at ``--load`` x that capacity for ``--duration-s``,
   each request of a class drawn from ``--classes`` by ``--shares`` (trading a quarter by default,
   0.4x the capacity: an urgent class that fits alone): ``fcfs``, where no request carries a
   priority (all default 0: the engine's waiting queue, ordered by (priority, arrival), is then
   first come first served), and ``priority``, where each carries its class's.  The engine drains
   between them; an even ``--seed`` runs ``fcfs`` first, an odd one ``priority`` first.

A request is on time when it is ``ok`` within its class's TTFT and ITL SLOs (a failed, timed-out or
cut one is late).  The P95 TTFT counts a request that got no first token at ``--timeout-s``.

The design source (§1) reports a P95 gain of -210 ms for "static batching + priority queue" on its
own testbed, one figure for the strategy, with no class split and no load stated: it is printed
beside the change of the P95 TTFT here, not compared as if it were the same experiment.

>>> from engines.loadgen import RequestResult, RequestSpec
>>> rs = [RequestResult(RequestSpec(0.0, 8, 4, "trading", 0), 0.0, "ok", 200, 0.05, 0.01, 0.1, 4),
...       RequestResult(RequestSpec(0.0, 8, 4, "batch", 2), 0.0, "timeout", 200, None, None, 10.0, 0)]
>>> [(r["class"], r["on_time"], r["p95_ttft_ms"]) for r in class_rows(rs, {"trading": (100.0, 50.0),
...                                                                          "batch": (1000.0, 50.0)}, 10.0)]
[('trading', 1.0, 50.0), ('batch', 0.0, 10000.0), ('all', 0.5, 9502.5)]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.engines import MODEL, add_options, engine_run, grow, itl_basis
from bench.load import load_classes
from controllers.routing_model import DEFAULT_CLASSES
from core.settings import REQUEST_CLASSES, ClassSlo, ModelSpec, Settings
from engines.loadgen import RequestResult, RequestSpec, percentile, replay, schedule
from engines.pool import EnginePool, EngineSpec, free_port
from engines.profiling import poisson_specs, unloaded
from engines.router import RouterClient, start_router

__all__ = ["SEED_P95_GAIN_MS", "add_parser", "bench_model", "class_rows", "class_slos_ms", "markdown", "run_priority"]

HELP = "two request classes overloading a real vLLM engine: on-time share per class with and without priorities"
#: design source §1, "static batching + priority queue": the P95 improvement it reports (its testbed)
SEED_P95_GAIN_MS = -210.0
ARMS = ("fcfs", "priority")


def _say(msg: str) -> None:
    print(f"[bench priority] {msg}", file=sys.stderr, flush=True)


def class_slos_ms(names: Sequence[str], trading_ttft_ms: float, cap_ms: float) -> dict[str, float]:
    """Each class's TTFT SLO: trading's, the others in the router's proportions (``DEFAULT_CLASSES``:
    trading 300 ms, voice 800 ms, batch 10 s, the design source's trading SLA among them), at most
    ``cap_ms`` (the request timeout: a later first token is never seen).

    >>> class_slos_ms(["trading", "batch"], 250.0, 15_000.0), class_slos_ms(["batch"], 600.0, 15_000.0)
    ({'trading': 250.0, 'batch': 8333.3}, {'batch': 15000.0})
    """
    base = {c.name: c.ttft_slo_ms for c in DEFAULT_CLASSES}
    return {c: round(min(cap_ms, trading_ttft_ms * base[c] / base["trading"]), 1) for c in names}


def bench_model(settings: Settings, config_model: str) -> tuple[ModelSpec, str]:
    """The bench's model: the class priorities of the config's ``config_model`` (empty: the first of
    GOVERNOR_MODELS) when it configures any, else the router's class priorities; and where they came from.

    >>> m, where = bench_model(Settings(), "")
    >>> {c: m.priority(c) for c in m.classes}, where
    ({'trading': 0, 'voice': 1, 'batch': 2}, "the router's class priorities (the config's llama2-70b sets none)")
    """
    spec = settings.model(config_model) if config_model else settings.models[0]
    if spec is None:
        raise SystemExit(f"--config-model {config_model!r} is not in GOVERNOR_MODELS")
    if spec.schedules_by_priority:
        classes = {c: ClassSlo(priority=spec.priority(c)) for c in REQUEST_CLASSES}
        where = f"the config's model {spec.name} (classes.<class>.priority)"
    else:
        classes = {c.name: ClassSlo(priority=c.priority) for c in DEFAULT_CLASSES}
        where = f"the router's class priorities (the config's {spec.name} sets none)"
    return ModelSpec(MODEL, classes=classes), where


def class_rows(
    results: Sequence[RequestResult], slos: Mapping[str, tuple[float, float]], timeout_s: float
) -> list[dict[str, Any]]:
    """Per class (in ``slos`` order) and for ``all``: requests, the share on time (``ok`` within its
    class's (TTFT, ITL) SLOs), the P95 TTFT (ms; no first token = ``timeout_s``) and the not-``ok`` count."""

    def row(name: str, rs: Sequence[RequestResult]) -> dict[str, Any]:
        on_time = sum(r.meets(*slos[str(r.spec.request_class)]) for r in rs)
        ok = [(r, slos[str(r.spec.request_class)]) for r in rs if r.status == "ok" and r.ttft_s is not None]
        late_ttft = sum(1000.0 * r.ttft_s > slo[0] for r, slo in ok if r.ttft_s is not None)
        ttfts = [r.ttft_s if r.ttft_s is not None else timeout_s for r in rs]
        p95 = percentile(ttfts, 95)
        return {
            "class": name,
            "requests": len(rs),
            "on_time": round(on_time / len(rs), 4) if rs else None,
            "p95_ttft_ms": None if p95 is None else round(1000.0 * p95, 1),
            "not_ok": sum(r.status != "ok" for r in rs),
            "ok_late_ttft": late_ttft,  # ok, first token after the SLO
            "ok_late_itl": len(ok) - late_ttft - on_time,  # ok, first token in time, mean ITL over the SLO
        }

    rows = [row(c, [r for r in results if r.spec.request_class == c]) for c in slos]
    return [*rows, row("all", results)]


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


def markdown(meta: Mapping[str, Any], arms: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """The side-by-side table: per class, on-time share and P95 TTFT without and with priorities."""
    fcfs, prio = arms["fcfs"], arms["priority"]
    lines = [
        f"`{meta['command']}`: {meta['rate_rps']:.2f} req/s offered = {meta['load']:g} x the engine's "
        f"{meta['capacity_rps']:.2f} req/s for {meta['duration_s']:g} s, class shares {meta.get('shares')}; "
        f"priorities from {meta['priorities_from']}",
        "",
        "| class | priority | TTFT SLO, ms | requests | on time, fcfs | on time, priority | P95 TTFT fcfs, ms "
        "| P95 TTFT priority, ms | not ok fcfs / priority | ok but late by TTFT, ITL: fcfs; priority |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a, b in zip(fcfs, prio, strict=True):
        c = a["class"]
        slo = meta["slos"].get(c)
        lines.append(
            f"| {c} | {meta['priorities'].get(c, '-')} | {'-' if slo is None else slo[0]} | {a['requests']} | "
            f"{_pct(a['on_time'])} | {_pct(b['on_time'])} | {a['p95_ttft_ms']} | {b['p95_ttft_ms']} | "
            f"{a['not_ok']} / {b['not_ok']} | {a['ok_late_ttft']}, {a['ok_late_itl']}; "
            f"{b['ok_late_ttft']}, {b['ok_late_itl']} |"
        )
    gains = ", ".join(
        f"{a['class']} {b['p95_ttft_ms'] - a['p95_ttft_ms']:+.0f} ms"
        for a, b in zip(fcfs, prio, strict=True)
        if a["p95_ttft_ms"] is not None and b["p95_ttft_ms"] is not None
    )
    lines += [
        "",
        f"P95 TTFT change with priorities: {gains}; the design source (§1, static batching + priority queue, "
        f"its testbed, one figure for all requests): {SEED_P95_GAIN_MS:+.0f} ms.",
    ]
    return "\n".join(lines)


async def _sustained_rps(url: str, n: int, concurrency: int, shape: Mapping[str, int]) -> float:
    """``n`` requests due at once, ``concurrency`` in flight (the engine's batch always full, its queue
    short): completed per second of the whole run, the client's and the router's costs included."""
    specs = [RequestSpec(0.0, shape["prompt_tokens"], shape["output_tokens"])] * n
    res = await replay(url, MODEL, specs, concurrency=concurrency, timeout_s=120.0)
    ok = sum(r.status == "ok" for r in res.results)
    if not ok:
        raise RuntimeError("capacity probe: no request completed")
    return ok / res.duration_s


async def _drained(pool: EnginePool, timeout_s: float) -> None:
    """Until the engine shows nothing running or waiting twice in a row (or ``timeout_s``)."""
    deadline, zeros = time.monotonic() + timeout_s, 0
    while zeros < 2 and time.monotonic() < deadline:
        zeros = zeros + 1 if await pool.in_flight() == 0 else 0
        await asyncio.sleep(0.25)


async def _bench(
    a: argparse.Namespace, model: ModelSpec, python: Path, model_dir: Path, run_dir: Path, pools: list[Path]
) -> dict[str, Any]:
    router = start_router(free_port(), free_port(), run_dir / "router.log")
    shape = {"prompt_tokens": a.prompt_tokens, "output_tokens": a.output_tokens}
    state = run_dir / "pool"
    pools.append(state)
    spec = EngineSpec(
        python=str(python), model_dir=str(model_dir), served_name=MODEL, model=MODEL, zone="local",
        max_num_seqs=a.max_num_seqs, cores=(a.core,), drain_timeout_s=10.0, grace_s=5.0,
        scheduling_policy="priority" if model.schedules_by_priority else "fcfs",
    )  # fmt: skip
    pool = EnginePool(spec, RouterClient(router.url), state)
    try:
        await router.wait_healthy()
        t0 = time.monotonic()
        _say(f"starting one engine ({spec.scheduling_policy} scheduling; a cold start takes 40 s to 3 min here)")
        await grow(pool, 1, a.start_timeout_s)
        startup_s = round(time.monotonic() - t0, 1)
        base = itl_basis(await unloaded(router.url, MODEL, n=20, warmup=8, **shape), a.output_tokens)
        ttft_ms, itl_ms = 1000.0 * base.ttft_p95_s, round(a.itl_slo_multiple * 1000.0 * base.itl_p95_s, 1)
        names = [c.name for c in load_classes(a.classes, model)]
        slos = {
            c: (ms, itl_ms) for c, ms in class_slos_ms(names, a.slo_multiple * ttft_ms, 1000.0 * a.timeout_s).items()
        }
        capacity = await _sustained_rps(router.url, a.probe_requests, 2 * a.max_num_seqs, shape)
        rate = a.load * capacity
        _say(f"unloaded P95 TTFT {ttft_ms:.1f} ms; SLOs {slos}; capacity {capacity:.2f} req/s -> {rate:.2f} req/s")
        poisson = poisson_specs(rate, a.duration_s, a.prompt_tokens, a.output_tokens, a.seed)
        workload = SimpleNamespace(
            arrival_s=[s.at_s for s in poisson], prompt_tokens=[s.prompt_tokens for s in poisson],
            output_tokens=[s.output_tokens for s in poisson],
        )  # fmt: skip
        prio = schedule(
            workload, max_prompt_tokens=a.prompt_tokens, max_output_tokens=a.output_tokens,
            classes=[replace(c, share=sh) for c, sh in zip(load_classes(a.classes, model), a.share_list, strict=True)],
            seed=a.seed,
        )  # fmt: skip
        arms: dict[str, list[dict[str, Any]]] = {}
        raw: dict[str, Any] = {}
        for arm in ARMS if a.seed % 2 == 0 else ARMS[::-1]:  # both orders over two seeds: drift shows
            await _drained(pool, 30.0)
            specs = prio if arm == "priority" else [replace(s, priority=None) for s in prio]
            _say(f"arm {arm}: {len(specs)} requests over {a.duration_s:g} s")
            res = await replay(router.url, MODEL, specs, concurrency=1024, timeout_s=a.timeout_s)
            arms[arm] = class_rows(res.results, slos, a.timeout_s)
            raw[arm] = {"counts": res.counts(), "duration_s": round(res.duration_s, 1)}
            _say(f"arm {arm}: " + ", ".join(f"{r['class']} {_pct(r['on_time'])}" for r in arms[arm]))
        if pool.deaths or pool.failed_starts:
            raise RuntimeError(f"the engine was lost during the run ({pool.deaths} deaths)")
    finally:
        await pool.close(stop_engines=True)
        router.stop()
    meta = {
        "command": a.command_line,
        "startup_s": startup_s,
        "unloaded": base.as_dict(),
        "capacity_rps": round(capacity, 3),
        "load": a.load,
        "rate_rps": round(rate, 3),
        "duration_s": a.duration_s,
        "slos": slos,
        "priorities": {c: model.priority(c) for c in names},
        "priorities_from": a.priorities_from,
        "shares": dict(zip(names, a.share_list, strict=True)),
        "seed_p95_gain_ms": SEED_P95_GAIN_MS,
    }
    return {"meta": meta, "arms": arms, "summaries": raw}


#: the options: (flag, type, default, help)
OPTIONS: tuple[tuple[str, type, Any, str], ...] = (
    ("--classes", str, "trading,batch", "request classes (default trading,batch)"),
    ("--shares", str, "1,3", "each class's share of the requests, in --classes order (default 1,3)"),
    ("--config-model", str, "", "the GOVERNOR_MODELS model whose class priorities to use (default: the first)"),
    ("--slo-multiple", float, 25.0, "trading's TTFT SLO = this x the unloaded P95 TTFT, the rest in proportion (25)"),
    ("--itl-slo-multiple", float, 5.0, "ITL SLO = this x the unloaded time per output token (5)"),
    ("--load", float, 1.6, "offered load, x the engine's measured capacity (1.6)"),
    ("--duration-s", float, 60.0, "seconds of each arm's schedule (60)"),
    ("--timeout-s", float, 15.0, "a request not done this long after it was due is late and dropped (15)"),
    ("--max-num-seqs", int, 4, "the engine's batch limit (4)"),
    ("--core", int, 1, "the core the engine is pinned to (1)"),
    ("--prompt-tokens", int, 64, "prompt tokens of every request (64)"),
    ("--output-tokens", int, 32, "output tokens of every request (32)"),
    ("--probe-requests", int, 200, "requests of the capacity probe, 2 x --max-num-seqs in flight (200)"),
    ("--seed", int, 0, "seed of the arrivals and the class draw (0)"),
    ("--start-timeout-s", float, 240.0, "wait for the engine (240)"),
    ("--out", str, "runs/bench-priority", "run directory (engine and router logs)"),
    ("--json", str, "", "also write the rows and each arm's counts here"),
)


def add_parser(sub: Any) -> None:
    add_options(sub.add_parser("priority", help=HELP), OPTIONS)


def run_priority(settings: Settings, a: argparse.Namespace) -> int:
    if not (a.load > 0 and a.duration_s > 0 and a.timeout_s > 0 and a.probe_requests >= 1 and a.slo_multiple > 0):
        raise SystemExit("need --load, --duration-s, --timeout-s, --slo-multiple > 0 and --probe-requests >= 1")
    model, a.priorities_from = bench_model(settings, a.config_model)
    try:
        a.share_list = [float(x) for x in a.shares.split(",")]
        if len(a.share_list) != len(load_classes(a.classes, model)) or min(a.share_list) <= 0:
            raise ValueError(f"--shares {a.shares!r}: one number > 0 per class of --classes {a.classes!r}")
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    a.command_line = "governor " + shlex.join(sys.argv[1:]) if "priority" in sys.argv else "governor bench priority"
    run_dir = Path(a.out).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    out = engine_run(
        settings, "priority", lambda python, model_dir, pools: _bench(a, model, python, model_dir, run_dir, pools)
    )
    if isinstance(out, int):
        return out
    print(markdown(out["meta"], out["arms"]))
    print(f"\nwall {out['meta']['wall_s']:.0f} s; engine cold start {out['meta']['startup_s']} s")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2, default=str))
    return 0
