"""One zone executor, three backends (real Redis, Kafka and an aiohttp receiver): scale -> sim,
route -> routing, relocate -> webhook; a kind with no backend rejected; ``governor pause`` holds them all."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from aiohttp import web
from aiokafka import AIOKafkaProducer

from core import names
from core.clock import ScaledClock
from core.settings import Settings
from executors.chain import BackendContext, ChainBackend, build_backend, close_backend
from executors.executor import ZoneExecutor
from launch.topics import ensure_topics
from loop.commands import Command
from tests.integration.harness import guard, signed
from tests.integration.test_executor import _results

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SPEC = "scale=sim,route=routing,relocate=webhook"
KEY_HEX = "c3" * 32


def _cmd(kind: str, model: str = "m", basis_ms: int = 1_000, **kw: Any) -> Command:
    now = int(time.time() * 1000)
    return Command(
        kind=kind,
        zone="az-a",
        model=model,
        reason="test",
        issued_at_ms=now,
        expires_at_ms=now + 60_000,
        basis_ms=basis_ms,
        **kw,
    )


SCALE = _cmd("scale", target_replicas=7)
ROUTE = _cmd("route", payload={"weights": {"chat": {"m|az-a": 3.0, "m|az-b": 1.0}}})
RELOCATE = _cmd("relocate", payload={"node": "n1", "max_bytes": 4096, "expected_generation": 2, "action": "move"})
CANARY = _cmd("canary", payload={"model": "m", "version": "v2", "share": 0.1})  # no backend in SPEC


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    got: list[tuple[dict[str, str], bytes]] = []

    async def handle(request: web.Request) -> web.Response:
        got.append((dict(request.headers), await request.read()))
        return web.Response(status=202)

    app = web.Application()
    app.router.add_post("/relocate", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}/relocate", got
    await runner.cleanup()


async def _chain_executor(settings: Settings, url: str) -> tuple[ZoneExecutor, ChainBackend, AIOKafkaProducer]:
    await ensure_topics(settings)
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    s = settings.replace(executor_backends=SPEC, webhook_url=url, webhook_hmac_key=KEY_HEX)
    backend = build_backend(BackendContext(redis, s.topic_prefix, "az-a", s), None)
    assert isinstance(backend, ChainBackend)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    await producer.start()
    ex = ZoneExecutor(
        zone="az-a",
        prefix=s.topic_prefix,
        redis=redis,
        backend=backend,
        guard=guard(s, "m", "m@v2"),
        clock=ScaledClock(),
        results=producer,
        results_topic=s.topic("results"),
        block_ms=50,
        probe_interval_s=0,
    )
    await ex.ensure_group()
    return ex, backend, producer


async def _issue(ex: ZoneExecutor, settings: Settings, cmds: list[Command]) -> None:
    stream = names.command_stream(settings.topic_prefix, "az-a")
    now = int(time.time() * 1000)  # the module's commands were built at collection: stamp them now
    for c in cmds:
        fresh = dataclasses.replace(c, issued_at_ms=now, expires_at_ms=now + 60_000)
        await ex.redis.xadd(stream, {"cmd": signed(settings, fresh)})
    handled = 0
    for _ in range(20):
        handled += await ex.poll_once()
        if handled >= len(cmds):
            break
    assert handled == len(cmds)


async def test_each_kind_goes_to_its_backend_and_the_result_names_it(
    settings: Settings, receiver: tuple[str, list[tuple[dict[str, str], bytes]]]
) -> None:
    url, got = receiver
    ex, chain, producer = await _chain_executor(settings, url)
    redis, prefix = ex.redis, settings.topic_prefix
    try:
        await _issue(ex, settings, [SCALE, ROUTE, RELOCATE, CANARY])
        # scale -> sim: the desired-state hash the fleet reconciles against.
        assert await redis.hget(names.desired_replicas(prefix, "az-a"), "m") == b"7"
        # route -> routing: the gateway's hash, weights normalised.
        raw = await redis.hget(names.routing_hash(prefix, "az-a"), "chat")
        assert isinstance(raw, bytes)
        field = orjson.loads(raw)
        assert field["weights"] == {"m|az-a": 0.75, "m|az-b": 0.25} and field["command_id"] == ROUTE.command_id
        # relocate -> webhook: POSTed, signed; and not queued for the simulated fleet.
        assert [orjson.loads(body)["command_id"] for _, body in got] == [RELOCATE.command_id]
        assert got[0][0]["X-Governor-Kind"] == "relocate" and got[0][0]["X-Governor-Signature"].startswith("sha256=")
        assert await redis.llen(names.relocate_queue(prefix, "az-a")) == 0
        # canary: no backend -> rejected with the reason, nothing written.
        assert await redis.hget(names.routing_hash(prefix, "az-a"), "_canary|m") is None
        results = {r["command_id"]: r for r in await _results(settings, 4)}
        seen = {cid: (r["outcome"], r["backend"]) for cid, r in results.items()}
        assert seen == {
            SCALE.command_id: ("applied", "sim"),
            ROUTE.command_id: ("applied", "routing"),
            RELOCATE.command_id: ("applied", "webhook"),
            CANARY.command_id: ("rejected", "none"),
        }
        assert (
            results[CANARY.command_id]["reason"]
            == f"no backend for canary commands (GOVERNOR_EXECUTOR_BACKENDS={SPEC})"
        )
        assert results[RELOCATE.command_id]["detail"] == {"status": 202, "attempts": 1}
        assert (await redis.xpending(names.command_stream(prefix, "az-a"), "executors"))["pending"] == 0
    finally:
        await close_backend(chain)
        webhook = chain.routes["relocate"]
        assert getattr(webhook, "_session", "gone") is None  # the aiohttp session is closed
        await producer.stop()
        await redis.aclose()


async def test_pause_makes_every_backend_of_the_chain_advisory(
    settings: Settings, receiver: tuple[str, list[tuple[dict[str, str], bytes]]]
) -> None:
    url, got = receiver
    ex, chain, producer = await _chain_executor(settings, url)
    redis, prefix = ex.redis, settings.topic_prefix
    try:
        await redis.set(names.paused(prefix), orjson.dumps({"reason": "drill", "paused_at_ms": 1}))
        await _issue(ex, settings, [SCALE, ROUTE, RELOCATE])
        assert await redis.hget(names.desired_replicas(prefix, "az-a"), "m") is None
        assert await redis.hget(names.routing_hash(prefix, "az-a"), "chat") is None
        assert got == []
        outcomes = {r["command_id"]: r["outcome"] for r in await _results(settings, 3)}
        assert set(outcomes.values()) == {"advisory"} and len(outcomes) == 3
    finally:
        await close_backend(chain)
        await producer.stop()
        await redis.aclose()
