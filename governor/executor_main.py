"""``governor executor --zone Z``: one zone's executor process.

It never exits for Kafka or Redis trouble (down at start, lost, restarted
with or without its data): :mod:`executors.loop` retries with capped backoff,
one log line per attempt with the next delay.  ``/healthz`` (200 while alive)
and ``/readyz`` (200 once Kafka and Redis answer, else 503 with the reason)
are served with ``/metrics`` on GOVERNOR_METRICS_PORT (:mod:`streams.health`).  It
writes its heartbeat key every ``GOVERNOR_HEARTBEAT_S`` and ends a command
entry delivered more than ``GOVERNOR_MAX_DELIVERIES`` times as failed
(:mod:`executors.executor`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer

from core.clock import ScaledClock
from core.settings import Settings
from core.transport import kafka_options, redis_options
from executors.backends import Backend, FleetBudget
from executors.chain import REGISTRY, BackendContext, build_backend, close_backend, with_budget
from executors.executor import ZoneExecutor
from executors.guard import CommandGuard
from executors.loop import retry_until_ok, sleep_or_stop
from executors.metrics import ExecutorMetrics
from executors.platform import PlatformReporter, replica_source
from launch.processes import EXECUTOR_READY, ready_log
from streams.health import Readiness, build_info, serve

log = logging.getLogger(__name__)

# RTT / clock-offset probes (executors/timing.py); the zone's RTT factor is learned
# from observed bridge -> executor delays (ZoneExecutor(rtt_factor=...) pins one).
PROBE_INTERVAL_S = 5.0
WATCH_S = 5.0  # seconds between the Redis PINGs behind /readyz


def make_backend(
    name: str,
    redis: aioredis.Redis,
    prefix: str,
    zone: str,
    webhook_url: str = "",
    budget: FleetBudget | None = None,
    settings: Settings | None = None,
) -> Backend:
    """The backend ``--backend name`` selects alone (executors/chain.py's registry; executors/backends.py
    has each contract)."""
    if name not in REGISTRY:
        raise ValueError(f"unknown backend {name!r}")
    ctx = BackendContext(redis, prefix, zone, settings or Settings(), webhook_url, budget)
    return with_budget(REGISTRY[name](ctx), ctx)


def add_parser(sub: Any) -> None:
    """``governor executor`` and its flags."""
    e = sub.add_parser("executor", help="run one zone's command executor")
    e.add_argument("--zone", required=True)
    e.add_argument(
        "--backend",
        choices=list(REGISTRY),
        default=None,
        help="every kind to one backend (default sim; GOVERNOR_EXECUTOR_BACKENDS chains them per kind): sim: the "
        "simulated fleet; dry-run: log only; routing: route/breaker/canary/agents into the gateway's Redis hashes "
        "(others fail); webhook: POST every command, signed, to GOVERNOR_WEBHOOK_URL",
    )
    e.add_argument("--webhook-url", default="", help="URL the webhook POSTs to (wins over GOVERNOR_WEBHOOK_URL)")


def main(settings: Settings, args: argparse.Namespace) -> int:
    """``governor executor --zone Z``: a zone outside GOVERNOR_ZONES is a usage error."""
    if args.zone not in settings.zones:
        print(f"governor: zone {args.zone!r} not in GOVERNOR_ZONES {settings.zones}", file=sys.stderr)
        return 2
    return asyncio.run(run_executor(settings, args.zone, args.backend, args.webhook_url))


async def run_executor(settings: Settings, zone: str, backend_name: str | None, webhook_url: str = "") -> int:
    """Run zone ``zone``'s executor until SIGINT/SIGTERM; its backend is GOVERNOR_EXECUTOR_BACKENDS (a chain per
    command kind) or ``backend_name`` (every kind, default sim).  A bad backend setting is a SettingsError
    before anything starts."""
    redis = aioredis.Redis.from_url(
        str(settings.redis_url), socket_timeout=10.0, socket_connect_timeout=5.0, **redis_options(settings)
    )
    ctx = BackendContext(redis, settings.topic_prefix, zone, settings, webhook_url, FleetBudget.from_settings(settings))
    try:
        backend = build_backend(ctx, backend_name)
    except BaseException:
        await redis.aclose()
        raise
    try:
        return await _run(settings, zone, redis, backend)
    finally:
        await close_backend(backend)
        await redis.aclose()


async def _run(settings: Settings, zone: str, redis: aioredis.Redis, backend: Backend) -> int:
    # /healthz answers from the start; /readyz says 503 (with the reason) until Kafka and Redis answer.
    readiness = Readiness(("kafka", "redis"))
    metrics = ExecutorMetrics()
    build_info(metrics.registry)  # governor_build_info{version,python} 1
    serve(metrics.registry, settings.metrics_port, settings.metrics_addr, readiness)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    producer = await _connect_kafka(settings, zone, readiness, stopping)
    if producer is None:  # stopped before Kafka answered
        return 0
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
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, executor.stop)
    if stopping.is_set():
        executor.stop()
    watch = asyncio.create_task(_watch_redis(redis, readiness, executor.stopping))
    source = replica_source(backend)  # replica truth from the platform (k8s backend): executors/platform.py
    reporter = (
        None
        if source is None
        else PlatformReporter(
            source,
            redis,
            settings.topic_prefix,
            zone,
            [m.name for m in settings.models],
            executor.clock.now_ms,
            settings.platform_replicas_s,
        )
    )
    if reporter is not None:
        watch_platform = asyncio.create_task(reporter.run(executor.stopping))
    try:
        # Redis down at start is waited for (capped backoff, one line per attempt), never a reason to exit.
        group = _checked(executor.ensure_group, readiness, "redis")
        if await retry_until_ok(group, f"executor {zone}: redis {_where(settings)}", executor.stopping):
            ready_log().info("%s: zone %s, backend %s", EXECUTOR_READY, zone, getattr(backend, "spec", backend.name))
            await executor.run()
    finally:
        executor.stop()
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        if reporter is not None:
            await asyncio.gather(watch_platform, return_exceptions=True)
        await producer.stop()
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


def _where(settings: Settings) -> str:
    """REDIS_URL's host:port (never its password)."""
    url = urlsplit(str(settings.redis_url))
    return f"{url.hostname}:{url.port or 6379}" if url.hostname else url.scheme


