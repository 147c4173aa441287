"""``governor demo``: the closed loop on real servers, ending with a report.

Starts (unless given) the embedded Kafka broker and Redis, creates the
topics, starts the stream worker and one executor per zone as child
processes, then replays a real trace through the simulated fleet in scaled
real time.  A load step half-way makes violations rise; the loop has to
scale up.  At the end it waits for the last windows to close, stops
everything, and writes ``report.json``, ``report.txt``, ``report.png`` and
``windows.json`` / ``results.json`` (the zone windows the worker published and the
command results, to compare runs).

``--shadow``: the executors run the ``dry-run`` backend, so nothing scales the
fleet, which keeps ``--replicas`` (a static incumbent); at the end
:mod:`governor.shadow` compares governor's targets with it, from the topics,
and writes ``shadow.json`` and ``shadow.txt``.

``--telemetry`` (the fleet's language, :mod:`sim.live`): ``native`` (default)
ships governor's request and GPU records; ``scrape`` serves each replica's vLLM
``/metrics`` and an HTTP service-discovery document (:mod:`sim.engine_server`)
and starts ``governor ingest scrape`` as a child pointed at it
(``GOVERNOR_SCRAPE_HTTP_SD``, ``GOVERNOR_SCRAPE_INTERVAL_S`` = ``--scrape-interval-s``
trace seconds); ``otlp`` starts ``governor ingest otlp`` as a child and the fleet
exports one span per request to it (:mod:`sim.otlp_export`; GPU records stay
native).  The report says which mode ran.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import socket
import sys
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from governor_telemetry.producer import TelemetryProducer

from bench.report import build_report, plot, render_text
from core import names
from core.clock import ScaledClock
from core.settings import Settings
from core.transport import redis_options
from launch.embedded import EmbeddedServers
from launch.extras import require
from launch.processes import (
    EXECUTOR_READY,
    INGEST_SCRAPE_READY,
    WORKER_READY,
    ChildProcess,
    start_executor,
    start_worker,
)
from launch.progress import ProgressWriter
from launch.topics import Collector, ensure_topics
from sim.engine_metrics import FleetMetrics
from sim.engine_server import EngineServer, ScrapeEngines
from sim.fleet import Fleet, FleetConfig
from sim.live import LiveFleet
from sim.otlp_export import OtlpEngines, OtlpExporter
from sim.perf_model import PerfModel
from sim.traces import load_trace
from sim.workloads import step_load

log = logging.getLogger(__name__)

OTLP_READY = "OTLP receiver listening"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _start_engines(
    settings: Settings, args: Namespace, run_dir: Path, model: str
) -> tuple[Any, ChildProcess | None]:
    """The fleet's engine-telemetry sink and the ingest child it talks to (None, None: native)."""
    mode = getattr(args, "telemetry", "native")
    if mode == "scrape":
        server = EngineServer(FleetMetrics(model))
        await server.start()
        child_settings = settings.replace(
            scrape_http_sd=server.sd_url, scrape_interval_s=args.scrape_interval_s, scrape_engine="vllm"
        )
        child = ChildProcess("ingest-scrape", ["ingest", "scrape"], child_settings, run_dir / "ingest-scrape.log")
        return ScrapeEngines(server), child
    if mode == "otlp":
        port = _free_port()
        argv = ["ingest", "otlp", "--host", "127.0.0.1", "--port", str(port)]
        child = ChildProcess("ingest-otlp", argv, settings, run_dir / "ingest-otlp.log")
        return OtlpEngines(OtlpExporter(f"http://127.0.0.1:{port}/v1/traces")), child
    return None, None


async def _wait_ingest_ready(engines: Any, child: ChildProcess, timeout_s: float = 60.0) -> None:
    """The ingest child's readiness line (it is listening / it has its targets)."""
    needle = OTLP_READY if isinstance(engines, OtlpEngines) else INGEST_SCRAPE_READY
    await asyncio.to_thread(child.wait_for_log, needle, timeout_s)


