"""The local backend's seams that need no engine: the real vLLM router's worker API, and the fleet budget.

* ``remove_worker`` answers 200 even for a URL the router never had, so the
  client confirms with ``/list_workers``; a worker added (a stand-in answering
  ``/health``) is listed, and gone once removed.
* A router that stops answering fails the call with its reason after the
  bounded retries.
* The budget wraps the local backend as it wraps every backend that changes
  replicas: an increase above the zone's allowance is refused before any
  engine is asked for (no process of the pool starts).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from aiohttp import web

from core import names
from core.budget import Allowance
from core.settings import ModelSpec, Settings
from engines.pool import free_port, pool_processes
from engines.router import RouterClient, RouterUnavailable, start_router
from executors.budget import BudgetedBackend, BudgetExceeded, FleetBudget
from executors.chain import BackendContext, build_backend, close_backend
from executors.local import LocalBackend
from loop.commands import Command
from tests.integration.harness import with_models

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
async def stand_in() -> AsyncIterator[str]:
    """A worker that answers /health (all the router asks of one before it routes to it)."""

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_the_router_client_confirms_each_change_with_the_worker_list(tmp_path: Path, stand_in: str) -> None:
    router = start_router(free_port(), free_port(), tmp_path / "router.log")
    client = RouterClient(router.url, attempts=3, backoff_s=0.05)
    try:
        await router.wait_healthy(30)
        assert await client.health() and await client.list_workers() == []
        await client.remove_worker("http://127.0.0.1:9")  # never added: 200, and confirmed absent
        await client.add_worker(stand_in)
        assert await client.list_workers() == [stand_in]
        await client.remove_worker(stand_in)
        assert await client.list_workers() == []
        router.stop()
        with pytest.raises(RouterUnavailable, match=r"POST /remove_worker failed after 3 attempts: .*Connect"):
            await client.remove_worker(stand_in)
        assert not await client.health()
    finally:
        router.stop()
        await client.close()


async def test_the_budget_refuses_an_increase_above_the_allowance_before_any_engine_starts(
    settings: Settings, tmp_path: Path
) -> None:
    s = with_models(
        settings.replace(
            zones=("az-a", "az-b"),
            max_replicas_total=2,
            engine_python=sys.executable,  # never runs an engine: the budget refuses first
            local_model_dir=str(tmp_path),
            local_model="m",
            local_router_url=f"http://127.0.0.1:{free_port()}",
            local_start_replicas=0,
        ),
        ModelSpec("m", max_replicas=8),
    )
    redis = aioredis.Redis.from_url(str(s.redis_url))
    ctx = BackendContext(redis, s.topic_prefix, "az-a", s, budget=FleetBudget.from_settings(s))
    backend = build_backend(ctx, "local")
    try:
        assert isinstance(backend, BudgetedBackend) and isinstance(backend.inner, LocalBackend)
        await redis.set(names.zone_allowance(s.topic_prefix, "az-a"), Allowance(1, fleet_total=2).encode())
        cmd = Command(
            kind="scale", zone="az-a", model="m", target_replicas=2, reason="t", issued_at_ms=0, expires_at_ms=1,
            basis_ms=0,
        )  # fmt: skip
        with pytest.raises(BudgetExceeded, match="above az-a's allowance 1"):
            await backend.apply(cmd)
        pool = backend.inner.pool
        assert pool.replicas()["desired"] == 0 and pool.engines() == [] and pool_processes(pool.tag) == {}
        assert await redis.hget(names.desired_replicas(s.topic_prefix, "az-a"), "m") is None  # nothing reserved
    finally:
        await close_backend(backend)
        await redis.aclose()
