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

from core.clock import ScaledClock
from core.settings import Settings
from executors.backends import SimFleetBackend
from executors.executor import ZoneExecutor
from governor.processes import WORKER_READY, start_worker
from governor.topics import ensure_topics


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