def _checked(step: Callable[[], Awaitable[None]], readiness: Readiness, name: str) -> Callable[[], Awaitable[None]]:
    """``step``, marking the readiness check ``name`` ok when it works and failing (with why) when not."""

    async def run() -> None:
        try:
            await step()
        except Exception as exc:
            readiness.fail(name, f"{type(exc).__name__}: {exc}")
            raise
        readiness.ok(name)

    return run


async def _connect_kafka(
    settings: Settings, zone: str, readiness: Readiness, stopping: asyncio.Event
) -> AIOKafkaProducer | None:
    """A started results producer; retried with capped backoff (one line per attempt) until
    KAFKA_BOOTSTRAP answers, or None when the process is stopped first."""
    started: list[AIOKafkaProducer] = []

    async def start() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=settings.kafka_bootstrap, acks=1, linger_ms=5, **kafka_options(settings)
        )
        try:
            await producer.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await producer.stop()
            raise
        started.append(producer)

    aiokafka_log = logging.getLogger("aiokafka")
    level = aiokafka_log.level
    aiokafka_log.setLevel(logging.CRITICAL)  # its per-connection errors: our retry line says it once
    try:
        what = f"executor {zone}: kafka {settings.kafka_bootstrap} (KAFKA_BOOTSTRAP)"
        ok = await retry_until_ok(_checked(start, readiness, "kafka"), what, stopping)
    finally:
        aiokafka_log.setLevel(level)
    return started[0] if ok else None


async def _watch_redis(redis: aioredis.Redis, readiness: Readiness, stopping: asyncio.Event) -> None:
    """Keep the ``redis`` readiness check current (a PING every WATCH_S)."""
    while not stopping.is_set():
        await sleep_or_stop(stopping, WATCH_S)
        try:
            await redis.ping()
        except Exception as exc:  # noqa: BLE001 - reported by /readyz
            readiness.fail("redis", f"{type(exc).__name__}: {exc}")
        else:
            readiness.ok("redis")
