"""Authenticated commands against the real Redis: whoever can XADD cannot command the fleet.

A zone executor (sim backend, the suite's signing key) reads forged entries
written straight into its stream: each is read, acknowledged and refused as
``rejected`` with a reason, and the desired state stays as it was.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from controllers.hlc import Hlc
from core import names
from core.clock import ScaledClock
from core.settings import ModelSpec, Settings
from core.signing import Keyring, generate_keys
from executors.backends import SimFleetBackend
from executors.executor import ZoneExecutor
from loop.commands import Command
from tests.integration.harness import guard, sign, signed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ZONE = "az-a"
MODEL = "m"


class _Results:
    """Stands in for the results producer: keeps what the executor reports."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_and_wait(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.sent.append(orjson.loads(value))


def _scale(target: int, basis_ms: int, *, model: str = MODEL, ttl_ms: int = 60_000, hlc: int = 0) -> Command:
    now = int(time.time() * 1000)
    return Command(
        kind="scale",
        zone=ZONE,
        model=model,
        target_replicas=target,
        reason="test",
        issued_at_ms=now,
        expires_at_ms=now + ttl_ms,
        basis_ms=basis_ms,
    ).with_hlc(hlc)


class _Zone:
    def __init__(self, settings: Settings, redis: aioredis.Redis) -> None:
        self.settings = settings
        self.redis = redis
        self.results = _Results()
        prefix = settings.topic_prefix
        self.stream = names.command_stream(prefix, ZONE)
        self.desired = names.desired_replicas(prefix, ZONE)
        self.ex = ZoneExecutor(
            zone=ZONE,
            prefix=prefix,
            redis=redis,
            backend=SimFleetBackend(redis, prefix, ZONE),
            guard=guard(settings, ModelSpec(MODEL, min_replicas=1, max_replicas=16)),
            clock=ScaledClock(),
            results=self.results,  # type: ignore[arg-type]
            results_topic="r",
            block_ms=50,
            probe_interval_s=0,
        )

    async def send(self, raw: bytes) -> dict[str, Any]:
        """XADD ``raw`` to the zone's stream as an attacker would; the executor's result for it."""
        before = len(self.results.sent)
        await self.redis.xadd(self.stream, {"cmd": raw})
        for _ in range(50):
            await self.ex.poll_once()
            if len(self.results.sent) > before:
                assert (await self.redis.xpending(self.stream, "executors"))["pending"] == 0  # acked
                return self.results.sent[-1]
        raise AssertionError(f"not handled: {raw!r}")

    async def replicas(self) -> int | None:
        raw = await self.redis.hget(self.desired, MODEL)
        return None if raw is None else int(raw)


@pytest.fixture
async def zone(settings: Settings):  # type: ignore[no-untyped-def]
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    z = _Zone(settings, redis)
    await z.ex.ensure_group()
    await redis.hset(z.desired, MODEL, 3)
    try:
        yield z
    finally:
        await redis.aclose()


def _bulk(res: dict[str, Any]) -> str:
    """The reason of an entry refused in bulk for want of a valid key id (:mod:`executors.intake`)."""
    assert (res["record"], res["outcome"], res["count"]) == ("refused_batch", "rejected", 1), res
    (reason,) = res["detail"]["reasons"]
    return str(reason)


async def test_an_unsigned_entry_xadded_straight_into_the_stream_is_refused(zone: _Zone) -> None:
    forged = _scale(12, basis_ms=1_000)
    res = await zone.send(forged.encode())  # no key_id, no signature
    assert _bulk(res) == "unsigned command" and res["detail"]["samples"][0]["reason"] == "unsigned command"
    assert await zone.replicas() == 3
    # Hand-written JSON, signature fields made up: refused all the same.
    obj = orjson.loads(forged.encode()) | {"key_id": "k", "signature": "00" * 32}
    res = await zone.send(orjson.dumps(obj))
    assert _bulk(res) == "unknown key id"
    assert await zone.replicas() == 3
    assert zone.ex.stats.outcomes == {"refused_in_bulk": 2}
    assert await zone.redis.hgetall(names.executor_last_result(zone.settings.topic_prefix, ZONE)) == {}


async def test_a_forged_100000_replica_scale_for_an_unknown_model_is_refused(zone: _Zone) -> None:
    forged = _scale(100_000, basis_ms=1_000, model="gpt-x")
    res = await zone.send(forged.encode())
    assert _bulk(res) == "unsigned command"
    # Even signed with the deployment's key (a compromised worker), the target is checked.
    res = await zone.send(signed(zone.settings, forged))
    assert res["outcome"] == "rejected"
    assert res["reason"] == "unknown model 'gpt-x' for scale (not in GOVERNOR_MODELS)"
    assert await zone.redis.hget(zone.desired, "gpt-x") is None and await zone.replicas() == 3