def _progress(live: LiveFleet, col: Collector, duration: float, zones: list[str], model: str, out: ProgressWriter):  # type: ignore[no-untyped-def]
    async def tick(t: float) -> None:
        if not out.due():
            return
        reps = " ".join(
            f"{z}={live.fleet.replicas(z, model).get('ready', 0)}(+{live.fleet.replicas(z, model).get('starting', 0)})"
            for z in zones
        )
        zw = [w for w in col.windows if w.get("scope") == "zone"]
        last_w = zw[-len(zones) :] if zw else []
        viol = max((w.get("violation_rate") or 0.0) for w in last_w) if last_w else 0.0
        p95 = max((w.get("ttft_p95_ms") or 0.0) for w in last_w) if last_w else 0.0
        applied = sum(1 for r in col.results if r.get("outcome") == "applied")
        out.update(
            f"t={t:6.0f}/{duration:.0f}s  sent={live.stats.submitted:>6}  replicas {reps}  "
            f"TTFT p95 {p95:6.0f} ms  violations {100 * viol:5.1f}%  applied {applied:>3}  "
            f"dead letters {len(col.dead_letters):>3}"
        )

    return tick


async def _run(settings: Settings, args: Namespace, run_dir: Path) -> dict[str, Any]:
    clock = ScaledClock(settings.clock_speed, settings.clock_origin_s)
    model_spec = settings.models[0]
    model = model_spec.name
    created = await ensure_topics(settings)
    log.info("topics ready (%d created)", len(created))
    redis = aioredis.Redis.from_url(str(settings.redis_url), **redis_options(settings))
    for zone in settings.zones:
        await redis.hset(names.desired_replicas(settings.topic_prefix, zone), model, args.replicas)

    children = [start_worker(settings, run_dir)]
    backend = "dry-run" if getattr(args, "shadow", False) else "sim"
    platform: Any = None
    if getattr(args, "platform", "sim") == "k8s":  # scale through the API server's workloads (sim/k8s_platform.py)
        from executors.k8s import api_client
        from sim.k8s_platform import KubePlatform

        platform = KubePlatform(api_client(settings.kubeconfig, settings.k8s_api_url), settings.workloads)
        for zone in settings.zones:
            await platform.scale_to(model, zone, args.replicas)
        backend = "k8s"
        exec_settings = settings.replace(executor_backends="scale=k8s,*=sim")
        children += [start_executor(exec_settings, z, run_dir, None) for z in settings.zones]
    else:
        children += [start_executor(settings, z, run_dir, backend) for z in settings.zones]
    collector = Collector(settings)
    engines: Any = None
    try:
        engines, ingest = await _start_engines(settings, args, run_dir, model)
        if ingest is not None:
            children.append(ingest)
        # Waited for off the event loop: the engine server answers discovery meanwhile.
        await asyncio.to_thread(children[0].wait_for_log, WORKER_READY, 90)
        for c in children[1:]:
            if c is not ingest:
                await asyncio.to_thread(c.wait_for_log, EXECUTOR_READY, 30)
        if ingest is not None:
            await _wait_ingest_ready(engines, ingest)
        await collector.start()
        perf = PerfModel.from_splitwise(model=model)
        t0_ms = clock.now_ms()
        fleet = Fleet(
            FleetConfig(
                models={model: perf},
                zones=tuple(settings.zones),
                startup_s=args.startup_s,
                seed=args.seed,
                initial_replicas=args.replicas,
            ),
            epoch_ms0=t0_ms,
        )
        workload = step_load(load_trace(args.trace), args.qps, args.duration_s, args.step_at_s, args.step_factor)
        wall0 = time.monotonic()
        progress = ProgressWriter(sys.stderr)
        async with TelemetryProducer(
            settings.kafka_bootstrap,
            settings.topic("telemetry"),
            source="sim-fleet",
            linger_ms=100,
            clock_ms=clock.now_ms,
            encoding=settings.telemetry_encoding,
            validate=args.bad_rate <= 0,  # --bad-rate injects malformed records for the worker to dead-letter
        ) as producer:
            live = LiveFleet.on_stack(
                fleet,
                workload,
                settings,
                producer,
                redis,
                clock,
                t0_ms,
                bad_rate=args.bad_rate,
                seed=args.seed,
                platform=platform,
                engines=engines,
            )
            tick = (
                None
                if args.no_progress
                else _progress(live, collector, args.duration_s, list(settings.zones), model, progress)
            )
            stats = await live.run(args.duration_s, on_tick=tick)
            if engines is not None:
                await engines.finish()  # OTLP: the last spans go out; scrape: the server stays up
        # Let the last windows close (window + lateness of trace time, and the last scrape) and
        # their commands land.
        last_s = (
            settings.window_s
            + settings.lateness_s
            + (args.scrape_interval_s if isinstance(engines, ScrapeEngines) else 0)
        )
        await asyncio.sleep(clock.to_wall_s(last_s * 1000) + 2.0)
        wall = time.monotonic() - wall0
        progress.end()
        for c in children:
            if not c.alive():
                raise RuntimeError(f"{c.name} died during the run:\n{c.tail()}")
        zone_windows = [w for w in collector.windows if w.get("scope") == "zone"]
        (run_dir / "windows.json").write_text(json.dumps(zone_windows, default=str))
        (run_dir / "results.json").write_text(json.dumps(collector.results, default=str))
        png = plot(
            run_dir / "report.png", stats.finished, stats.replicas, collector.windows, t0_ms, model_spec.ttft_slo_ms
        )
        report = build_report(
            finished=stats.finished,
            replicas=stats.replicas,
            results=collector.results,
            windows=collector.windows,
            dead_letters=collector.dead_letters,
            ttft_slo_ms=model_spec.ttft_slo_ms,
            itl_slo_ms=model_spec.itl_slo_ms,
            extra={
                "injected_bad_records": stats.corrupted_sent,
                "telemetry_records_sent": stats.records_sent + 0,
                "requests_submitted": stats.submitted,
                "wall_s": round(wall, 1),
                "speed": settings.clock_speed,
                "trace": args.trace,
                "qps": args.qps,
                "duration_s": args.duration_s,
                "step": {"at_s": args.step_at_s, "factor": args.step_factor},
                "window_s": settings.window_s,
                "lateness_s": settings.lateness_s,
                "startup_s": args.startup_s,
                "replicas_initial": args.replicas,
                "seed": args.seed,
                "replica_capacity_rps": model_spec.replica_capacity_rps,
                # (window end in trace s, zone, target) of every applied scale command
                "decisions": sorted(
                    ((r["basis_ms"] - t0_ms) / 1000.0, r["zone"], r["target_replicas"])
                    for r in collector.results
                    if r.get("outcome") == "applied" and r.get("kind") == "scale"
                ),
                "plot": str(png),
                "executor_backend": backend,
                "telemetry": _telemetry_report(args, engines),
            },
        )
        if backend == "dry-run":
            from governor import shadow

            report["shadow"] = shadow.write(
                await shadow.build(settings, 0, 0.0, since_ms=t0_ms), run_dir / "shadow.json"
            )
        return report
    finally:
        await collector.stop()
        for c in children:
            c.stop()
        if engines is not None:  # after the ingest child: it scrapes until it stops
            await engines.close()
        await redis.aclose()


