"""Route and breaker commands: deterministic ids, Redis routing hash, webhook, executor."""

from __future__ import annotations

import asyncio
import http.server
import threading
import time

import orjson
import pytest
import redis.asyncio as aioredis

from core import names
from core.clock import ScaledClock
from core.settings import Settings
from executors.backends import (
    BackendRejected,
    BackendUnavailable,
    RoutingBackend,
    SimFleetBackend,
    WebhookBackend,
)
from executors.executor import ZoneExecutor
from loop.commands import Command, CommandError
from tests.integration.harness import guard, signed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

W = {"trading": {"llama2-70b|az-a": 3.0, "bloom-176b|az-a": 1.0}, "batch": {"bloom-176b|az-a": 1.0}}


def _route(weights: dict, basis_ms: int = 1_000) -> Command:
    now = int(time.time() * 1000)
    return Command(
        kind="route",
        zone="az-a",
        model="chat",
        reason="test",
        issued_at_ms=now,
        expires_at_ms=now + 60_000,
        basis_ms=basis_ms,
        controller="routing",
        payload={"weights": weights},
    )


def test_route_command_ids_encode_weights_and_scale_ids_hash_the_target() -> None:
    a, b = _route(W), _route({"batch": W["batch"], "trading": dict(reversed(W["trading"].items()))})
    assert a.command_id == b.command_id
    assert _route({**W, "batch": {"bloom-176b|az-a": 2.0}}).command_id != a.command_id
    assert Command.decode(a.encode()) == a
    scale = Command(
        kind="scale", zone="z", model="m", target_replicas=3, reason="", issued_at_ms=0, expires_at_ms=1, basis_ms=5
    )
    from loop.commands import command_id

    assert scale.command_id == command_id("scale", "z", "m", 5, {"target_replicas": 3})
    with pytest.raises(CommandError):
        _route({"trading": {"x|y": -1}})


async def test_routing_backend_writes_the_gateway_hash(settings: Settings) -> None:
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    try:
        out = await RoutingBackend(redis, settings.topic_prefix).apply(_route(W))
        assert out["classes"] == ["batch", "trading"]
        h = await redis.hgetall(names.routing_hash(settings.topic_prefix, "az-a"))
        trading = orjson.loads(h[b"trading"])
        assert trading["weights"] == {"bloom-176b|az-a": 0.25, "llama2-70b|az-a": 0.75}
        assert int(h[b"_version"]) == 1_000
        now = int(time.time() * 1000)
        brk = Command(
            kind="breaker",
            zone="az-a",
            model="bloom-176b|az-a",
            reason="trip",
            issued_at_ms=now,
            expires_at_ms=now + 1000,
            basis_ms=2_000,
            payload={
                "target": "bloom-176b|az-a",
                "state": "open",
                "probe_budget": 0,
                "threshold": 0.005,
                "error_ratio": 0.5,
            },
        )
        await SimFleetBackend(redis, settings.topic_prefix, "az-a").apply(brk)
        raw = await redis.hget(names.breaker_hash(settings.topic_prefix, "az-a"), "bloom-176b|az-a")
        assert orjson.loads(raw)["state"] == "open"
    finally:
        await redis.aclose()


async def test_executor_applies_a_route_command_once(settings: Settings) -> None:
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    ex = ZoneExecutor(
        zone="az-a",
        prefix=settings.topic_prefix,
        redis=redis,
        backend=RoutingBackend(redis, settings.topic_prefix),
        guard=guard(settings, "chat"),
        clock=ScaledClock(),
        results=None,
        results_topic="x",
        block_ms=50,
    )
    try:
        await ex.ensure_group()
        cmd = _route(W, basis_ms=5_000)
        for _ in range(2):
            await redis.xadd(names.command_stream(settings.topic_prefix, "az-a"), {"cmd": signed(settings, cmd)})
        older = _route({"batch": {"bloom-176b|az-a": 1.0}}, basis_ms=4_000)
        await redis.xadd(names.command_stream(settings.topic_prefix, "az-a"), {"cmd": signed(settings, older)})
        while sum(ex.stats.outcomes.values()) < 3:
            await ex.poll_once()
        assert ex.stats.outcomes == {"applied": 1, "duplicate": 1, "stale": 1}
    finally:
        await redis.aclose()


class _Handler(http.server.BaseHTTPRequestHandler):
    bodies: list[bytes] = []
    codes: list[int] = []

    def do_POST(self) -> None:  # noqa: N802
        self.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
        code = self.codes.pop(0) if self.codes else 200
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


