"""``governor executor --zone Z``: one zone's executor process.

It never exits for Redis trouble (down at start, lost, restarted with or
without its data): :mod:`executors.loop` retries with capped backoff.  It
writes its heartbeat key every ``GOVERNOR_HEARTBEAT_S`` and ends a command
entry delivered more than ``GOVERNOR_MAX_DELIVERIES`` times as failed
(:mod:`executors.executor`).
"""

from __future__ import annotations

import asyncio
import logging
import signal

import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer

from core.clock import ScaledClock
from core.settings import Settings
from core.transport import kafka_options, redis_options
from executors.backends import (
    Backend,
    DryRunBackend,
    FleetBudget,
    RoutingBackend,
    SimFleetBackend,
    WebhookBackend,
)
from executors.executor import ZoneExecutor
from executors.guard import CommandGuard
from executors.loop import retry_until_ok
from governor.processes import EXECUTOR_READY
from streams.metrics_export import ExecutorMetrics

log = logging.getLogger(__name__)

# RTT / clock-offset probes (executors/timing.py); the zone's RTT factor is learned
# from observed bridge -> executor delays (ZoneExecutor(rtt_factor=...) pins one).
PROBE_INTERVAL_S = 5.0


def make_backend(
    name: str,
    redis: aioredis.Redis,
    prefix: str,
    zone: str,
    webhook_url: str = "",
    budget: FleetBudget | None = None,
) -> Backend:
    """The backend ``--backend name`` selects (see executors/backends.py for each contract)."""
    if name == "sim":
        return SimFleetBackend(redis, prefix, zone, budget)
    if name == "dry-run":
        return DryRunBackend()
    if name == "routing":
        return RoutingBackend(redis, prefix)
    if name == "webhook":
        return WebhookBackend(webhook_url)
    raise ValueError(f"unknown backend {name!r}")


async def run_executor(settings: Settings, zone: str, backend_name: str, webhook_url: str = "") -> int:
    redis = aioredis.Redis.from_url(
        str(settings.redis_url), socket_timeout=10.0, socket_connect_timeout=5.0, **redis_options(settings)
    )
    backend = make_backend(
        backend_name, redis, settings.topic_prefix, zone, webhook_url, FleetBudget.from_settings(settings)
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap, acks=1, linger_ms=5, **kafka_options(settings)
    )
    await producer.start()
    metrics = ExecutorMetrics()
    metrics.serve(settings.metrics_port, settings.metrics_addr)
    executor = ZoneExecutor(
        zone=zone,
        prefix=settings.topic_prefix,
        redis=redis,
        backend=backend,
        guard=CommandGuard.from_settings(settings),
        clock=ScaledClock(settings.clock_speed, settings.clock_origin_s),
        results=producer,
        results_topic=settings.topic("results"),
        metrics=metrics,
        probe_interval_s=PROBE_INTERVAL_S,
        max_deliveries=settings.max_deliveries,
        heartbeat_s=settings.heartbeat_s,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, executor.stop)
    try:
        # Redis down at start is waited for (capped backoff), never a reason to exit.
        if await retry_until_ok(executor.ensure_group, f"executor {zone}: group", executor.stopping):
            log.info("%s: zone %s, backend %s", EXECUTOR_READY, zone, backend.name)
            await executor.run()
    finally:
        await producer.stop()
        await redis.aclose()
    t = executor.timing
    log.info(
        "executor %s stopped: %s; rtt base %.2f ms x factor %.2f, clock offset %.2f ms (+/- %.2f)",
        zone,
        executor.stats.outcomes,
        t.rtt.base_ms(zone),
        t.rtt.factor(zone),
        t.offset_ms(),
        t.offset.error_bound_ms(),
    )
    return 0
