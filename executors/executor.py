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
* ``rejected`` ``budget: ...`` / ``no backend for ...`` -- refused by a backend (:class:`~executors.errors.BackendRefused`);
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

Nothing stops the loop.  Any entry, however malformed, ends as a result and
an XACK (:mod:`executors.entry`: decoding errors are ``rejected``, an
unexpected error while handling one is ``failed``, reason ``internal
error: ...``; :meth:`ZoneExecutor.handle` never raises); an entry delivered
more than ``max_deliveries`` times (``GOVERNOR_MAX_DELIVERIES``, XPENDING's
counter) ends as ``failed``, reason ``delivery limit``; echoed entries and
results are capped, a result refused as too large is dropped and counted
(:mod:`executors.results`); ``last_basis`` / ``last_hlc`` only get
validated ints, and a stored non-int counts as absent (logged); Redis loss,
restarts and ``NOGROUP`` are retried (:mod:`executors.loop`); a heartbeat
key shows the executor alive (:mod:`executors.heartbeat`).

Outcomes that come after the command (relocations) are relayed to the
results topic between two polls (:mod:`executors.outcomes`).  The applied marker is written after the backend applied
the command; commands are absolute targets, so the one re-apply a crash in
between can cause is harmless.

Cross-zone timing.  The executor keeps its own hybrid logical clock and
merges every stamped command into it (HLC receive rule); results carry the
command's ``hlc`` and the executor's ``executor_hlc`` after the merge.  A
:class:`~executors.timing.ZoneTiming` probe loop (every ``probe_interval_s``)
estimates the zone's RTT and the clock offset against Redis ``TIME``.

Apply at a compensated time: a command whose ``detail`` has ``apply_at_ms``
is held (:func:`executors.timing.hold_until`, see there) holding the poll loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from typing import Any, cast

import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer
from redis.exceptions import ResponseError

from controllers.hlc import Hlc
from core import names
from core.clock import ScaledClock
from executors.backends import Backend, BackendRefused, BackendRejected, BackendUnavailable, applied_by
from executors.entry import apply_at, decode_entry, echo, stored_int, valid_int
from executors.guard import CommandGuard
from executors.heartbeat import Heartbeat
from executors.loop import TRANSPORT, is_nogroup, retry_until_ok, run_until_stopped
from executors.outcomes import OutcomeRelay
from executors.results import ExecutorStats, ResultPublisher, result_record
from executors.timing import ZoneTiming, hold_until
from streams.commands import Command, CommandError, hlc_stale
from streams.metrics_export import ExecutorMetrics

log = logging.getLogger(__name__)