async def test_a_far_future_basis_signed_with_a_wrong_key_is_refused_and_the_next_command_applies(
    zone: _Zone,
) -> None:
    wrong = Keyring.parse(generate_keys())
    forged = _scale(1, basis_ms=2**62).signed(wrong)
    res = await zone.send(forged.encode())
    assert _bulk(res) == "unknown key id"
    # Same key id as the deployment's, other key material: a bad signature.
    ring = zone.settings.keyring()
    assert ring is not None
    impostor = Keyring(active=ring.active, keys={ring.active: bytes(32)})
    res = await zone.send(forged.signed(impostor).encode())
    assert res["outcome"] == "rejected" and res["reason"] == f"bad signature (key id {ring.active})"
    # Signed with the right key, a basis that far ahead is refused as clock skew.
    res = await zone.send(signed(zone.settings, forged))
    assert res["outcome"] == "rejected" and res["reason"].startswith(f"basis_ms {2**62} is more than")
    # Refusals touch no order state: the next real command is not stale.
    assert await zone.redis.hget(names.executor_last_basis(zone.settings.topic_prefix, ZONE), MODEL) is None
    real = _scale(5, basis_ms=int(time.time() * 1000) - 1_000, hlc=Hlc(int(time.time() * 1000), 0).encode())
    res = await zone.send(signed(zone.settings, real))
    assert res["outcome"] == "applied", res
    assert await zone.replicas() == 5


async def test_far_future_hlc_and_apply_at_are_refused(zone: _Zone) -> None:
    now = int(time.time() * 1000)
    res = await zone.send(signed(zone.settings, _scale(4, basis_ms=1, hlc=Hlc(now + 3_600_000, 0).encode())))
    assert res["outcome"] == "rejected" and res["reason"].startswith("hlc ")
    at = Command.decode(orjson.loads(_scale(4, basis_ms=2).encode()) | {"detail": {"apply_at_ms": now + 3_600_000}})
    res = await zone.send(signed(zone.settings, at))
    assert res["outcome"] == "rejected" and res["reason"].startswith("detail.apply_at_ms ")
    assert await zone.replicas() == 3
    # The forged HLC did not move the executor's clock or the last applied HLC.
    assert zone.ex.hlc.encode() >> 16 < now + 3_600_000
    assert await zone.redis.hgetall(names.executor_last_hlc(zone.settings.topic_prefix, ZONE)) == {}


async def test_an_issued_at_ten_years_ahead_is_refused(zone: _Zone) -> None:
    # Issue 31 item 7: basis and HLC ordinary, a lifetime within the TTL, issued ten years from now.
    now = int(time.time() * 1000)
    ahead = now + 10 * 365 * 86_400_000
    cmd = Command.decode(
        orjson.loads(_scale(9, basis_ms=now).encode()) | {"issued_at_ms": ahead, "expires_at_ms": ahead + 60_000}
    )
    res = await zone.send(signed(zone.settings, cmd))
    assert res["outcome"] == "rejected", res
    assert res["reason"].startswith(f"issued_at_ms {ahead} is more than GOVERNOR_MAX_CLOCK_SKEW_S=30 ahead")
    assert await zone.replicas() == 3


async def test_a_signed_scale_above_max_replicas_is_refused_with_the_reason(zone: _Zone) -> None:
    res = await zone.send(signed(zone.settings, _scale(17, basis_ms=1_000)))
    assert res["outcome"] == "rejected"
    assert res["reason"] == "target_replicas 17 outside m's [min_replicas 1, max_replicas 16]"
    res = await zone.send(signed(zone.settings, _scale(0, basis_ms=1_000)))
    assert res["outcome"] == "rejected" and "outside" in res["reason"]
    assert await zone.replicas() == 3


async def test_a_long_lived_or_mislabelled_command_is_refused(zone: _Zone) -> None:
    res = await zone.send(signed(zone.settings, _scale(4, basis_ms=1_000, ttl_ms=3_600_000)))
    assert res["outcome"] == "rejected" and "above the command TTL" in res["reason"]
    # A signed command whose command_id is not the one of its decision (it would dodge the duplicate check).
    relabelled = sign(zone.settings, Command.decode(orjson.loads(_scale(4, 1_000).encode()) | {"command_id": "x"}))
    res = await zone.send(relabelled.encode())
    assert res["outcome"] == "rejected" and res["reason"].startswith("command_id 'x' does not match")
    assert await zone.replicas() == 3


async def test_a_replayed_signed_entry_ends_as_duplicate(zone: _Zone) -> None:
    entry = signed(zone.settings, _scale(6, basis_ms=1_000, hlc=Hlc(int(time.time() * 1000), 0).encode()))
    assert (await zone.send(entry))["outcome"] == "applied"
    replay = await zone.send(entry)
    assert (replay["outcome"], replay["reason"]) == (
        "duplicate",
        "command_id already applied (or reported advisory while paused)",
    )
    assert await zone.replicas() == 6