def _telemetry_report(args: Namespace, engines: Any) -> dict[str, Any]:
    mode = getattr(args, "telemetry", "native")
    out: dict[str, Any] = {"mode": mode}
    if mode == "scrape":
        out["scrape_interval_s"] = args.scrape_interval_s
    if engines is not None:
        out.update(engines.stats())
    return out


def add_parser(sub: Any) -> None:
    """``governor demo`` and its flags."""
    d = sub.add_parser("demo", help="run the closed loop on embedded servers and print a report")
    d.add_argument("--trace", default="azure-conv", help="trace name or path (default azure-conv)")
    d.add_argument("--duration-s", type=float, default=None, help="trace seconds to replay (600; local: 300)")
    d.add_argument("--speed", type=float, default=5.0, help="trace seconds per wall second")
    d.add_argument("--qps", type=float, default=16.0, help="mean request rate the trace is scaled to")
    d.add_argument(
        "--step-at-s", type=float, default=None, help="trace time of the load step (200; local: 60; 0 = none)"
    )
    d.add_argument("--step-factor", type=float, default=2.5, help="load multiplier after the step")
    d.add_argument("--replicas", type=int, default=4, help="initial replicas per zone")
    d.add_argument("--startup-s", type=float, default=30.0, help="replica start-up delay (trace s)")
    d.add_argument(
        "--bad-rate",
        type=float,
        default=0.001,
        help="share of malformed telemetry records injected (shows the dead-letter path)",
    )
    d.add_argument("--out", default="runs/demo", help="report directory")
    d.add_argument("--seed", type=int, default=7)
    d.add_argument("--no-progress", action="store_true", help="no live progress view")
    d.add_argument(
        "--no-feedforward",
        dest="feedforward",
        action="store_false",
        help="feedback PID only (default: profile the replica capacity, feedforward on)",
    )
    d.add_argument(
        "--shadow",
        action="store_true",
        help="executors dry-run: the fleet keeps --replicas (a static incumbent); writes shadow.json",
    )
    tel = "the fleet speaks: native records, vLLM /metrics to `ingest scrape`, or spans to `ingest otlp`"
    d.add_argument("--telemetry", choices=["native", "scrape", "otlp"], default="native", help=tel)
    plat = (
        "where replica counts live: sim (the Redis desired hash), k8s (the workloads of GOVERNOR_WORKLOADS on "
        "GOVERNOR_K8S_API_URL, scaled by the executors' k8s backend) or local (real vLLM engines on this machine "
        "behind the vLLM router, bench/local_demo.py)"
    )
    d.add_argument("--platform", choices=["sim", "k8s", "local"], default="sim", help=plat)
    d.add_argument("--scrape-interval-s", type=float, default=5.0, help="scrape mode: trace s between scrapes")
    add_local_arguments(d)