async def test_webhook_backend_posts_retries_and_rejects() -> None:
    srv = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_port}/routes"
    try:
        _Handler.codes[:] = [503]
        out = await WebhookBackend(url, timeout_s=2, backoff_s=0.01).apply(_route(W))
        assert out == {"status": 200, "attempts": 2}
        assert orjson.loads(_Handler.bodies[-1])["payload"]["weights"]["batch"] == {"bloom-176b|az-a": 1.0}
        _Handler.codes[:] = [400]
        with pytest.raises(BackendRejected):
            await WebhookBackend(url, backoff_s=0.01).apply(_route(W))
    finally:
        srv.shutdown()
    with pytest.raises(BackendUnavailable):
        await WebhookBackend(url, timeout_s=0.2, retries=2, backoff_s=0.01).apply(_route(W))
    await asyncio.sleep(0)


async def test_sim_fleet_applies_route_commands_through_redis(settings: Settings) -> None:
    from sim.fleet import Fleet, FleetConfig
    from sim.gateway import sync_routing_from_redis
    from sim.perf_model import PerfModel

    perf = PerfModel.from_splitwise()
    fleet = Fleet(FleetConfig(models={"bloom-176b": perf, "llama2-70b": perf}, zones=("az-a",), initial_replicas=1))
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    try:
        await SimFleetBackend(redis, settings.topic_prefix, "az-a").apply(_route(W))
        seen: dict[str, int] = {}
        got = await sync_routing_from_redis(fleet, redis, settings.topic_prefix, ["az-a"], "chat", 0.0, seen)
        assert got == ["batch", "trading"]
        assert fleet.router.weights("chat", "trading") == pytest.approx(
            {"bloom-176b|az-a": 0.25, "llama2-70b|az-a": 0.75}
        )
        assert fleet.submit_routed(0.0, "chat", "batch", 10, 1, "x") == ("bloom-176b", "az-a")
        assert await sync_routing_from_redis(fleet, redis, settings.topic_prefix, ["az-a"], "chat", 1.0, seen) == []
    finally:
        await redis.aclose()


def _agents(weights: dict[str, float], basis_ms: int) -> Command:
    now = int(time.time() * 1000)
    return Command(
        kind="agents",
        zone="az-a",
        model="llama2-70b",
        reason="test",
        issued_at_ms=now,
        expires_at_ms=now + 60_000,
        basis_ms=basis_ms,
        controller="agent_weights",
        payload={
            "weights": weights,
            "signals": {"stability": 0.9, "rag_score": 0.9, "tool_conf": 0.2},
            "paths": {"rag": 0.5, "tool": 0.1, "llm": 0.4},
        },
    )


async def test_agents_commands_write_the_routing_hash_field_once_and_in_order(settings: Settings) -> None:
    """The sim backend delegates to the routing backend: ``_agents|<model>`` of the zone's
    routing hash; the executor drops a duplicate and refuses an older decision as stale."""
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    ex = ZoneExecutor(
        zone="az-a",
        prefix=settings.topic_prefix,
        redis=redis,
        backend=SimFleetBackend(redis, settings.topic_prefix, "az-a"),
        guard=guard(settings),
        clock=ScaledClock(),
        results=None,
        results_topic="x",
        block_ms=50,
        probe_interval_s=0,
    )
    try:
        await ex.ensure_group()
        cmd = _agents({"rag": 0.6, "tool": 0.1, "llm": 0.3}, basis_ms=5_000)
        older = _agents({"rag": 0.1, "tool": 0.6, "llm": 0.3}, basis_ms=4_000)
        for c in (cmd, cmd, older):
            await redis.xadd(names.command_stream(settings.topic_prefix, "az-a"), {"cmd": signed(settings, c)})
        while sum(ex.stats.outcomes.values()) < 3:
            await ex.poll_once()
        assert ex.stats.outcomes == {"applied": 1, "duplicate": 1, "stale": 1}
        raw = await redis.hget(names.routing_hash(settings.topic_prefix, "az-a"), "_agents|llama2-70b")
        field = orjson.loads(raw)
        assert field["weights"] == {"rag": 0.6, "tool": 0.1, "llm": 0.3}
        assert field["signals"]["stability"] == 0.9 and field["paths"]["llm"] == 0.4
        assert (field["model"], field["command_id"], field["basis_ms"]) == ("llama2-70b", cmd.command_id, 5_000)
        assert field["issued_at_ms"] == cmd.issued_at_ms
    finally:
        await redis.aclose()
