"""The simulated fleet as the gateway of executors/backends.py, on the real Redis: canary
and breaker commands applied by the executors' backend steer a LiveFleet's requests."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis

from core.settings import Settings
from executors.backends import SimFleetBackend
from loop.commands import Command
from sim.fleet import Fleet, FleetConfig
from sim.gateway import HALF_OPEN_SHARE
from sim.live import LiveFleet
from sim.perf_model import PerfModel
from sim.workloads import Workload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

M = "llama2-70b"
N = 2000  # requests, all within the first trace second


@pytest.fixture
async def redis(settings: Settings) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(str(settings.redis_url))
    yield client
    await client.aclose()


class _NoProducer:
    async def send(self, rec: dict[str, Any]) -> None:
        pass

    async def flush(self) -> None:
        pass


BRK = {"target": f"{M}|az-a", "state": "half_open", "threshold": 0.005, "error_ratio": 0.0}


def _cmd(kind: str, zone: str, payload: dict[str, Any], basis_ms: int = 10_000) -> Command:
    now = int(time.time() * 1000)
    return Command(
        kind=kind,
        zone=zone,
        model=payload["target"] if kind == "breaker" else M,  # a breaker's target is its model|zone
        reason="test",
        issued_at_ms=now,
        expires_at_ms=now + 60_000,
        basis_ms=basis_ms,
        controller=kind,
        payload=payload,
    )


async def _run_live(settings: Settings, redis: aioredis.Redis, seed: int = 3) -> LiveFleet:
    perf = PerfModel.from_splitwise()
    fleet = Fleet(
        FleetConfig(
            models={M: perf, f"{M}@v2": perf}, zones=("az-a", "az-b"), initial_replicas=1, jitter=False, seed=seed
        )
    )
    workload = Workload(
        arrival_s=np.linspace(0.0, 0.5, N),
        prompt_tokens=np.full(N, 100),
        output_tokens=np.full(N, 4),
        hash_ids=None,
        name="flat",
    )
    t0 = int(time.time() * 1000)
    live = LiveFleet(
        fleet,
        workload,
        model=M,
        zones=["az-a", "az-b"],
        producer=_NoProducer(),
        redis=redis,
        prefix=settings.topic_prefix,
        now_ms=lambda: int(time.time() * 1000),
        t0_ms=t0,
        seed=seed,
    )
    await live.run(0.8)
    assert live.stats.submitted == N
    return live


def _binomial_ok(k: int, n: int, p: float) -> bool:
    return abs(k - n * p) <= 4.0 * (n * p * (1.0 - p)) ** 0.5


async def test_canary_share_in_the_routing_hash_splits_the_live_fleets_requests(
    settings: Settings, redis: aioredis.Redis
) -> None:
    for zone in ("az-a", "az-b"):  # the executors' backend writes _canary|<model> per zone
        out = await SimFleetBackend(redis, settings.topic_prefix, zone).apply(
            _cmd("canary", zone, {"model": M, "version": "v2", "share": 0.2})
        )
        assert out == {"model": M, "version": "v2", "share": 0.2}
    live = await _run_live(settings, redis)
    routed = live.stats.routed
    canary = routed.get(f"{M}@v2|az-a", 0) + routed.get(f"{M}@v2|az-b", 0)
    assert _binomial_ok(canary, N, 0.2), routed
    for zone in ("az-a", "az-b"):  # per zone too: each zone's gateway draws its own share
        n_zone = routed[f"{M}|{zone}"] + routed[f"{M}@v2|{zone}"]
        assert _binomial_ok(routed[f"{M}@v2|{zone}"], n_zone, 0.2), routed
    assert live.fleet.stats()["submitted"] == N


async def test_open_breaker_sends_nothing_to_its_target(settings: Settings, redis: aioredis.Redis) -> None:
    backend = SimFleetBackend(redis, settings.topic_prefix, "az-a")
    await backend.apply(
        _cmd(
            "breaker",
            "az-a",
            {"target": f"{M}|az-a", "state": "open", "probe_budget": 0, "threshold": 0.005, "error_ratio": 0.2},
        )
    )
    live = await _run_live(settings, redis)  # no route weights: the zone choice avoids az-a
    assert live.stats.routed == {f"{M}|az-b": N}
    # With route weights over both zones, the open target's weight is removed.
    await backend.apply(_cmd("route", "az-a", {"weights": {"*": {f"{M}|az-a": 0.5, f"{M}|az-b": 0.5}}}))
    live = await _run_live(settings, redis)
    assert live.stats.routed == {f"{M}|az-b": N}
    assert live.fleet.router.weights(M) == {f"{M}|az-b": 1.0}


async def test_half_open_breaker_gets_at_most_its_probe_budget(settings: Settings, redis: aioredis.Redis) -> None:
    backend = SimFleetBackend(redis, settings.topic_prefix, "az-a")
    await backend.apply(_cmd("route", "az-a", {"weights": {"*": {f"{M}|az-a": 0.5, f"{M}|az-b": 0.5}}}))
    await backend.apply(_cmd("breaker", "az-a", {**BRK, "probe_budget": 10**6}, basis_ms=11_000))
    live = await _run_live(settings, redis)  # a budget that never runs out: 5 % of its half
    assert _binomial_ok(live.stats.routed.get(f"{M}|az-a", 0), N, 0.5 * HALF_OPEN_SHARE), live.stats.routed
    await backend.apply(_cmd("breaker", "az-a", {**BRK, "probe_budget": 5}, basis_ms=12_000))
    live = await _run_live(settings, redis)
    assert live.stats.routed.get(f"{M}|az-a", 0) == 5  # ~50 drawn, capped at the budget
    assert live.fleet.router.weights(M) == {f"{M}|az-b": 1.0}  # spent: treated as open
