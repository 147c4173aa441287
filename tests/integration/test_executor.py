"""Zone executor against the real Redis and Kafka: once-only application."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import cast

import orjson
import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from controllers.hlc import Hlc
from core import names
from core.clock import ScaledClock
from core.settings import Settings
from executors.backends import BackendUnavailable, DryRunBackend, SimFleetBackend
from executors.executor import ZoneExecutor
from launch.topics import ensure_topics
from loop.commands import Command
from tests.integration.harness import guard, signed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _cmd(target: int, basis_ms: int, *, ttl_ms: int = 60_000, issued: int | None = None) -> Command:
    issued = issued if issued is not None else int(time.time() * 1000)
    return Command(
        kind="scale",
        zone="az-a",
        model="m",
        target_replicas=target,
        reason="test",
        issued_at_ms=issued,
        expires_at_ms=issued + ttl_ms,
        basis_ms=basis_ms,
    )


async def wait_for(predicate: Callable[[], bool | Awaitable[bool]], timeout_s: float, interval_s: float = 0.02) -> bool:
    """Evaluate ``predicate`` (sync or async) until it is true or ``timeout_s`` has
    passed; returns whether it came true.  For waiting on an event, not a duration."""
    deadline = time.monotonic() + timeout_s
    while True:
        ok = predicate()
        if inspect.isawaitable(ok):
            ok = await ok
        if ok:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval_s)


async def _results(settings: Settings, n: int, timeout_s: float = 20, until_id: str | None = None) -> list[dict]:
    """The results topic from its start: ``n`` records, or up to the result of ``until_id`` when given."""
    consumer = AIOKafkaConsumer(
        settings.topic("results"),
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
    )
    await consumer.start()
    out: list[dict] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(out) < n and time.monotonic() < deadline:
            if until_id is not None and any(r.get("command_id") == until_id for r in out):
                break
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
    ex = ZoneExecutor(
        zone="az-a",
        prefix=settings.topic_prefix,
        redis=redis,
        backend=backend,
        guard=guard(settings, "m"),
        clock=ScaledClock(),
        results=producer,
        results_topic=settings.topic("results"),
        block_ms=50,
    )
    await ex.ensure_group()
    return ex, producer, redis


async def test_same_command_delivered_twice_is_applied_once(settings: Settings) -> None:
    backend = DryRunBackend()
    ex, producer, redis = await _executor(settings, backend)
    try:
        cmd = _cmd(5, basis_ms=1_000)
        key = names.command_stream(settings.topic_prefix, "az-a")
        # At-least-once upstream: the bridge may write the same command twice.
        await redis.xadd(key, {"cmd": signed(settings, cmd)})
        await redis.xadd(key, {"cmd": signed(settings, cmd)})
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
        key = names.command_stream(settings.topic_prefix, "az-a")
        now = int(time.time() * 1000)
        newer, older = _cmd(6, basis_ms=20_000), _cmd(3, basis_ms=10_000)
        expired = _cmd(9, basis_ms=30_000, issued=now - 120_000, ttl_ms=60_000)
        for c in (newer, older, expired):
            await ex.handle(await redis.xadd(key, {"cmd": signed(settings, c)}), {b"cmd": signed(settings, c)})
        assert [c.target_replicas for c in backend.applied] == [6]
        outcomes = {r["command_id"]: r["outcome"] for r in await _results(settings, 3)}
        assert outcomes == {newer.command_id: "applied", older.command_id: "stale", expired.command_id: "expired"}
    finally:
        await producer.stop()
        await redis.aclose()


async def test_malformed_entry_is_rejected_and_acknowledged(settings: Settings) -> None:
    ex, producer, redis = await _executor(settings, DryRunBackend())
    try:
        key = names.command_stream(settings.topic_prefix, "az-a")
        # The deployment's key id (else it is junk, refused in bulk: executors.intake), fields missing.
        kid = ex.guard.keyring.active
        await redis.xadd(key, {"cmd": b'{"kind": "scale", "zone": "az-a", "key_id": "%s"}' % kid.encode()})
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
        key = names.command_stream(settings.topic_prefix, "az-a")
        await redis.xadd(key, {"cmd": signed(settings, cmd)})
        assert await ex.poll_once() == 0  # backend down: left pending, not acknowledged
        assert (await redis.xpending(key, "executors"))["pending"] == 1 and backend.failures == 0
        # The entry was delivered already, so XREADGROUP '>' cannot return it again: only
        # XAUTOCLAIM can, once it has been idle for retry_idle_ms.  Poll until that happens.
        handled: list[int] = []

        async def retried() -> bool:
            handled.append(await ex.poll_once())
            return handled[-1] == 1

        assert await wait_for(retried, timeout_s=10), handled  # claimed again and applied
        assert (await redis.xpending(key, "executors"))["pending"] == 0
        assert int(await redis.hget(names.desired_replicas(settings.topic_prefix, "az-a"), "m")) == 4
        (res,) = await _results(settings, 1)
        assert res["outcome"] == "applied"
    finally:
        await producer.stop()
        await redis.aclose()
        await redis_probe.aclose()


async def test_older_hlc_after_newer_is_refused_stale(settings: Settings) -> None:
    from controllers.hlc import Hlc

    backend = DryRunBackend()
    ex, producer, redis = await _executor(settings, backend)
    try:
        key = names.command_stream(settings.topic_prefix, "az-a")
        now = int(time.time() * 1000)
        # Same basis (so the basis rule cannot tell them apart); HLC orders them.
        newer = _cmd(6, basis_ms=10_000).with_hlc(Hlc(now, 1).encode())
        older = _cmd(3, basis_ms=10_000).with_hlc(Hlc(now, 0).encode())
        legacy = _cmd(7, basis_ms=10_000)  # unstamped: skips the HLC check
        for c in (newer, older, legacy):
            await ex.handle(
                await redis.xadd(key, {"cmd": signed(settings, c), "bridged_ms": str(now).encode()}),
                {b"cmd": signed(settings, c), b"bridged_ms": str(now).encode()},
            )
        assert [c.target_replicas for c in backend.applied] == [6, 7]
        results = {r["command_id"]: r for r in await _results(settings, 3)}
        assert results[older.command_id]["outcome"] == "stale"
        assert results[older.command_id]["reason"] == "hlc older than last applied"
        assert results[newer.command_id]["outcome"] == "applied"
        assert results[legacy.command_id]["outcome"] == "applied"
        assert int(await redis.hget(f"{settings.topic_prefix}:executor:az-a:last_hlc", "scale:m")) == newer.hlc
        # Receive rule: the executor's HLC is past every stamp it merged.
        assert results[older.command_id]["executor_hlc"] > newer.hlc
        assert Hlc.decode(ex.hlc.encode()) > Hlc.decode(newer.hlc)
    finally:
        await producer.stop()
        await redis.aclose()


async def test_probe_loop_estimates_rtt_and_clock_offset(settings: Settings) -> None:
    ex, producer, redis = await _executor(settings, DryRunBackend())
    ex.probe_interval_s = 0.05
    try:
        task = asyncio.create_task(ex.run())
        await wait_for(lambda: ex.timing.probes >= 6, timeout_s=10)
        ex.stop()
        await asyncio.wait_for(task, 10)
        t = ex.timing
        assert t.probes >= 6
        base = t.rtt.base_ms("az-a")
        assert 0 < base < 50, base
        # Same host: Redis TIME and the local clock agree within a few ms.
        assert abs(t.offset_ms()) < 5, t.offset_ms()
        assert t.offset.error_bound_ms() < 25
        reg = ex.metrics.registry
        assert reg.get_sample_value("governor_zone_rtt_ms", {"zone": "az-a", "path": "redis"}) > 0
        assert reg.get_sample_value("governor_zone_clock_offset_ms", {"zone": "az-a"}) is not None
        assert reg.get_sample_value("governor_zone_rtt_ms", {"zone": "az-a", "path": "kafka"}) > 0
        timing = [r for r in await _results(settings, 6) if r.get("record") == "timing"]
        assert len(timing) >= 6 and all(r["outcome"] == "timing" and r["zone"] == "az-a" for r in timing)
        assert any(r["kafka_rtt_ms"] for r in timing)
        print(
            f"\nembedded redis: base rtt {base:.3f} ms, offset {t.offset_ms():.3f} ms "
            f"(+/- {t.offset.error_bound_ms():.3f}), kafka rtt {t.kafka_rtt_ms:.3f} ms"
        )
    finally:
        await producer.stop()
        await redis.aclose()


async def test_apply_at_waits_for_the_compensated_time(settings: Settings) -> None:
    backend = DryRunBackend()
    ex, producer, redis = await _executor(settings, backend)
    try:
        await ex.timing.probe_once()
        now = int(time.time() * 1000)
        cmd = Command(
            kind="scale",
            zone="az-a",
            model="m",
            target_replicas=2,
            reason="t",
            issued_at_ms=now,
            expires_at_ms=now + 60_000,
            basis_ms=1,
            detail={"apply_at_ms": now + 300},
        )
        key = names.command_stream(settings.topic_prefix, "az-a")
        await redis.xadd(key, {"cmd": signed(settings, cmd)})
        assert await ex.poll_once() == 0  # held, its entry pending
        assert backend.applied == [] and cmd.order_field in ex.held
        assert await wait_for(lambda: _poll_until(ex, lambda: bool(backend.applied)), 5)
        assert [c.target_replicas for c in backend.applied] == [2]
        # Not before its time by the executor's corrected clock.
        assert ex.corrected_now_ms() >= now + 300
        # An apply_at past the expiry waits only until the expiry, then is refused as expired.
        late = Command(
            kind="scale",
            zone="az-a",
            model="m",
            target_replicas=3,
            reason="t",
            issued_at_ms=now,
            expires_at_ms=int(time.time() * 1000) + 200,
            basis_ms=2,
            detail={"apply_at_ms": now + 5_000},  # within GOVERNOR_MAX_CLOCK_SKEW_S, past the expiry
        )
        await redis.xadd(key, {"cmd": signed(settings, late)})
        assert await wait_for(lambda: _poll_until(ex, lambda: not ex.held), 5)
        assert [c.target_replicas for c in backend.applied] == [2]
        outcomes = {r.get("command_id"): r["outcome"] for r in await _results(settings, 3)}
        assert outcomes[cmd.command_id] == "applied" and outcomes[late.command_id] == "expired"
    finally:
        await producer.stop()
        await redis.aclose()


async def _poll_until(ex: ZoneExecutor, done: Callable[[], bool]) -> bool:
    await ex.poll_once()
    return done()


def _stamped(model: str, target: int, hlc_ms: int, apply_in_ms: int | None = None) -> Command:
    """A scale of ``model`` whose basis and HLC are ``hlc_ms``, held ``apply_in_ms`` when given."""
    c = _cmd(target, hlc_ms)
    detail = {} if apply_in_ms is None else {"apply_at_ms": c.issued_at_ms + apply_in_ms}
    return replace(c, model=model, detail=detail, command_id="").with_hlc(Hlc(hlc_ms, 0).encode())


async def test_a_held_command_holds_only_itself_and_a_newer_one_supersedes_it(settings: Settings) -> None:
    """Issue 31 item 7: an apply_at_ms 20 s ahead held the zone's whole loop for 20 s."""
    ex, producer, redis = await _executor(settings, DryRunBackend())
    ex.guard = guard(settings, "m", "m2")
    backend = cast(DryRunBackend, ex.backend)
    key = names.command_stream(settings.topic_prefix, "az-a")
    t = int(time.time() * 1000)
    try:
        held = _stamped("m", 5, t, apply_in_ms=20_000)
        await redis.xadd(key, {"cmd": signed(settings, held)})
        other = _stamped("m2", 7, t + 1)
        await redis.xadd(key, {"cmd": signed(settings, other)})
        # The other model's command applies while the first waits for its apply_at_ms.
        assert await wait_for(lambda: _poll_until(ex, lambda: bool(backend.applied)), 5)
        assert [(c.model, c.target_replicas) for c in backend.applied] == [("m2", 7)]
        assert list(ex.held) == ["scale:m"] and (await redis.xpending(key, "executors"))["pending"] == 1
        # A later command for the same model (newer HLC) supersedes the held one.
        newer = _stamped("m", 9, t + 2)
        await redis.xadd(key, {"cmd": signed(settings, newer)})
        assert await wait_for(lambda: _poll_until(ex, lambda: len(backend.applied) == 2), 5)
        assert [(c.model, c.target_replicas) for c in backend.applied] == [("m2", 7), ("m", 9)]
        assert ex.held == {} and (await redis.xpending(key, "executors"))["pending"] == 0
        # A held command, then an older one for its model: the older one is stale, the held one stays.
        later = _stamped("m", 4, t + 10, apply_in_ms=20_000)
        older = _stamped("m", 3, t + 5)
        for c in (later, older):
            await redis.xadd(key, {"cmd": signed(settings, c)})
        assert await wait_for(lambda: _poll_until(ex, lambda: ex.stats.outcomes.get("stale", 0) == 2), 5)
        assert list(ex.held) == ["scale:m"] and ex.held["scale:m"].cmd.command_id == later.command_id
        outcomes = {r.get("command_id"): (r["outcome"], r["reason"]) for r in await _results(settings, 4)}
        assert outcomes[held.command_id] == ("stale", f"superseded by {newer.command_id}")
        assert outcomes[older.command_id] == ("stale", f"older than held {later.command_id}")
        assert outcomes[other.command_id][0] == outcomes[newer.command_id][0] == "applied"
        assert later.command_id not in outcomes  # still held, its entry pending for the next executor
        assert (await redis.xpending(key, "executors"))["pending"] == 1
    finally:
        await producer.stop()
        await redis.aclose()