def add_local_arguments(d: Any) -> None:
    """The flags only ``--platform local`` reads."""
    g = d.add_argument_group("--platform local (real vLLM engines behind the vLLM router)")
    g.add_argument(
        "--slo-multiple",
        type=float,
        default=5.0,
        help="SLOs = this x the engine's unloaded P95, up to the next histogram bucket edge",
    )
    g.add_argument("--base-load", type=float, default=0.5, help="load before the step, x one engine's capacity")
    g.add_argument("--step-load", type=float, default=1.5, help="load after --step-at-s, x one engine's capacity")
    g.add_argument("--tail-load", type=float, default=0.3, help="load after --tail-at-s, x one engine's capacity")
    g.add_argument("--tail-at-s", type=float, default=0.0, help="time of the step down (0: 70 %% of --duration-s)")
    g.add_argument("--max-engines", type=int, default=2, help="the model's max_replicas (2 cores hold 2)")
    g.add_argument("--static", type=int, default=0, help="a static pool of N engines (the loop advisory): the baseline")
    g.add_argument("--profile-from", default="", help="take the SLOs and capacity of this earlier report.json")
    g.add_argument("--max-num-seqs", type=int, default=4, help="each engine's batch limit (--max-num-seqs)")
    g.add_argument("--profile-trial-s", type=float, default=15.0, help="length of each capacity trial")
    g.add_argument("--profile-steps", type=int, default=4, help="bisection steps of the capacity profile")
    g.add_argument("--max-prompt-tokens", type=int, default=512, help="the trace's prompts clipped to this")
    g.add_argument("--max-output-tokens", type=int, default=64, help="the trace's outputs clipped to this")
    g.add_argument("--profile-prompt", type=int, default=64, help="prompt tokens of the profile's requests")
    g.add_argument("--profile-output", type=int, default=32, help="output tokens of the profile's requests")


