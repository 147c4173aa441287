"""``governor fleet``: a simulated inference fleet replaying a real trace in
real time against a running stack (Kafka telemetry out, desired replicas from
Redis in) -- the docker-compose stack's stand-in for GPU nodes."""

from __future__ import annotations

import asyncio
import logging
from argparse import Namespace
from typing import Any

import redis.asyncio as aioredis
from governor_telemetry.producer import TelemetryProducer

from core import names
from core.clock import ScaledClock
from core.settings import Settings
from core.transport import redis_options
from launch.topics import ensure_topics
from sim.fleet import Fleet, FleetConfig
from sim.live import LiveFleet
from sim.perf_model import PerfModel
from sim.traces import load_trace
from sim.workloads import from_trace

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    """``governor fleet`` and its flags."""
    f = sub.add_parser("fleet", help="run a simulated fleet that replays a trace (live)")
    f.add_argument("--trace", default="azure-conv")
    f.add_argument("--qps", type=float, default=40.0)
    f.add_argument("--duration-s", type=float, default=3600.0)
    f.add_argument("--replicas", type=int, default=4)
    f.add_argument("--startup-s", type=float, default=30.0)
    f.add_argument("--seed", type=int, default=7)


def main(settings: Settings, args: Namespace) -> int:
    """``governor fleet``."""
    return asyncio.run(run_fleet(settings, args))


async def run_fleet(settings: Settings, args: Namespace) -> int:
    clock = ScaledClock(settings.clock_speed, settings.clock_origin_s)
    model = settings.models[0].name
    await ensure_topics(settings)
    redis = aioredis.Redis.from_url(str(settings.redis_url), **redis_options(settings))
    try:
        for zone in settings.zones:
            await redis.hsetnx(names.desired_replicas(settings.topic_prefix, zone), model, args.replicas)
        t0_ms = clock.now_ms()
        fleet = Fleet(
            FleetConfig(
                models={model: PerfModel.from_splitwise(model=model)},
                zones=tuple(settings.zones),
                startup_s=args.startup_s,
                initial_replicas=args.replicas,
                seed=args.seed,
            ),
            epoch_ms0=t0_ms,
        )
        workload = from_trace(load_trace(args.trace), args.qps, args.duration_s)
        log.info(
            "fleet: %d requests of %s over %.0f s in zones %s",
            len(workload),
            args.trace,
            args.duration_s,
            ",".join(settings.zones),
        )
        async with TelemetryProducer(
            settings.kafka_bootstrap,
            settings.topic("telemetry"),
            source="sim-fleet",
            clock_ms=clock.now_ms,
            encoding=settings.telemetry_encoding,
        ) as producer:
            live = LiveFleet.on_stack(fleet, workload, settings, producer, redis, clock, t0_ms, seed=args.seed)
            stats = await live.run(args.duration_s)
        log.info("fleet done: %d submitted, %d finished", stats.submitted, len(stats.finished))
    finally:
        await redis.aclose()
    return 0
