"""``governor load``: replay a trace against a real OpenAI endpoint (an engine or the router) and
print what the client measured (:mod:`engines.loadgen`).  It lives beside the benchmarks because
it builds its schedule from ``sim``, which ``engines/`` does not import.

The schedule is the one the simulated fleet replays (``sim.workloads.step_load`` of the trace at
``--qps`` for ``--duration-s`` trace seconds, ``--step-factor`` from ``--step-at-s``), sent at
``--speed`` trace seconds per wall second, lengths clipped to the model's context.  With
``--classes`` each request carries its class's engine ``priority`` from the config of the model it
names (``--model``; :func:`load_classes`).
"""

from __future__ import annotations

import asyncio
import json
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

from core.defaults import ITL_SLO_MS, TTFT_SLO_MS
from core.settings import REQUEST_CLASSES, ModelSpec, Settings

__all__ = ["add_parser", "load_classes", "run_load"]


def add_parser(sub: Any) -> None:
    """``governor load`` and its flags."""
    p = sub.add_parser(
        "load",
        help="replay a trace against an OpenAI endpoint (streaming); latencies measured at the client",
        description="Replay a trace against a real OpenAI endpoint (an engine or the router), open loop and "
        "streaming, and print what the client measured: TTFT, ITL and end-to-end latency of every request, "
        "attainment, and the requests that failed, timed out or were cut.",
    )
    p.add_argument("--url", required=True, help="base URL of the OpenAI API (an engine or the router)")
    p.add_argument("--model", required=True, help="the served model name the requests ask for")
    p.add_argument("--trace", default="azure-conv", help="trace name or path (default azure-conv)")
    p.add_argument("--qps", type=float, default=2.0, help="mean request rate the trace is scaled to (trace time)")
    p.add_argument("--duration-s", type=float, default=60.0, help="trace seconds to replay")
    p.add_argument("--speed", type=float, default=1.0, help="trace seconds per wall second")
    p.add_argument("--step-at-s", type=float, default=0.0, help="trace time of a load step (0 = none)")
    p.add_argument("--step-factor", type=float, default=1.0, help="load multiplier after the step")
    p.add_argument("--max-prompt-tokens", type=int, default=512, help="prompt lengths clipped to this")
    p.add_argument("--max-output-tokens", type=int, default=64, help="output lengths clipped to this")
    p.add_argument("--length-scale", type=float, default=1.0, help="trace lengths multiplied by this before clipping")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight at most")
    p.add_argument("--timeout-s", type=float, default=60.0, help="a request not done this long after it was due")
    p.add_argument(
        "--classes",
        default="",
        help="request classes drawn evenly, e.g. trading,voice,batch; each request carries its class's priority "
        "when the config's model named --model configures priorities (GOVERNOR_MODELS classes.<class>.priority)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the class draw")
    p.add_argument("--ttft-slo-ms", type=float, default=TTFT_SLO_MS, help="TTFT SLO of the attainment")
    p.add_argument("--itl-slo-ms", type=float, default=ITL_SLO_MS, help="mean ITL SLO of the attainment")
    p.add_argument("--window-s", type=float, default=10.0, help="window of the per-window figures in --out")
    p.add_argument("--out", type=Path, help="write every request's result, the summary and the windows (JSON)")


def load_classes(names: str, model: ModelSpec | None) -> list[Any]:
    """The :class:`engines.loadgen.LoadClass` of comma-separated class names (:data:`REQUEST_CLASSES`),
    each with the engine priority ``model`` gives that class (``ModelSpec.priority``: its configured one,
    else the default 0) when ``model`` configures any priority (its engines then schedule by priority,
    ``executors.local``), else with none (no ``priority`` sent: the engines serve in arrival order).

    >>> m = ModelSpec("m", classes={"trading": {"priority": -1}, "batch": {"priority": 5}})
    >>> [(c.name, c.priority) for c in load_classes("trading, voice,batch", m)]
    [('trading', -1), ('voice', 0), ('batch', 5)]
    >>> [(c.name, c.priority) for c in load_classes("trading", ModelSpec("m"))], load_classes("", None)
    ([('trading', None)], [])
    """
    from engines.loadgen import LoadClass, LoadError

    by_priority = model is not None and model.schedules_by_priority
    out = []
    for name in (n.strip() for n in names.split(",")):
        if not name:
            continue
        if name not in REQUEST_CLASSES:
            raise LoadError(f"--classes: unknown class {name!r} (choose from {', '.join(REQUEST_CLASSES)})")
        out.append(LoadClass(name, priority=model.priority(name) if model is not None and by_priority else None))
    return out


def run_load(settings: Settings, args: Namespace) -> int:
    from engines.loadgen import LoadError, replay, schedule
    from sim.traces import load_trace
    from sim.workloads import WorkloadError, step_load

    try:
        workload = step_load(load_trace(args.trace), args.qps, args.duration_s, args.step_at_s, args.step_factor)
        specs = schedule(
            workload,
            speed=args.speed,
            max_prompt_tokens=args.max_prompt_tokens,
            max_output_tokens=args.max_output_tokens,
            length_scale=args.length_scale,
            classes=load_classes(args.classes, settings.model(args.model)),
            seed=args.seed,
        )
        print(
            f"governor load: {len(specs)} requests to {args.url} over {args.duration_s / args.speed:g} s",
            file=sys.stderr,
        )
        result = asyncio.run(
            replay(args.url, args.model, specs, concurrency=args.concurrency, timeout_s=args.timeout_s)
        )
    except (LoadError, WorkloadError) as exc:
        print(f"governor load: {exc}", file=sys.stderr)
        return 2
    summary = result.summary(args.ttft_slo_ms, args.itl_slo_ms)
    print(json.dumps(summary, indent=2))
    if args.out is not None:
        doc = {**result.to_dict(), "summary": summary, "windows": result.windows(args.window_s)}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0