def run_demo(settings: Settings, args: Namespace) -> int:
    require("matplotlib", "the report plot")  # up front, not after the run (extra: bench)
    local = getattr(args, "platform", "sim") == "local"
    if args.duration_s is None:
        args.duration_s = 330.0 if local else 600.0
    if args.step_at_s is None:
        args.step_at_s = 60.0 if local else 200.0
    if local:  # real engines: their own profile, real time, their own report (bench/local_demo.py)
        from bench.local_demo import run_local_demo

        if args.out == "runs/demo":
            args.out = "runs/demo-local"
        if args.telemetry == "native":
            args.telemetry = "scrape"  # real engines speak /metrics or spans, never governor's records
        return run_local_demo(settings, args)
    run_dir = Path(args.out).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.feedforward and settings.models[0].replica_capacity_rps is None:
        # Dynamo-style profiling step: one replica's capacity within the SLO on this trace.
        from sim.fastloop import LoopConfig
        from sim.profiling import profile

        spec = settings.models[0]
        cfg = LoopConfig.of(model=spec.name, ttft_slo_ms=spec.ttft_slo_ms, itl_slo_ms=spec.itl_slo_ms)
        capacity, headroom = profile(load_trace(args.trace), cfg)
        headroom = spec.replica_headroom or headroom  # a spec's own headroom wins over the profile's
        print(
            f"[governor] profiled capacity {capacity:.2f} req/s per replica, headroom {headroom:.3f}", file=sys.stderr
        )
        spec = dataclasses.replace(spec, replica_capacity_rps=capacity, replica_headroom=headroom)
        settings = settings.replace(models=(spec, *settings.models[1:]))
    settings = settings.replace(
        clock_speed=args.speed,
        clock_origin_s=time.time(),
        startup_hint_s=args.startup_s,
        data_dir=str(run_dir / "state"),
        # Records reach the worker ~0.2-0.4 wall s after they finish;
        # in trace time that is speed x longer.
        lateness_s=max(settings.lateness_s, 0.8 * args.speed),
    )
    if getattr(args, "platform", "sim") == "k8s":
        model = settings.models[0].name
        mapped = {w.zone for w in settings.workloads if w.model == model}
        missing = [z for z in settings.zones if z not in mapped]
        if missing or not (settings.k8s_api_url or settings.kubeconfig or os.environ.get("KUBERNETES_SERVICE_HOST")):
            why = f"zones {missing} of {model} have no GOVERNOR_WORKLOADS entry" if missing else "no API server"
            print(
                f"governor demo --platform k8s: {why} (set GOVERNOR_WORKLOADS and GOVERNOR_K8S_API_URL)",
                file=sys.stderr,
            )
            return 2
    with EmbeddedServers(settings, os.environ, log_dir=run_dir / "servers") as servers:
        for line in servers.started:
            print(f"[governor] started embedded {line}", file=sys.stderr)
        report = asyncio.run(_run(servers.settings, args, run_dir))
    shadow_text = report.pop("shadow", None)  # --shadow: written to shadow.json / shadow.txt already
    (run_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    text = render_text(report)
    tel = report.get("telemetry", {})
    text += "\ntelemetry             " + " ".join(f"{k}={v}" for k, v in tel.items())
    (run_dir / "report.txt").write_text(text + "\n")
    print(text)
    print(f"\nreport: {run_dir / 'report.txt'}, {run_dir / 'report.json'}, {run_dir / 'report.png'}")
    if shadow_text is not None:
        print(f"\n{shadow_text}\n\nshadow report: {run_dir / 'shadow.txt'}, {run_dir / 'shadow.json'}")
    return 0 if report["commands"]["applied"] > 0 else 1