GROUP = "executors"


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
        max_deliveries: int = 5,
        heartbeat_s: float = 5.0,
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
        self._basis_key, self._hlc_key = names.executor_last_basis(prefix, zone), names.executor_last_hlc(prefix, zone)
        self.consumer = consumer or f"{zone}-{socket.gethostname()}-{os.getpid()}"
        self.executor_id = f"{self.consumer}-{uuid.uuid4().hex[:8]}"
        self.block_ms = block_ms
        self.retry_idle_ms = retry_idle_ms
        self.marker_ttl_s = marker_ttl_s
        self.max_deliveries = max_deliveries
        self.stats = ExecutorStats()
        self._stopping = asyncio.Event()
        self._transport_error: BaseException | None = None  # met inside handle(); poll_once re-raises it
        self.hlc = Hlc()
        self._pause_checked = -1e9  # monotonic seconds of the last gauge refresh
        self.probe_interval_s = probe_interval_s
        reg = self.metrics.registry
        self.publisher = ResultPublisher(results, results_topic, zone, reg)
        self.timing = timing or ZoneTiming(
            zone, redis, producer=results, results_topic=results_topic, registry=reg, factor=rtt_factor
        )
        self.heartbeat = Heartbeat(redis, prefix, zone, self.executor_id, backend.name, heartbeat_s, clock.now_ms, reg)
        # Outcomes the fleet reports after the command (relocations): relayed to the results topic.
        source, by = getattr(backend, "outcomes_key", None), applied_by(backend, "relocate")
        inflight = names.relocation_inflight(prefix, zone)
        self.relay = None
        if source and results is not None:
            self.relay = OutcomeRelay(
                redis, source, inflight, zone=zone, backend=by, publish=self._report, now_ms=clock.now_ms
            )

    async def ensure_group(self) -> None:
        try:
            await self.redis.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def stop(self) -> None:
        self._stopping.set()

    @property
    def stopping(self) -> asyncio.Event:
        return self._stopping

    async def _step(self) -> None:
        await self.poll_once()
        if self.relay is not None:
            await self.relay.pump()

    async def run(self) -> None:
        """Poll until stopped; survives Redis loss, restarts and NOGROUP (:mod:`executors.loop`)."""
        tasks = [asyncio.create_task(self.heartbeat.run(self._stopping))]
        if self.probe_interval_s > 0:
            tasks.append(asyncio.create_task(self.timing.run(self.probe_interval_s, self._stopping)))
        what = f"executor {self.zone}"
        try:
            if await retry_until_ok(self.ensure_group, f"{what}: group on {self.stream}", self._stopping):
                log.info("executor %s reading %s as %s", self.zone, self.stream, self.consumer)
                await run_until_stopped(self._step, what, self._stopping, self.ensure_group)
        finally:
            self._stopping.set()
            await asyncio.gather(*tasks, return_exceptions=True)

    def corrected_now_ms(self) -> float:
        """This executor's clock corrected to the reference (Redis) clock: ``now + offset``."""
        return self.clock.now_ms() + self.timing.offset_ms() * self.clock.speed

    async def wait_apply_at(self, cmd: Command) -> None:
        """Hold a command with ``detail.apply_at_ms`` until the corrected clock reaches it, but never
        past its expiry nor longer than ``GOVERNOR_MAX_CLOCK_SKEW_S`` of wall time (or stop)."""
        at, now = apply_at(cmd), self.clock.now_ms()
        if at is None:
            return
        room_ms = min(self.guard.settings.max_clock_skew_s * 1000 * self.clock.speed, cmd.expires_at_ms - now)
        target = min(at, float(cmd.expires_at_ms))
        if not await hold_until(
            target, self.corrected_now_ms, self.clock.to_wall_s, self.clock.to_wall_s(room_ms), self._stopping
        ):
            log.info("executor %s: %s held %.0f ms, apply_at_ms %s not reached", self.zone, cmd.command_id, room_ms, at)

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

    def _check_transport(self) -> None:
        exc, self._transport_error = self._transport_error, None
        if exc is not None:
            raise exc

    async def _deliveries(self, entry_id: bytes) -> int:
        """How many times ``entry_id`` was delivered (XPENDING; 1 when it is not pending)."""
        info = await self.redis.xpending_range(self.stream, GROUP, min=entry_id, max=entry_id, count=1)
        n = info[0].get("times_delivered") if info else None
        return n if isinstance(n, int) else 1

    async def poll_once(self) -> int:
        """Handle what is pending for too long (ours or a dead peer's), then new entries."""
        handled = 0
        if time.monotonic() - self._pause_checked >= 1.0:
            await self.paused()  # the gauge, at most once a second
        claimed = await self.redis.xautoclaim(
            self.stream, GROUP, self.consumer, min_idle_time=self.retry_idle_ms, start_id="0-0", count=100
        )
        for entry_id, fields in claimed[1] if claimed else []:
            handled += await self.handle(entry_id, fields, await self._deliveries(entry_id))
            self._check_transport()
        # redis-py types the reply for every protocol/decoding mode; ours is RESP2, undecoded
        resp = cast(
            "list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes] | None]]]] | None",
            await self.redis.xreadgroup(GROUP, self.consumer, {self.stream: ">"}, count=100, block=self.block_ms),
        )
        for _stream, entries in resp or []:
            for entry_id, fields in entries:
                handled += await self.handle(entry_id, fields)
                self._check_transport()
        return handled

    async def handle(self, entry_id: bytes | str, fields: Any, deliveries: int = 1) -> int:
        """Handle one stream entry; 1 when it was acknowledged, 0 when it stays pending.  Never raises:
        Redis transport errors leave the entry pending (and make :meth:`poll_once` back off)."""
        try:
            return await self._handle(entry_id, fields, deliveries)
        except TRANSPORT as exc:
            self._transport_error = exc
            return 0
        except Exception as exc:  # noqa: BLE001 - one bad entry must not stop the executor
            log.exception("executor %s: entry %r failed unexpectedly", self.zone, entry_id)
            raw = fields.get(b"cmd") if isinstance(fields, dict) else fields
            why = f"internal error: {type(exc).__name__}: {echo(str(exc), 500)}"
            try:
                await self._finish(entry_id, None, "failed", why, self.clock.now_ms(), {"raw": echo(raw or b"")})
            except TRANSPORT as again:
                self._transport_error = again
                return 0
            except Exception:  # noqa: BLE001 - the delivery limit ends it later
                log.exception("executor %s: entry %r could not be ended", self.zone, entry_id)
                return 0
            return 1

    async def _stored(self, key: str, name: str) -> int | None:
        raw = await self.redis.hget(key, name)
        value = stored_int(raw)
        if raw is not None and value is None:
            log.warning("executor %s: %s[%s] holds %s, not an int; ignored", self.zone, key, name, echo(raw, 80))
        return value

    async def _handle(self, entry_id: bytes | str, fields: Any, deliveries: int) -> int:
        raw = fields.get(b"cmd") if isinstance(fields, dict) else None
        now = self.clock.now_ms()
        if deliveries > self.max_deliveries:
            detail = {"deliveries": deliveries, "max_deliveries": self.max_deliveries, "raw": echo(raw or b"")}
            await self._finish(entry_id, None, "failed", "delivery limit", now, detail)
            return 1
        try:
            obj, cmd = decode_entry(fields)
            if cmd.zone != self.zone:
                raise CommandError(f"command for zone {cmd.zone!r} on {self.zone!r}'s stream")
        except CommandError as exc:
            await self._finish(entry_id, None, "rejected", echo(str(exc), 2000), now, {"raw": echo(raw or b"")})
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
            bridged = stored_int(fields.get(b"bridged_ms"))
            if bridged is not None and 0 < now - bridged < 3_600_000:  # unsigned: only a plausible delay
                self.timing.observe_delivery(now - bridged)
        if cmd.expired(now):
            self.metrics.expired.labels(self.zone).inc()
            await self._finish(entry_id, cmd, "expired", f"now {now} >= expires_at_ms {cmd.expires_at_ms}", now)
            return 1
        last_hlc = await self._stored(self._hlc_key, cmd.order_field)
        if hlc_stale(cmd.hlc, last_hlc):
            await self._finish(entry_id, cmd, "stale", "hlc older than last applied", now, {"last_hlc": last_hlc})
            return 1
        basis_field = cmd.model if cmd.kind == "scale" else cmd.order_field
        last_basis = await self._stored(self._basis_key, basis_field)
        if last_basis is not None and cmd.basis_ms < last_basis:
            await self._finish(entry_id, cmd, "stale", f"basis {cmd.basis_ms} older than applied {last_basis}", now)
            return 1
        await self.wait_apply_at(cmd)
        if apply_at(cmd) is not None and cmd.expired(self.clock.now_ms()):
            self.metrics.expired.labels(self.zone).inc()
            why = f"apply_at_ms {apply_at(cmd)} not reached before expires_at_ms {cmd.expires_at_ms}"
            await self._finish(entry_id, cmd, "expired", why, self.clock.now_ms())
            return 1
        pause = await self.paused()
        if pause is not None:
            # Kill switch: acknowledged and reported, nothing applied or remembered.
            why = f"paused: {echo(pause.get('reason', ''), 500)}"
            await self._finish(entry_id, cmd, "advisory", why, self.clock.now_ms(), {"paused": pause})
            return 1
        try:
            detail = await self.backend.apply(cmd)
        except BackendUnavailable as exc:
            log.warning("executor %s: backend unavailable for %s (%s); will retry", self.zone, cmd.command_id, exc)
            return 0  # stays pending; xautoclaim retries it after retry_idle_ms, up to max_deliveries
        except BackendRefused as exc:
            await self._finish(entry_id, cmd, "rejected", str(exc), now)
            return 1
        except BackendRejected as exc:
            await self._finish(entry_id, cmd, "failed", str(exc), now)
            return 1
        applied_at = self.clock.now_ms()
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(names.applied_marker(self.prefix, self.zone, cmd.command_id), applied_at, ex=self.marker_ttl_s)
            if valid_int(cmd.basis_ms):
                pipe.hset(self._basis_key, basis_field, cmd.basis_ms)
            if cmd.hlc and valid_int(cmd.hlc):
                pipe.hset(self._hlc_key, cmd.order_field, cmd.hlc)
            await pipe.execute()
        self.metrics.latency.labels(self.zone).set((applied_at - cmd.issued_at_ms) / 1000.0)
        await self._finish(entry_id, cmd, "applied", "", applied_at, detail)
        return 1

    async def _finish(
        self,
        entry_id: bytes | str,
        cmd: Command | None,
        outcome: str,
        reason: str,
        now: int,
        detail: dict[str, Any] | None = None,
    ) -> None:
        self.stats.count(outcome)
        self.metrics.outcomes.labels(self.zone, outcome).inc()
        if outcome != "applied":
            cid, model, end = (cmd.command_id, cmd.model, cmd.basis_ms) if cmd else (entry_id, None, None)
            ctx = {"zone": self.zone, "command_id": cid, "model": model, "window_end_ms": end}
            log.info("executor %s: %s %s (%s)", self.zone, outcome, cid, echo(reason, 500), extra=ctx)
        result = result_record(
            zone=self.zone,
            backend=applied_by(self.backend, cmd.kind if cmd else None),
            entry_id=entry_id,
            cmd=cmd,
            outcome=outcome,
            reason=reason,
            now=now,
            detail=detail,
            executor_hlc=self.hlc.encode(),
        )
        if self.results is not None:
            await self._report(result)
        if cmd is not None:  # ``governor status``: the last result per model (names.executor_last_result)
            last = {k: result.get(k) for k in ("command_id", "kind", "outcome", "reason", "at_ms", "target_replicas")}
            try:
                await self.redis.hset(names.executor_last_result(self.prefix, self.zone), cmd.model, orjson.dumps(last))
            except Exception as exc:  # noqa: BLE001 - operator view only, never stops the executor
                log.warning("executor %s: last result of %s not kept (%s)", self.zone, cmd.model, exc)
        try:
            await self.redis.xack(self.stream, GROUP, entry_id)
        except ResponseError as exc:
            if not is_nogroup(exc):
                raise
            log.warning("executor %s: entry %r not acked, its group is gone (%s)", self.zone, entry_id, exc)

    async def _report(self, result: dict[str, Any]) -> None:
        await self.publisher.publish(result)
