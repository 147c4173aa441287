"""Guardrails on the real Redis: the runtime kill switch and the fleet budget.

* ``governor pause`` makes every executor report a valid signed command as
  ``advisory`` (acknowledged, the desired state unchanged, only its marker
  kept); ``governor resume`` lets the next one apply, no restart, and a
  replay of the advisory one is a ``duplicate``.
* Two zones' executors racing for 60 replicas each under a budget of 100:
  the Lua check-and-write lets one through and refuses the other as
  ``rejected`` (``budget: ...``); the sum stays within the budget.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from core import names
from core.clock import ScaledClock
from core.settings import ModelSpec, Settings
from executors.backends import FleetBudget, SimFleetBackend
from executors.executor import ZoneExecutor
from governor.pause_cli import run_pause
from streams.commands import Command
from tests.integration.harness import guard, signed, with_models

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MODEL = "m"
ZONES = ("az-a", "az-b")


class _Results:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_and_wait(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.sent.append(orjson.loads(value))


def _scale(zone: str, target: int, basis_ms: int) -> Command:
    now = int(time.time() * 1000)
    return Command(
        kind="scale",
        zone=zone,
        model=MODEL,
        target_replicas=target,
        reason="test",
        issued_at_ms=now,
        expires_at_ms=now + 60_000,
        basis_ms=basis_ms,
    )


def _executor(settings: Settings, redis: aioredis.Redis, zone: str, budget: FleetBudget | None = None) -> ZoneExecutor:
    prefix = settings.topic_prefix
    return ZoneExecutor(
        zone=zone,
        prefix=prefix,
        redis=redis,
        backend=SimFleetBackend(redis, prefix, zone, budget),
        guard=guard(settings, ModelSpec(MODEL, min_replicas=1, max_replicas=128)),
        clock=ScaledClock(),
        results=_Results(),  # type: ignore[arg-type]
        results_topic="r",
        block_ms=50,
        probe_interval_s=0,
    )


async def _send(ex: ZoneExecutor, raw: bytes) -> dict[str, Any]:
    results: _Results = ex.results  # type: ignore[assignment]
    before = len(results.sent)
    await ex.redis.xadd(ex.stream, {"cmd": raw})
    for _ in range(50):
        await ex.poll_once()
        if len(results.sent) > before:
            assert (await ex.redis.xpending(ex.stream, "executors"))["pending"] == 0  # acked
            return results.sent[-1]
    raise AssertionError(f"not handled: {raw!r}")


def _pause(settings: Settings, command: str, reason: str = "incident 42") -> int:
    return run_pause(settings, argparse.Namespace(command=command, reason=reason))


async def test_pause_turns_a_valid_command_advisory_and_resume_applies_the_next(settings: Settings) -> None:
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    desired = names.desired_replicas(settings.topic_prefix, "az-a")
    try:
        ex = _executor(settings, redis, "az-a")
        await ex.ensure_group()
        await redis.hset(desired, MODEL, 3)
        assert await asyncio.to_thread(_pause, settings, "pause") == 0
        held_back = signed(settings, _scale("az-a", 8, basis_ms=1_000))
        res = await _send(ex, held_back)
        assert (res["outcome"], res["reason"]) == ("advisory", "paused: incident 42")
        assert res["detail"]["paused"]["reason"] == "incident 42"
        assert await redis.hget(desired, MODEL) == b"3"  # the desired state is untouched
        # Only its marker is remembered (no last_basis / last_hlc): the command was seen.
        assert await redis.get(names.applied_marker(settings.topic_prefix, "az-a", res["command_id"])) == b"advisory"
        assert await redis.hgetall(names.executor_last_basis(settings.topic_prefix, "az-a")) == {}
        assert ex.metrics.registry.get_sample_value("governor_executor_paused", {"zone": "az-a"}) == 1.0
        # Resume, no restart: the advisory command replayed is a duplicate (issue 31 item 7), not applied...
        assert await asyncio.to_thread(_pause, settings, "resume") == 0
        res = await _send(ex, held_back)
        assert (res["outcome"], res["reason"]) == (
            "duplicate",
            "command_id already applied (or reported advisory while paused)",
        ), res
        assert await redis.hget(desired, MODEL) == b"3"
        # ... and the next decision applies.
        res = await _send(ex, signed(settings, _scale("az-a", 9, basis_ms=2_000)))
        assert res["outcome"] == "applied", res
        assert await redis.hget(desired, MODEL) == b"9"
        assert ex.metrics.registry.get_sample_value("governor_executor_paused", {"zone": "az-a"}) == 0.0
        assert ex.stats.outcomes == {"advisory": 1, "duplicate": 1, "applied": 1}
    finally:
        await redis.aclose()


async def test_two_zones_racing_for_60_replicas_under_a_budget_of_100_stay_within_it(settings: Settings) -> None:
    s = with_models(settings.replace(zones=ZONES, max_replicas_total=100), ModelSpec(MODEL, max_replicas=128))
    budget = FleetBudget.from_settings(s)
    assert budget is not None and budget.total == 100
    clients = [aioredis.Redis.from_url(str(s.redis_url)) for _ in ZONES]
    try:
        executors = [_executor(s, r, z, budget) for r, z in zip(clients, ZONES, strict=True)]
        for ex in executors:
            await ex.ensure_group()
        # Both commands are in their streams before either executor polls, then both run at once.
        for ex in executors:
            await ex.redis.xadd(ex.stream, {"cmd": signed(s, _scale(ex.zone, 60, basis_ms=1_000))})
        await asyncio.gather(*(ex.poll_once() for ex in executors))
        results = [r for ex in executors for r in ex.results.sent]  # type: ignore[attr-defined]
        assert sorted(r["outcome"] for r in results) == ["applied", "rejected"], results
        refused = next(r for r in results if r["outcome"] == "rejected")
        assert refused["reason"].startswith("budget: 60 replicas of m in ")
        assert "above GOVERNOR_MAX_REPLICAS_TOTAL=100" in refused["reason"]
        total = 0
        for z in ZONES:
            raw = await clients[0].hget(names.desired_replicas(s.topic_prefix, z), MODEL)
            total += int(raw or 0)
        assert total == 60
        # The refused zone left no order state behind; a smaller target fits and applies.
        loser = next(ex for ex in executors if ex.zone == refused["zone"])
        res = await _send(loser, signed(s, _scale(loser.zone, 40, basis_ms=2_000)))
        assert res["outcome"] == "applied", res
    finally:
        for r in clients:
            await r.aclose()


async def test_a_model_budget_refuses_an_increase_but_always_lets_a_zone_come_down(settings: Settings) -> None:
    s = with_models(settings.replace(zones=ZONES), ModelSpec(MODEL, max_replicas=128, max_replicas_total=20))
    budget = FleetBudget.from_settings(s)
    redis = aioredis.Redis.from_url(str(s.redis_url))
    prefix = s.topic_prefix
    try:
        await redis.hset(names.desired_replicas(prefix, "az-a"), MODEL, 15)
        await redis.hset(names.desired_replicas(prefix, "az-b"), MODEL, 10)  # 25: above a lowered budget
        ex = _executor(s, redis, "az-b", budget)
        await ex.ensure_group()
        res = await _send(ex, signed(s, _scale("az-b", 12, basis_ms=1_000)))
        assert res["outcome"] == "rejected" and "m's max_replicas_total=20" in res["reason"], res
        res = await _send(ex, signed(s, _scale("az-b", 8, basis_ms=2_000)))
        assert res["outcome"] == "applied", res  # a decrease is always written
        assert await redis.hget(names.desired_replicas(prefix, "az-b"), MODEL) == b"8"
    finally:
        await redis.aclose()
