"""``governor bench scrape-scale``: what one ``governor ingest scrape`` adapter costs per target.

A child process serves ``--targets`` simulated vLLM engines (:class:`sim.engine_server.EngineServer`:
a loopback port per replica, so each is its own node, and their HTTP SD document, replicas spread
over ``GOVERNOR_ZONES``).  Every read of the discovery document advances each replica by one
``--interval-s`` of traffic (``--qps-per-target`` requests on average, Poisson; latencies drawn
around the model's SLOs; new gauges), so one adapter round sees one interval's deltas.  The
target side's CPU is the child's, not the adapter's.

This process is the adapter: the shipped :class:`adapters.scrape.runner.EndpointCollector`
(discovery, one GET per target, :meth:`Scraper.step`: parse, deltas, records) and
:func:`adapters.scrape.runner.scrape_loop` into a :class:`TelemetryProducer` (validation,
batching by partition key, encoding), whose Kafka client is replaced by one that counts the
bytes (the broker's and the network's share is left out).  ``GOVERNOR_SCRAPE_SHARD`` and
``GOVERNOR_SCRAPE_SHARD_ZONES`` (or ``--shard``) apply as in the adapter; the bound
``GOVERNOR_SCRAPE_MAX_TARGETS`` is raised to ``--targets`` for the run.

Rounds run back to back (the first is the baseline, as the adapter's first round).  Per round
after it: wall time and this process's CPU time (all its threads), and the CPU of
:meth:`Scraper.step` within it; printed as shares of one ``--interval-s`` and as the targets one
adapter reads at that interval with ``--headroom`` of a core left (CPU-bound) and within the
interval (wall-bound).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import multiprocessing as mp
import os
import resource
import statistics
import time
from typing import Any

import numpy as np
from governor_telemetry.producer import TelemetryProducer

from adapters.scrape.runner import EndpointCollector, Scraper, scrape_loop
from adapters.scrape.targets import Discovery, HttpSdTargets, Shard
from core.settings import Settings

__all__ = ["add_parser", "measure", "run_scrape_scale"]

EPOCH_MS = 1_700_000_000_000


def _serve(targets: int, zones: tuple[str, ...], served: str, qps: float, interval_s: float, conn: Any) -> None:
    """The child: ``targets`` engines and their discovery; each SD read is one interval of traffic."""
    from aiohttp import web

    from sim.engine_metrics import FleetMetrics
    from sim.engine_server import EngineServer

    rng = np.random.default_rng(7)
    metrics = FleetMetrics(served, epoch_ms0=EPOCH_MS)
    nodes = [(f"r{i}", zones[i % len(zones)]) for i in range(targets)]
    clock = {"ms": EPOCH_MS}

    def advance() -> None:
        clock["ms"] += int(interval_s * 1000)
        gpus = []
        for node, zone in nodes:
            for _ in range(int(rng.poisson(qps * interval_s))):
                out = int(rng.integers(16, 512))
                ttft, itl = float(rng.lognormal(5.5, 0.6)), float(rng.lognormal(3.2, 0.4))
                rec = {"node": node, "zone": zone, "ts_ms": clock["ms"], "ttft_ms": ttft, "itl_ms": itl}
                rec |= {"e2e_ms": ttft + itl * out, "queue_ms": ttft / 4, "output_tokens": out}
                rec |= {"prompt_tokens": int(rng.integers(64, 2048)), "status": "ok"}
                metrics.observe(rec)
            used = int(rng.integers(0, 4096))
            gpus.append(
                {"node": node, "zone": zone, "ts_ms": clock["ms"], "state": "ready", "running": 8, "queue_len": 1}
                | {"kv_blocks_total": 4096, "kv_blocks_used": used}
            )
        metrics.update(gpus)

    class Server(EngineServer):
        async def _sd(self, request: web.Request) -> web.Response:
            advance()
            return await super()._sd(request)

    async def main() -> None:
        advance()  # every replica serving from the start
        server = Server(metrics)
        await server.start()
        conn.send((server.sd_url, len(metrics.render(nodes[0][0]))))
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # until the bench is done
        await server.stop()

    asyncio.run(main())


class _CountingKafka:
    """Stands in for AIOKafkaProducer: counts what would be sent."""

    def __init__(self) -> None:
        self.messages, self.bytes = 0, 0

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.messages += 1
        self.bytes += len(value)

    async def flush(self) -> None:
        return None


def measure(settings: Settings, *, targets: int, rounds: int, interval_s: float, qps: float) -> dict[str, Any]:
    """Serve ``targets`` engines in a child, run ``rounds`` adapter rounds here; the figures per round."""
    served = settings.models[0].name
    settings = dataclasses.replace(settings, scrape_max_targets=max(targets, settings.scrape_max_targets))
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_serve, args=(targets, settings.zones, served, qps, interval_s, there), daemon=True)
    child.start()
    try:
        if not here.poll(120):
            raise RuntimeError("the target server did not start in 120 s")
        sd_url, page_bytes = here.recv()
        out = asyncio.run(_rounds(settings, sd_url, rounds, interval_s))
        return out | {"targets_served": targets, "page_bytes": page_bytes}
    finally:
        here.send("stop")
        child.join(timeout=30)
        if child.is_alive():
            child.kill()


async def _rounds(settings: Settings, sd_url: str, rounds: int, interval_s: float) -> dict[str, Any]:
    shard = Shard.from_settings(settings)
    scraper = Scraper(settings, [], settings.scrape_engine)
    discovery = Discovery([HttpSdTargets(sd_url)], settings.zones, settings.scrape_max_targets, shard)
    collector = EndpointCollector(scraper, discovery, timeout_s=max(1.0, min(10.0, interval_s)))
    step_cpu = [0.0]
    step = scraper.step

    def timed_step(texts: dict[str, str | BaseException], now_ms: int) -> list[dict[str, Any]]:
        t0 = time.process_time()
        try:
            return step(texts, now_ms)
        finally:
            step_cpu[0] += time.process_time() - t0

    scraper.step = timed_step  # type: ignore[method-assign]
    producer = TelemetryProducer("unused:9092", settings.topic("telemetry"), source="bench-scrape-scale")
    kafka = _CountingKafka()
    producer._producer = kafka
    per_round: list[dict[str, float]] = []
    for _ in range(rounds + 1):  # the first: baselines
        step_cpu[0] = 0.0
        w0, c0, m0 = time.perf_counter(), time.process_time(), kafka.bytes
        records = await scrape_loop(collector, producer, interval_s, scrapes=1)
        per_round.append(
            {
                "wall_s": time.perf_counter() - w0,
                "cpu_s": time.process_time() - c0,
                "step_cpu_s": step_cpu[0],
                "records": records,
                "bytes": kafka.bytes - m0,
            }
        )
    steady = per_round[1:]
    cpu = statistics.median(r["cpu_s"] for r in steady)
    wall = statistics.median(r["wall_s"] for r in steady)
    n = len(scraper.endpoints)
    return {
        "shard": str(shard),
        "targets": n,
        "interval_s": interval_s,
        "rounds": len(steady),
        "baseline_round": per_round[0],
        "per_round": steady,
        "round_wall_s_p50": wall,
        "round_wall_s_max": max(r["wall_s"] for r in steady),
        "round_cpu_s_p50": cpu,
        "step_share_of_cpu": statistics.median(r["step_cpu_s"] / r["cpu_s"] for r in steady if r["cpu_s"] > 0),
        "cpu_share_of_interval": cpu / interval_s,
        "wall_share_of_interval": wall / interval_s,
        "records_per_round_p50": statistics.median(r["records"] for r in steady),
        "cpu_ms_per_target": 1000.0 * cpu / max(1, n),
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    }


def render(r: dict[str, Any], headroom: float) -> str:
    cpu_bound = r["targets"] * r["interval_s"] * (1.0 - headroom) / max(r["round_cpu_s_p50"], 1e-9)
    wall_bound = r["targets"] * r["interval_s"] * (1.0 - headroom) / max(r["round_wall_s_p50"], 1e-9)
    lines = [
        f"one adapter ({r['shard']}), {r['targets']} targets, {r['rounds']} rounds after the baseline, "
        f"{r['records_per_round_p50']:.0f} records a round, pages of {r['page_bytes'] / 1024:.1f} KiB",
        f"  round wall      p50 {r['round_wall_s_p50']:.2f} s, max {r['round_wall_s_max']:.2f} s "
        f"= {r['wall_share_of_interval']:.2f} of a {r['interval_s']:g} s interval",
        f"  round CPU       p50 {r['round_cpu_s_p50']:.2f} s = {r['cpu_share_of_interval']:.2f} of one core "
        f"over the interval; {r['cpu_ms_per_target']:.2f} ms a target; parse+deltas (Scraper.step) "
        f"{r['step_share_of_cpu']:.2f} of it, the rest GETs, discovery and the producer",
        f"  targets per adapter at {r['interval_s']:g} s, {headroom:.0%} left free: "
        f"{cpu_bound:.0f} (CPU), {wall_bound:.0f} (wall); RSS {r['rss_mb']:.0f} MB",
    ]
    return "\n".join(lines)


def add_parser(bsub: Any) -> None:
    help_ = "one scrape adapter over 1,000 simulated engines: round time, CPU, targets per adapter"
    p = bsub.add_parser("scrape-scale", help=help_)
    p.add_argument("--targets", type=int, default=1000, help="simulated engines served (one port each)")
    p.add_argument("--rounds", type=int, default=4, help="rounds measured after the baseline round")
    p.add_argument("--interval-s", type=float, default=5.0, help="the scrape interval the targets are sized for")
    p.add_argument("--qps-per-target", type=float, default=2.0, help="mean requests/s each engine finishes")
    p.add_argument("--headroom", type=float, default=0.5, help="share of a core (and an interval) left free")
    p.add_argument("--shard", default=None, help="i/n: this adapter's share (default GOVERNOR_SCRAPE_SHARD)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run_scrape_scale(args: argparse.Namespace) -> int:
    logging.getLogger("adapters.scrape").setLevel(logging.WARNING)  # one line per delta otherwise
    settings = Settings.from_env(os.environ)
    if args.shard is not None:
        settings = dataclasses.replace(settings, scrape_shard=args.shard)
    if args.targets < 1 or args.rounds < 1 or not args.interval_s > 0 or not 0 <= args.headroom < 1:
        print("governor bench scrape-scale: need --targets >= 1, --rounds >= 1, --interval-s > 0, 0 <= --headroom < 1")
        return 2
    result = measure(
        settings, targets=args.targets, rounds=args.rounds, interval_s=args.interval_s, qps=args.qps_per_target
    )
    print(json.dumps(result, indent=2) if args.json else render(result, args.headroom))
    return 0
