"""One executor process per zone: Redis stream -> backend -> results topic.

Reads ``<prefix>:commands:<zone>`` with the consumer group ``executors`` (so
several replicas of one zone's executor share the work and a crashed one's
pending commands are claimed by the others) and, for each command:

* ``duplicate`` -- its ``command_id`` was applied before (marker key in Redis);
* ``expired``   -- the clock is past ``expires_at_ms``;
* ``stale``     -- a newer decision for the same (zone, model) was applied, by
  ``basis_ms`` or by HLC: a command whose ``hlc`` is older than the last
  applied HLC of its (zone, ``kind:model``) (hash
  ``<prefix>:executor:<zone>:last_hlc``) is refused with reason ``hlc older
  than last applied``; unstamped commands (``hlc == 0``) skip this check;
* ``advisory`` -- ``governor pause`` set ``<prefix>:paused`` (read before
  each command reaches the backend, so it acts on the next one, no
  restart): acknowledged, not applied, no marker, ``last_basis`` or
  ``last_hlc``; after ``governor resume`` the scaler's reconcile re-issues
  a target the fleet does not show.  Gauge ``governor_executor_paused``;
* ``rejected`` ``budget: ...`` -- above a replica budget (:class:`executors.backends.BudgetExceeded`);
* ``applied`` / ``failed`` -- what the backend did.

Before all of these, :class:`executors.guard.CommandGuard` checks the
command: ``rejected`` -- unsigned, unknown key id, bad signature, a
``command_id`` that does not match its content, an unknown target, a scale
target outside the model's replica bounds, a lifetime above the command TTL,
or a ``basis_ms`` / ``hlc`` / ``apply_at_ms`` too far ahead of this
executor's clock.  A refused command changes nothing but the results topic.

Every outcome is acknowledged (XACK) and reported to the results topic.  A
temporary backend failure leaves the entry pending; it is retried after
``retry_idle_ms``.  While the topic is unavailable, reporting retries with
capped backoff (0.1 s doubling to 5 s) and holds the poll loop.

Outcomes that come after the command: a backend with an ``outcomes_key``
(the sim backend: ``<prefix>:fleet:<zone>:relocated``, where the fleet
reports each relocation it applied or refused) has them relayed to the
results topic as ``record: "relocation_outcome"`` records between two polls,
at least once (:mod:`executors.outcomes`).  The applied marker is written after the backend applied
the command; commands are absolute targets, so the one re-apply a crash in
between can cause is harmless.

Cross-zone timing.  The executor keeps its own hybrid logical clock and
merges every stamped command into it (HLC receive rule); results carry the
command's ``hlc`` and the executor's ``executor_hlc`` after the merge.  A
:class:`~executors.timing.ZoneTiming` probe loop (every ``probe_interval_s``)
estimates the zone's RTT and the clock offset against Redis ``TIME``.

Apply at a compensated time: a command whose ``detail`` has ``apply_at_ms``
(on the shared run clock, i.e. the reference clock) is held until this
executor's clock *corrected by the estimated offset* (``now + offset``; the
offset is Redis minus local, scaled by the clock speed) reaches it, but never
past ``expires_at_ms`` -- if the wait reaches the expiry the command is
refused as ``expired``.  The wait holds this executor's poll loop (commands
of one zone apply in order).  Commands without ``apply_at_ms`` (the default)
apply at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from controllers.hlc import Hlc
from core import names
from core.clock import ScaledClock
from executors.backends import Backend, BackendRejected, BackendUnavailable, BudgetExceeded
from executors.guard import CommandGuard
from executors.outcomes import OutcomeRelay
from executors.timing import ZoneTiming
from streams.commands import Command, CommandError, hlc_stale
from streams.metrics_export import ExecutorMetrics

log = logging.getLogger(__name__)

GROUP = "executors"


def _apply_at(cmd: Command) -> float | None:
    """``detail.apply_at_ms`` of a command, if it carries a numeric one."""
    v = cmd.detail.get("apply_at_ms") if isinstance(cmd.detail, dict) else None
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


@dataclass
class ExecutorStats:
    outcomes: dict[str, int] = field(default_factory=dict)

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


class ZoneExecutor:
    def __init__(
        self,
        *,
        zone: str,
        prefix: str,
        redis: aioredis.Redis,
        backend: Backend,
        guard: CommandGuard,
        clock: ScaledClock,
        results: AIOKafkaProducer | None,
        results_topic: str,
        metrics: ExecutorMetrics | None = None,
        consumer: str | None = None,
        block_ms: int = 200,
        retry_idle_ms: int = 5_000,
        marker_ttl_s: int = 24 * 3600,
        timing: ZoneTiming | None = None,
        probe_interval_s: float = 5.0,
        rtt_factor: float | None = None,
    ) -> None:
        self.zone = zone
        self.prefix = prefix
        self.redis = redis
        self.backend = backend
        self.guard = guard
        self.clock = clock
        self.results = results
        self.results_topic = results_topic
        self.metrics = metrics or ExecutorMetrics()
        self.stream = names.command_stream(prefix, zone)
        self.consumer = consumer or f"{zone}-{socket.gethostname()}-{os.getpid()}"
        self.block_ms = block_ms
        self.retry_idle_ms = retry_idle_ms
        self.marker_ttl_s = marker_ttl_s
        self.stats = ExecutorStats()
        self._stopping = asyncio.Event()
        self.hlc = Hlc()
        self._pause_checked = -1e9  # monotonic seconds of the last gauge refresh
        self.probe_interval_s = probe_interval_s
        self.timing = timing or ZoneTiming(
            zone,
            redis,
            producer=results,
            results_topic=results_topic,
            registry=self.metrics.registry,
            factor=rtt_factor,
        )
        # Outcomes the fleet reports after the command (relocations): relayed to the results topic.
        source = getattr(backend, "outcomes_key", None)
        self.relay = (
            OutcomeRelay(
                redis,
                source,
                names.relocation_inflight(prefix, zone),
                zone=zone,
                backend=backend.name,
                publish=self._report,
                now_ms=clock.now_ms,
            )
            if source and results is not None
            else None
        )

    @property
    def _basis_key(self) -> str:
        return names.executor_last_basis(self.prefix, self.zone)

    @property
    def _hlc_key(self) -> str:
        return names.executor_last_hlc(self.prefix, self.zone)

    async def ensure_group(self) -> None:
        try:
            await self.redis.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        await self.ensure_group()
        log.info("executor %s reading %s as %s", self.zone, self.stream, self.consumer)
        probes = (
            asyncio.create_task(self.timing.run(self.probe_interval_s, self._stopping))
            if self.probe_interval_s > 0
            else None
        )
        delay = 0.1
        try:
            while not self._stopping.is_set():
                try:
                    await self.poll_once()
                    if self.relay is not None:
                        await self.relay.pump()
                    delay = 0.1
                except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                    log.warning("executor %s: redis unavailable (%s); retry in %.1f s", self.zone, exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(5.0, delay * 2)
        finally:
            if probes is not None:
                self._stopping.set()
                await probes

    def corrected_now_ms(self) -> float:
        """This executor's clock corrected to the reference (Redis) clock: ``now + offset``."""
        return self.clock.now_ms() + self.timing.offset_ms() * self.clock.speed

    async def wait_apply_at(self, cmd: Command) -> None:
        """Hold a command with ``detail.apply_at_ms`` until the corrected clock reaches it (or expiry)."""
        apply_at = _apply_at(cmd)
        if apply_at is None:
            return
        target = min(float(apply_at), float(cmd.expires_at_ms))
        while (gap := target - self.corrected_now_ms()) > 0 and not self._stopping.is_set():
            await asyncio.sleep(min(self.clock.to_wall_s(gap), 1.0))

    async def paused(self) -> dict[str, Any] | None:
        """The pause set by ``governor pause`` (``{"reason", "paused_at_ms"}``), or None; sets the gauge."""
        raw = await self.redis.get(names.paused(self.prefix))
        self._pause_checked = time.monotonic()
        self.metrics.paused.labels(self.zone).set(0.0 if raw is None else 1.0)
        if raw is None:
            return None
        try:
            info = orjson.loads(raw)
        except orjson.JSONDecodeError:
            info = None
        return info if isinstance(info, dict) else {"reason": "(unreadable pause record)"}

    async def poll_once(self) -> int:
        """Handle what is pending for too long (ours or a dead peer's), then new entries."""
        handled = 0
        if time.monotonic() - self._pause_checked >= 1.0:
            await self.paused()  # the gauge, at most once a second
        claimed = await self.redis.xautoclaim(
            self.stream, GROUP, self.consumer, min_idle_time=self.retry_idle_ms, start_id="0-0", count=100
        )
        for entry_id, fields in claimed[1] if claimed else []:
            handled += await self.handle(entry_id, fields)
        # redis-py types the reply for every protocol/decoding mode; ours is RESP2, undecoded
        resp = cast(
            "list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes] | None]]]] | None",
            await self.redis.xreadgroup(GROUP, self.consumer, {self.stream: ">"}, count=100, block=self.block_ms),
        )
        for _stream, entries in resp or []:
            for entry_id, fields in entries:
                handled += await self.handle(entry_id, fields)
        return handled

    async def handle(self, entry_id: bytes, fields: dict[bytes, bytes] | None) -> int:
        raw = (fields or {}).get(b"cmd")
        now = self.clock.now_ms()
        try:
            if raw is None:
                raise CommandError("stream entry has no 'cmd' field")
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise CommandError(f"not JSON: {exc}") from exc
            cmd = Command.decode(obj if isinstance(obj, dict) else raw)
            if cmd.zone != self.zone:
                raise CommandError(f"command for zone {cmd.zone!r} on {self.zone!r}'s stream")
        except CommandError as exc:
            await self._finish(
                entry_id, None, "rejected", str(exc), now, {"raw": (raw or b"").decode("utf-8", "replace")[:2000]}
            )
            return 1
        # Authenticity, target, bounds and clock sanity before anything else: a refused
        # command changes no state (not the HLC, last_basis or last_hlc).
        refused = self.guard.check(cmd, obj["schema_version"], now)
        if refused is not None:
            await self._finish(entry_id, cmd, "rejected", refused, now)
            return 1
        if await self.redis.exists(names.applied_marker(self.prefix, self.zone, cmd.command_id)):
            await self._finish(entry_id, cmd, "duplicate", "command_id already applied", now)
            return 1
        if cmd.hlc:
            self.hlc = self.hlc.receive(Hlc.decode(cmd.hlc), now)  # HLC receive rule
            bridged = (fields or {}).get(b"bridged_ms")
            if bridged is not None:
                self.timing.observe_delivery(now - int(bridged))
        if cmd.expired(now):
            self.metrics.expired.labels(self.zone).inc()
            await self._finish(entry_id, cmd, "expired", f"now {now} >= expires_at_ms {cmd.expires_at_ms}", now)
            return 1
        last_hlc = await self.redis.hget(self._hlc_key, cmd.order_field)
        if hlc_stale(cmd.hlc, None if last_hlc is None else int(last_hlc)):
            await self._finish(
                entry_id, cmd, "stale", "hlc older than last applied", now, {"last_hlc": int(last_hlc or 0)}
            )
            return 1
        basis_field = cmd.model if cmd.kind == "scale" else cmd.order_field
        last_basis = await self.redis.hget(self._basis_key, basis_field)
        if last_basis is not None and cmd.basis_ms < int(last_basis):
            await self._finish(
                entry_id, cmd, "stale", f"basis {cmd.basis_ms} older than applied {int(last_basis)}", now
            )
            return 1
        await self.wait_apply_at(cmd)
        if _apply_at(cmd) is not None and cmd.expired(self.clock.now_ms()):
            now = self.clock.now_ms()
            self.metrics.expired.labels(self.zone).inc()
            await self._finish(
                entry_id,
                cmd,
                "expired",
                f"apply_at_ms {_apply_at(cmd)} not reached before expires_at_ms {cmd.expires_at_ms}",
                now,
            )
            return 1
        pause = await self.paused()
        if pause is not None:
            # Kill switch: acknowledged and reported, nothing applied or remembered.
            await self._finish(
                entry_id, cmd, "advisory", f"paused: {pause.get('reason', '')}", self.clock.now_ms(), {"paused": pause}
            )
            return 1
        try:
            detail = await self.backend.apply(cmd)
        except BackendUnavailable as exc:
            log.warning("executor %s: backend unavailable for %s (%s); will retry", self.zone, cmd.command_id, exc)
            return 0  # stays pending; xautoclaim retries it after retry_idle_ms
        except BudgetExceeded as exc:
            await self._finish(entry_id, cmd, "rejected", str(exc), now)
            return 1
        except BackendRejected as exc:
            await self._finish(entry_id, cmd, "failed", str(exc), now)
            return 1
        applied_at = self.clock.now_ms()
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(names.applied_marker(self.prefix, self.zone, cmd.command_id), applied_at, ex=self.marker_ttl_s)
            pipe.hset(self._basis_key, basis_field, cmd.basis_ms)
            if cmd.hlc:
                pipe.hset(self._hlc_key, cmd.order_field, cmd.hlc)
            await pipe.execute()
        self.metrics.latency.labels(self.zone).set(applied_at - cmd.issued_at_ms)
        await self._finish(entry_id, cmd, "applied", "", applied_at, detail)
        return 1

    async def _finish(
        self,
        entry_id: bytes,
        cmd: Command | None,
        outcome: str,
        reason: str,
        now: int,
        detail: dict[str, Any] | None = None,
    ) -> None:
        self.stats.count(outcome)
        self.metrics.outcomes.labels(self.zone, outcome).inc()
        if outcome != "applied":
            log.info("executor %s: %s %s (%s)", self.zone, outcome, cmd.command_id if cmd else entry_id, reason)
        result = {
            "schema_version": 1,
            "zone": self.zone,
            "outcome": outcome,
            "reason": reason,
            "at_ms": now,
            "backend": self.backend.name,
            "detail": detail or {},
            "entry_id": entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id),
        }
        if cmd is not None:
            result.update(
                command_id=cmd.command_id,
                model=cmd.model,
                kind=cmd.kind,
                target_replicas=cmd.target_replicas,  # None for every kind but scale (schema v2)
                issued_at_ms=cmd.issued_at_ms,
                basis_ms=cmd.basis_ms,
                latency_ms=now - cmd.issued_at_ms,
                hlc=cmd.hlc,
                executor_hlc=self.hlc.encode(),
            )
        if self.results is not None:
            await self._report(result)
        await self.redis.xack(self.stream, GROUP, entry_id)

    async def _report(self, result: dict[str, Any]) -> None:
        assert self.results is not None
        delay = 0.1
        while True:
            try:
                await self.results.send_and_wait(self.results_topic, orjson.dumps(result), key=self.zone.encode())
                return
            except Exception as exc:  # noqa: BLE001 - Kafka trouble is temporary: back off
                log.warning("executor %s: results topic unavailable (%s); retry in %.1f s", self.zone, exc, delay)
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)
