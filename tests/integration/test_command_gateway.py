"""The traffic benchmarks' gateway in memory applies commands as the executors' backend and a gateway do
on the real Redis: the same route, breaker and canary commands, one way through
``RoutingBackend`` + ``sync_routing_from_redis``, the other through ``CommandGateway``,
leave the same weights, breakers and canary shares on the fleet."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis

from core.settings import Settings
from executors.backends import RoutingBackend
from loop.commands import Command
from sim.fleet import Fleet, FleetConfig
from sim.gateway import CommandGateway, TrafficGate, sync_routing_from_redis
from sim.perf_model import PerfModel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

BIG, SMALL = "bloom-176b", "llama2-70b"
ZONES = ("az-a", "az-b")
SIGNALS = {"stability": 0.9, "rag_score": 0.9, "tool_conf": 0.2}


@pytest.fixture
async def redis(settings: Settings) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(str(settings.redis_url))
    yield client
    await client.aclose()


def _fleet() -> Fleet:
    perf = PerfModel.from_splitwise()
    return Fleet(FleetConfig(models={BIG: perf, SMALL: perf, f"{SMALL}@v2": perf}, zones=ZONES, initial_replicas=1))


def _cmds(kind: str, model: str, payload: dict[str, Any], basis_ms: int) -> list[Command]:
    """One command per zone, as the drivers send them."""
    now = int(time.time() * 1000)
    return [
        Command(
            kind=kind,
            zone=z,
            model=model,
            reason="test",
            issued_at_ms=now,
            expires_at_ms=now + 60_000,
            basis_ms=basis_ms,
            controller=kind,
            payload=payload,
        )
        for z in ZONES
    ]


def _breaker(target: str, state: str, probes: int, basis_ms: int) -> list[Command]:
    payload = {"target": target, "state": state, "probe_budget": probes, "threshold": 0.01, "error_ratio": 0.05}
    return _cmds("breaker", target, payload, basis_ms)


STEPS = [
    _cmds(
        "route",
        BIG,
        {
            "weights": {
                "*": {f"{BIG}|az-a": 0.4, f"{BIG}|az-b": 0.4, f"{SMALL}|az-a": 0.1, f"{SMALL}|az-b": 0.1},
                "trading": {f"{BIG}|az-a": 0.2, f"{SMALL}|az-a": 0.3, f"{SMALL}|az-b": 0.5},
            },
            "fallback": {"trading": "primary slow"},
        },
        10_000,
    ),
    _breaker(f"{BIG}|az-a", "open", 0, 20_000),
    _cmds("canary", SMALL, {"model": SMALL, "version": "v2", "share": 0.05}, 20_000),
    _breaker(f"{BIG}|az-a", "half_open", 3, 30_000),
    _cmds("route", BIG, {"weights": {"*": {f"{BIG}|az-b": 2.0, "ghost|az-a": 5.0, f"{SMALL}|az-a": 1.0}}}, 40_000),
    _breaker(f"{BIG}|az-a", "closed", 0, 50_000),
    _cmds("agents", SMALL, {"weights": {"rag": 0.5, "tool": 0.1, "llm": 0.4}, "signals": SIGNALS, "paths": {}}, 50_000),
]


def _view(fleet: Fleet, gate: TrafficGate) -> dict[str, Any]:
    return {
        # as lists: the order of the targets is the order of the router's draws
        "weights": {c: list(fleet.router.weights(BIG, c).items()) for c in (None, "trading", "voice")},
        "breakers": {t: (b.state, b.probe_budget) for t, b in gate.breakers.items()},
        "canary": dict(gate.canary),
        "routes": dict(gate.routes),
        "agents": dict(gate.agents),
        "agent_routes": dict(fleet._agent_pools),  # what the fleet's dispatch applies
    }


async def test_gateway_in_memory_equals_backend_then_redis(settings: Settings, redis: aioredis.Redis) -> None:
    backend = RoutingBackend(redis, settings.topic_prefix)
    on_redis, gate = _fleet(), TrafficGate(np.random.default_rng(0))
    seen: dict[str, int] = {}
    in_memory = CommandGateway(_fleet(), np.random.default_rng(0))
    for k, step in enumerate(STEPS):
        t = float(k)
        for cmd in step:
            await backend.apply(cmd)
            assert in_memory.apply(cmd, t)
        await sync_routing_from_redis(on_redis, redis, settings.topic_prefix, list(ZONES), BIG, t, seen, gate)
        assert _view(in_memory.fleet, in_memory.gate) == _view(on_redis, gate), f"after step {k}: {step[0].kind}"
    # what the steps did: the open breaker took az-a's primary out, the ghost target was dropped
    assert "ghost|az-a" not in in_memory.fleet.router.weights(BIG)
    assert in_memory.gate.canary[("az-a", SMALL)] == (f"{SMALL}@v2", 0.05)
    assert in_memory.fleet._agent_pools[("az-b", SMALL)] == {"rag": 0.5, "tool": 0.1, "llm": 0.4}
