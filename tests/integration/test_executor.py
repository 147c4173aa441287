"""Zone executor against the real Redis and Kafka: once-only application."""
from __future__ import annotations

import asyncio
import time

import orjson
import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from executors.backends import BackendUnavailable, DryRunBackend, SimFleetBackend, desired_key
from executors.executor import ZoneExecutor
from governor.clock import ScaledClock
from governor.settings import Settings
from governor.topics import ensure_topics
from streams.commands import Command, stream_key

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _cmd(target: int, basis_ms: int, *, ttl_ms: int = 60_000, issued: int | None = None) -> Command:
    issued = issued if issued is not None else int(time.time() * 1000)
    return Command(kind="scale", zone="az-a", model="m", target_replicas=target, reason="test",
                   issued_at_ms=issued, expires_at_ms=issued + ttl_ms, basis_ms=basis_ms)


async def _results(settings: Settings, n: int, timeout_s: float = 20) -> list[dict]:
    consumer = AIOKafkaConsumer(settings.topic("results"), bootstrap_servers=settings.kafka_bootstrap,
                                group_id=None, auto_offset_reset="earliest", fetch_max_wait_ms=50)
    await consumer.start()
    out: list[dict] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(out) < n and time.monotonic() < deadline:
            for msgs in (await consumer.getmany(timeout_ms=200)).values():
                out += [orjson.loads(m.value) for m in msgs]
    finally:
        await consumer.stop()
    return out


async def _executor(settings: Settings, backend) -> tuple[ZoneExecutor, AIOKafkaProducer, aioredis.Redis]:  # type: ignore[no-untyped-def]
    await ensure_topics(settings)
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    await producer.start()
    ex = ZoneExecutor(zone="az-a", prefix=settings.topic_prefix, redis=redis, backend=backend,
                      clock=ScaledClock(), results=producer, results_topic=settings.topic("results"),
                      block_ms=50)
    await ex.ensure_group()
    return ex, producer, redis


async def test_same_command_delivered_twice_is_applied_once(settings: Settings) -> None:
    backend = DryRunBackend()
    ex, producer, redis = await _executor(settings, backend)
    try:
        cmd = _cmd(5, basis_ms=1_000)
        key = stream_key(settings.topic_prefix, "az-a")
        # At-least-once upstream: the bridge may write the same command twice.
        await redis.xadd(key, {"cmd": cmd.encode()})
        await redis.xadd(key, {"cmd": cmd.encode()})
        handled = 0
        for _ in range(10):
            handled += await ex.poll_once()
            if handled >= 2:
                break
        assert handled == 2
        assert [c.command_id for c in backend.applied] == [cmd.command_id]
        results = await _results(settings, 2)
        assert sorted(r["outcome"] for r in results) == ["applied", "duplicate"]
        assert {r["command_id"] for r in results} == {cmd.command_id}
        pending = await redis.xpending(key, "executors")
        assert pending["pending"] == 0  # both entries acknowledged
    finally:
        await producer.stop()
        await redis.aclose()


async def test_expired_and_stale_commands_are_refused(settings: Settings) -> None:
    backend = DryRunBackend()
    ex, producer, redis = await _executor(settings, backend)
    try:
        key = stream_key(settings.topic_prefix, "az-a")
        now = int(time.time() * 1000)
        newer, older = _cmd(6, basis_ms=20_000), _cmd(3, basis_ms=10_000)
        expired = _cmd(9, basis_ms=30_000, issued=now - 120_000, ttl_ms=60_000)
        for c in (newer, older, expired):
            await ex.handle(await redis.xadd(key, {"cmd": c.encode()}), {b"cmd": c.encode()})
        assert [c.target_replicas for c in backend.applied] == [6]
        outcomes = {r["command_id"]: r["outcome"] for r in await _results(settings, 3)}
        assert outcomes == {newer.command_id: "applied", older.command_id: "stale",
                            expired.command_id: "expired"}
    finally:
        await producer.stop()
        await redis.aclose()


async def test_malformed_entry_is_rejected_and_acknowledged(settings: Settings) -> None:
    ex, producer, redis = await _executor(settings, DryRunBackend())
    try:
        key = stream_key(settings.topic_prefix, "az-a")
        await redis.xadd(key, {"cmd": b'{"kind": "scale", "zone": "az-a"}'})
        assert await ex.poll_once() == 1
        (res,) = await _results(settings, 1)
        assert res["outcome"] == "rejected" and "missing" in res["reason"]
        assert (await redis.xpending(key, "executors"))["pending"] == 0
    finally:
        await producer.stop()
        await redis.aclose()


class _Flaky(SimFleetBackend):
    def __init__(self, *a, **k) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*a, **k)
        self.failures = 1

    async def apply(self, cmd: Command) -> dict:
        if self.failures:
            self.failures -= 1
            raise BackendUnavailable("simulated outage")
        return await super().apply(cmd)


async def test_temporary_backend_failure_is_retried_not_lost(settings: Settings) -> None:
    redis_probe = aioredis.Redis.from_url(str(settings.redis_url))
    backend = _Flaky(redis_probe, settings.topic_prefix, "az-a")
    ex, producer, redis = await _executor(settings, backend)
    ex.retry_idle_ms = 100
    try:
        cmd = _cmd(4, basis_ms=5_000)
        await redis.xadd(stream_key(settings.topic_prefix, "az-a"), {"cmd": cmd.encode()})
        assert await ex.poll_once() == 0  # backend down: left pending, not acknowledged
        await asyncio.sleep(0.2)
        assert await ex.poll_once() == 1  # claimed again after retry_idle_ms and applied
        assert int(await redis.hget(desired_key(settings.topic_prefix, "az-a"), "m")) == 4
        (res,) = await _results(settings, 1)
        assert res["outcome"] == "applied"
    finally:
        await producer.stop()
        await redis.aclose()
        await redis_probe.aclose()
