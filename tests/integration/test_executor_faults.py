"""Faults that must not stop or blind a zone executor, on the real redis-server (and Kafka):

* a poison entry (a float ``basis_ms``) and a non-int value already stored in ``last_basis``,
  then a good command that applies;
* an entry over 1 MiB: acked, its result capped and accepted by the real broker; a result the
  broker refuses as too large is dropped, counted and acked, not retried forever;
* an entry whose processing keeps failing ends as ``failed`` (``delivery limit``) after N deliveries;
* ``NOGROUP`` after the stream is deleted, and a Redis restart without data on a private
  redis-server: the executor re-creates its group and consumes new commands;
* the heartbeat key exists with a TTL while the executor runs and is gone after it stops.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError
from redis.exceptions import ConnectionError as RedisConnectionError

from core import names
from core.clock import ScaledClock
from core.settings import Settings
from executors.backends import BackendUnavailable, DryRunBackend
from executors.entry import ECHO_CAP
from executors.executor import GROUP, ZoneExecutor
from launch.embedded import free_port, redis_answers, redis_binary
from launch.topics import ensure_topics
from loop.commands import Command
from tests.integration.harness import guard, signed
from tests.integration.test_executor import _results, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

ZONE, MODEL = "az-a", "m"


def _scale(target: int, basis_ms: int | None = None) -> Command:
    now = int(time.time() * 1000)
    return Command(
        kind="scale",
        zone=ZONE,
        model=MODEL,
        target_replicas=target,
        reason="faults",
        issued_at_ms=now,
        expires_at_ms=now + 30_000,
        basis_ms=now if basis_ms is None else basis_ms,
    )


class _Results:
    """The results producer's interface; ``refuse`` makes every send fail as too large."""

    def __init__(self, refuse: bool = False) -> None:
        self.sent: list[dict[str, Any]] = []
        self.refuse = refuse
        self.attempts = 0

    async def send_and_wait(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.attempts += 1
        if self.refuse:
            raise MessageSizeTooLargeError("The message is 1048600 bytes when serialized")
        self.sent.append(orjson.loads(value))


class _Down(DryRunBackend):
    """A backend whose fleet API never answers."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def apply(self, cmd: Command) -> dict[str, Any]:
        self.calls += 1
        raise BackendUnavailable("fleet API down")


def _executor(settings: Settings, redis: aioredis.Redis, results: Any, backend: Any = None, **kw: Any) -> ZoneExecutor:
    return ZoneExecutor(
        zone=ZONE,
        prefix=settings.topic_prefix,
        redis=redis,
        backend=backend or DryRunBackend(),
        guard=guard(settings, MODEL),
        clock=ScaledClock(),
        results=results,
        results_topic=settings.topic("results"),
        block_ms=20,
        probe_interval_s=0,
        **kw,
    )


async def _pending(redis: aioredis.Redis, stream: str) -> int:
    return int((await redis.xpending(stream, GROUP))["pending"])


async def test_a_float_basis_poison_entry_then_a_good_command_applies(settings: Settings) -> None:
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    results = _Results()
    ex = _executor(settings, redis, results)
    stream = names.command_stream(settings.topic_prefix, ZONE)
    basis_key = names.executor_last_basis(settings.topic_prefix, ZONE)
    try:
        await ex.ensure_group()
        good = _scale(7)
        poison = orjson.loads(good.encode())
        poison["basis_ms"] = float(good.basis_ms) + 0.5  # a float where an int belongs
        poison["key_id"] = ex.guard.keyring.active  # a key id of the ring: past the bulk refusal, to the decoder
        await redis.xadd(stream, {"cmd": orjson.dumps(poison)})
        # What an older executor stored from such an entry: must count as absent, not crash.
        await redis.hset(basis_key, MODEL, str(float(good.basis_ms) + 0.5))
        await redis.xadd(stream, {"cmd": signed(settings, good)})
        assert await ex.poll_once() == 2
        assert [r["outcome"] for r in results.sent] == ["rejected", "applied"], results.sent
        assert "basis_ms must be an int" in results.sent[0]["reason"]
        assert await redis.hget(basis_key, MODEL) == str(good.basis_ms).encode()  # an int again
        # and the next command for the model is judged against it, not crashed on it
        await redis.xadd(stream, {"cmd": signed(settings, _scale(3, basis_ms=good.basis_ms - 1))})
        await ex.poll_once()
        assert results.sent[-1]["outcome"] == "stale" and await _pending(redis, stream) == 0
    finally:
        await redis.aclose()


async def test_an_entry_over_1_mib_is_acked_with_a_capped_result(settings: Settings) -> None:
    await ensure_topics(settings)
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    await producer.start()
    ex = _executor(settings, redis, producer)
    stream = names.command_stream(settings.topic_prefix, ZONE)
    try:
        await ex.ensure_group()
        obj = orjson.loads(_scale(2).encode())
        obj["bogus"] = "x" * (1536 * 1024)  # 1.5 MiB, malformed (unknown field)
        obj["key_id"] = ex.guard.keyring.active  # a key id of the ring: its own result (executors.intake)
        await redis.xadd(stream, {"cmd": orjson.dumps(obj)})
        assert await asyncio.wait_for(ex.poll_once(), 10) == 1
        (res,) = await _results(settings, 1, timeout_s=10)
        assert res["outcome"] == "rejected"
        assert ECHO_CAP <= len(res["detail"]["raw"]) < ECHO_CAP + 64 and "[truncated" in res["detail"]["raw"]
        assert await _pending(redis, stream) == 0
    finally:
        await producer.stop()
        await redis.aclose()


async def test_a_result_the_broker_refuses_as_too_large_is_dropped_counted_and_acked(settings: Settings) -> None:
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    results = _Results(refuse=True)
    ex = _executor(settings, redis, results)
    stream = names.command_stream(settings.topic_prefix, ZONE)
    try:
        await ex.ensure_group()
        await redis.xadd(stream, {"cmd": signed(settings, _scale(4))})
        assert await asyncio.wait_for(ex.poll_once(), 5) == 1
        assert results.attempts == 1  # dropped at the first refusal: not retried with backoff
        assert await _pending(redis, stream) == 0
        assert ex.publisher.dropped.labels(ZONE, "too large")._value.get() == 1
    finally:
        await redis.aclose()


async def test_an_entry_that_keeps_failing_ends_at_the_delivery_limit(settings: Settings) -> None:
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    results, backend = _Results(), _Down()
    ex = _executor(settings, redis, results, backend, retry_idle_ms=0, max_deliveries=3)
    stream = names.command_stream(settings.topic_prefix, ZONE)
    try:
        await ex.ensure_group()
        cmd = _scale(5)
        # First delivered to a consumer that died without acking it (delivery 1) ...
        await redis.xadd(stream, {"cmd": signed(settings, cmd)})
        await redis.xreadgroup(GROUP, "dead-consumer", {stream: ">"}, count=1)
        # ... then claimed by this executor (2, 3), whose backend is down, until the limit (4 > 3).

        async def ended() -> bool:
            await ex.poll_once()
            return len(results.sent) >= 1

        assert await wait_for(ended, 10)
        (res,) = results.sent
        assert res["outcome"] == "failed" and res["reason"] == "delivery limit", res
        assert res["detail"]["deliveries"] == 4 and res["detail"]["max_deliveries"] == 3
        assert backend.calls == 2 and await _pending(redis, stream) == 0
    finally:
        await redis.aclose()


async def test_nogroup_after_the_stream_is_deleted_and_consuming_goes_on(settings: Settings) -> None:
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    results = _Results()
    ex = _executor(settings, redis, results)
    stream = names.command_stream(settings.topic_prefix, ZONE)
    task = asyncio.create_task(ex.run())
    try:
        await redis.xadd(stream, {"cmd": signed(settings, _scale(2))})
        assert await wait_for(lambda: len(results.sent) == 1, 10)
        await redis.delete(stream)  # group gone: the next XREADGROUP says NOGROUP
        await asyncio.sleep(0.1)
        await redis.xadd(stream, {"cmd": signed(settings, _scale(3))})  # the bridge re-creates the stream
        assert await wait_for(lambda: len(results.sent) == 2, 10), results.sent
        assert [r["outcome"] for r in results.sent] == ["applied", "applied"] and not task.done()
    finally:
        ex.stop()
        await asyncio.wait_for(task, 5)
        await redis.aclose()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """A redis-server of the test's own (no persistence), and a function that restarts it empty."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    argv = [str(redis_binary()), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    argv += ["--dir", str(tmp_path)]
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 10
        while not redis_answers(url):
            assert time.monotonic() < deadline, "private redis-server did not answer"
            time.sleep(0.05)

    def restart() -> None:
        procs[-1].terminate()
        procs[-1].wait(5)
        time.sleep(0.5)  # the executor meets a dead server for a while
        start()

    start()
    try:
        yield url, restart
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(5)


async def test_a_redis_restart_without_data_is_survived(settings: Settings, private_redis: tuple[str, Any]) -> None:
    url, restart = private_redis
    redis = aioredis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=1)
    results = _Results()
    ex = _executor(settings, redis, results, heartbeat_s=0.2)
    stream = names.command_stream(settings.topic_prefix, ZONE)
    task = asyncio.create_task(ex.run())
    try:
        await redis.xadd(stream, {"cmd": signed(settings, _scale(2))})
        assert await wait_for(lambda: len(results.sent) == 1, 10)
        await asyncio.to_thread(restart)  # every key, the stream and its group are gone
        assert not task.done()
        entry = {"cmd": signed(settings, _scale(3))}

        async def added() -> bool:  # the test's own connection died with the server too
            try:
                return bool(await redis.xadd(stream, entry))  # type: ignore[arg-type]
            except (RedisConnectionError, OSError):
                return False

        assert await wait_for(added, 5)
        assert await wait_for(lambda: len(results.sent) == 2, 15), results.sent
        assert [r["outcome"] for r in results.sent] == ["applied", "applied"]
        assert await wait_for(lambda: _exists(redis, names.executor_heartbeat(settings.topic_prefix, ZONE)), 5)
    finally:
        ex.stop()
        await asyncio.wait_for(task, 10)
        await redis.aclose()


