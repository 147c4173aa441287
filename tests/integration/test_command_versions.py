"""Rolling upgrade: an executor on the real Redis applies a schema-v1 command written by
the old code once, recognises its redelivery as a duplicate, then applies v2 commands."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from core import names
from core.clock import ScaledClock
from core.settings import Settings
from executors.backends import SimFleetBackend
from executors.executor import ZoneExecutor
from loop.commands import Command
from tests.integration.harness import guard, signed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ZONE = "az-a"


def _v1_record(kind: str, model: str, target_replicas: int, basis_ms: int, payload: dict[str, Any]) -> bytes:
    """A command exactly as the schema-v1 code encoded it, id by the v1 rule, built by hand."""
    now = int(time.time() * 1000)
    basis = f"{kind}|{ZONE}|{model}|{basis_ms}|{target_replicas}"
    if payload:
        basis += "|" + orjson.dumps(payload, option=orjson.OPT_SORT_KEYS).decode()
    return orjson.dumps(
        {
            "kind": kind,
            "zone": ZONE,
            "model": model,
            "target_replicas": target_replicas,
            "reason": "scale_up" if kind == "scale" else "trip",
            "issued_at_ms": now,
            "expires_at_ms": now + 60_000,
            "basis_ms": basis_ms,
            "previous_replicas": 2 if kind == "scale" else None,
            "controller": "pid" if kind == "scale" else kind,
            "detail": {},
            "payload": payload,
            "schema_version": 1,
            "command_id": f"{kind}-{hashlib.sha256(basis.encode()).hexdigest()[:20]}",
            "hlc": 0,
        }
    )


async def _handle(ex: ZoneExecutor, redis: aioredis.Redis, raw: bytes) -> None:
    """XADD ``raw`` to the zone's stream and let the executor handle it."""
    before = sum(ex.stats.outcomes.values())
    await redis.xadd(names.command_stream(ex.prefix, ZONE), {"cmd": raw})
    for _ in range(100):
        await ex.poll_once()
        if sum(ex.stats.outcomes.values()) > before:
            return
    raise AssertionError(f"not handled: {raw!r}")


async def test_a_v1_command_applies_once_and_v2_commands_follow(settings: Settings) -> None:
    prefix = settings.topic_prefix
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    ex = ZoneExecutor(
        zone=ZONE,
        prefix=prefix,
        redis=redis,
        backend=SimFleetBackend(redis, prefix, ZONE),
        guard=guard(settings.replace(accept_unsigned_v1=True), "m"),  # the rolling upgrade's setting
        clock=ScaledClock(),
        results=None,
        results_topic="x",
        block_ms=50,
        probe_interval_s=0,
    )
    desired = names.desired_replicas(prefix, ZONE)
    try:
        await ex.ensure_group()
        v1 = _v1_record("scale", "m", 4, 5_000, {})
        v1_id = orjson.loads(v1)["command_id"]
        await _handle(ex, redis, v1)
        assert ex.stats.outcomes == {"applied": 1}
        assert int(await redis.hget(desired, "m")) == 4
        assert await redis.exists(names.applied_marker(prefix, ZONE, v1_id))  # marked under its v1 id

        await _handle(ex, redis, v1)  # redelivered during the upgrade
        assert ex.stats.outcomes == {"applied": 1, "duplicate": 1}

        now = int(time.time() * 1000)
        v2 = Command(
            kind="scale",
            zone=ZONE,
            model="m",
            target_replicas=6,
            reason="scale_up",
            issued_at_ms=now,
            expires_at_ms=now + 60_000,
            basis_ms=6_000,
        )
        assert orjson.loads(v2.encode())["schema_version"] == 2 and v2.command_id != v1_id
        await _handle(ex, redis, signed(settings, v2))
        assert ex.stats.outcomes == {"applied": 2, "duplicate": 1}
        assert int(await redis.hget(desired, "m")) == 6

        # A v1 breaker command (target_replicas 0 in v1) reaches the gateway's hash once.
        payload = {"target": "m|az-b", "state": "open", "probe_budget": 0, "threshold": 0.005, "error_ratio": 0.3}
        brk = _v1_record("breaker", "m|az-b", 0, 6_000, payload)
        await _handle(ex, redis, brk)
        await _handle(ex, redis, brk)
        assert ex.stats.outcomes == {"applied": 3, "duplicate": 2}
        field = orjson.loads(await redis.hget(names.breaker_hash(prefix, ZONE), "m|az-b"))
        assert field["state"] == "open" and field["basis_ms"] == 6_000

        # Another version is refused (and acknowledged), not applied.
        v3 = orjson.loads(signed(settings, v2)) | {"schema_version": 3, "basis_ms": 7_000, "command_id": ""}
        await _handle(ex, redis, orjson.dumps(v3))
        assert ex.stats.outcomes == {"applied": 3, "duplicate": 2, "rejected": 1}
        assert int(await redis.hget(desired, "m")) == 6
    finally:
        await redis.aclose()


async def test_an_unsigned_v1_command_is_refused_unless_the_upgrade_setting_is_on(settings: Settings) -> None:
    prefix = settings.topic_prefix
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    ex = ZoneExecutor(
        zone=ZONE,
        prefix=prefix,
        redis=redis,
        backend=SimFleetBackend(redis, prefix, ZONE),
        guard=guard(settings, "m"),  # GOVERNOR_ACCEPT_UNSIGNED_V1 off (the default)
        clock=ScaledClock(),
        results=None,
        results_topic="x",
        block_ms=50,
        probe_interval_s=0,
    )
    try:
        await ex.ensure_group()
        await _handle(ex, redis, _v1_record("scale", "m", 4, 5_000, {}))
        assert ex.stats.outcomes == {"refused_in_bulk": 1}  # no key id: refused with the junk (executors.intake)
        assert await redis.hget(names.desired_replicas(prefix, ZONE), "m") is None
    finally:
        await redis.aclose()
