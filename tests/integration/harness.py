"""A real worker process and one in-process executor per zone, for the loop tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer

from core.clock import ScaledClock
from core.settings import ModelSpec, Settings
from executors.backends import SimFleetBackend
from executors.executor import ZoneExecutor
from executors.guard import CommandGuard
from launch.processes import WORKER_READY, start_worker
from launch.topics import ensure_topics
from loop.commands import Command


def with_models(settings: Settings, *models: str | ModelSpec) -> Settings:
    """``settings`` whose GOVERNOR_MODELS also has ``models`` (names get default specs)."""
    specs = [m if isinstance(m, ModelSpec) else ModelSpec(m) for m in models]
    names = {s.name for s in specs}
    return settings.replace(models=(*(m for m in settings.models if m.name not in names), *specs))


def guard(settings: Settings, *models: str | ModelSpec) -> CommandGuard:
    """The executor's guard for ``settings`` (the suite's signing key), ``models`` added to GOVERNOR_MODELS."""
    return CommandGuard.from_settings(with_models(settings, *models))


def sign(settings: Settings, cmd: Command) -> Command:
    """``cmd`` signed with the suite's key, as the bridge signs it (after any HLC stamp)."""
    ring = settings.keyring()
    assert ring is not None, "the test servers fixture sets GOVERNOR_COMMAND_KEYS"
    return cmd.signed(ring)


def signed(settings: Settings, cmd: Command) -> bytes:
    """The stream-entry bytes of ``cmd`` signed with the suite's key."""
    return sign(settings, cmd).encode()


async def read_snapshot(redis: aioredis.Redis, settings: Settings, model: str) -> dict[str, Any] | None:
    """The parts of the worker's sealed snapshot of ``model`` (None while there is none), opened as the worker does."""
    from core import names
    from streams.snapshots import open_snapshot

    ring = settings.keyring()
    assert ring is not None, "the test servers fixture sets GOVERNOR_COMMAND_KEYS"
    key, scope = names.snapshot(settings.topic_prefix, f"model:{model}"), f"model:{model}"
    blob = await redis.get(key)
    if not isinstance(blob, bytes) or not blob:
        return None
    opened = open_snapshot(
        ring, key, scope, blob, ScaledClock(settings.clock_speed, settings.clock_origin_s).now_ms(), 3_600_000
    )
    assert opened.parts is not None, (opened.reason, opened.detail)
    return opened.parts


@asynccontextmanager
async def worker_and_executors(
    settings: Settings, tmp_path: Path
) -> AsyncIterator[tuple[Any, aioredis.Redis, list[ZoneExecutor]]]:
    """Topics created, the worker started and ready, a sim-backend executor per zone with its group."""
    await ensure_topics(settings)
    worker = start_worker(settings, tmp_path)
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    executors = [
        ZoneExecutor(
            zone=z,
            prefix=settings.topic_prefix,
            redis=redis,
            backend=SimFleetBackend(redis, settings.topic_prefix, z),
            guard=CommandGuard.from_settings(settings),
            clock=ScaledClock(),
            results=None,
            results_topic="x",
            block_ms=50,
            probe_interval_s=0,
        )
        for z in settings.zones
    ]
    try:
        await asyncio.to_thread(worker.wait_for_log, WORKER_READY, 45)
        for ex in executors:
            await ex.ensure_group()
        yield worker, redis, executors
    finally:
        worker.stop()
        await redis.aclose()


async def field_in_every_zone(
    redis: aioredis.Redis,
    executors: list[ZoneExecutor],
    key_of: Callable[[str], str],
    field: str,
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """Poll the executors until ``field`` of the hash ``key_of(zone)`` exists for every zone
    (or the timeout passes); returns the JSON values found, by zone."""
    found: dict[str, Any] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and len(found) < len(executors):
        for ex in executors:
            await ex.poll_once()
            raw = await redis.hget(key_of(ex.zone), field)
            if raw is not None:
                found[ex.zone] = orjson.loads(raw)
        await asyncio.sleep(0.1)
    return found


async def consume(
    settings: Settings, topics: list[str], until: Callable[[dict[str, list[Any]]], bool], timeout_s: float
) -> dict[str, list[Any]]:
    """The JSON messages of ``topics`` (short names) from the start, until ``until(seen)`` or the timeout."""
    consumer = AIOKafkaConsumer(
        *[settings.topic(t) for t in topics],
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
    )
    await consumer.start()
    seen: dict[str, list[Any]] = {t: [] for t in topics}
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not until(seen):
            for tp, msgs in (await consumer.getmany(timeout_ms=200)).items():
                seen[tp.topic.split(".", 1)[1]] += [orjson.loads(m.value) for m in msgs]
    finally:
        await consumer.stop()
    return seen