async def test_the_heartbeat_key_lives_while_the_executor_runs(settings: Settings) -> None:
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    key = names.executor_heartbeat(settings.topic_prefix, ZONE)
    ex = _executor(settings, redis, _Results(), heartbeat_s=0.2)
    task = asyncio.create_task(ex.run())
    try:
        assert await wait_for(lambda: _exists(redis, key), 5)
        beat = orjson.loads(await _get(redis, key))
        assert beat["executor"] == ex.executor_id and beat["backend"] == "dry-run"
        assert abs(beat["ts_ms"] - time.time() * 1000) < 5_000
        assert 0 < await redis.pttl(key) <= 600  # TTL 3 x GOVERNOR_HEARTBEAT_S
        await asyncio.sleep(0.5)
        assert orjson.loads(await _get(redis, key))["ts_ms"] > beat["ts_ms"]  # refreshed
    finally:
        ex.stop()
        await asyncio.wait_for(task, 5)
    assert await wait_for(lambda: _gone(redis, key), 1)  # a clean stop expires it at once
    # An executor that dies without a clean stop: its last heartbeat expires with the TTL.
    dead = _executor(settings, redis, _Results(), heartbeat_s=0.1)
    assert await dead.heartbeat.beat()
    assert await redis.exists(key)
    assert await wait_for(lambda: _gone(redis, key), 2)
    await redis.aclose()


async def _gone(redis: aioredis.Redis, key: str) -> bool:
    return await redis.exists(key) == 0


async def _exists(redis: aioredis.Redis, key: str) -> bool:
    try:
        return await redis.exists(key) == 1
    except (RedisConnectionError, OSError):  # a pooled connection that died with a restarted server
        return False


async def _get(redis: aioredis.Redis, key: str) -> bytes:
    value = await redis.get(key)
    assert isinstance(value, bytes), value
    return value
