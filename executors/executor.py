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
  restart): acknowledged, not applied, no ``last_basis`` or ``last_hlc``;
  its marker is set, so a replay after ``governor resume`` is a
  ``duplicate``, and the scaler's reconcile re-issues (a new decision, a
  new ``command_id``) a target the fleet does not show.  Gauge
  ``governor_executor_paused``;
* ``rejected`` ``budget: ...`` / ``no backend for ...`` -- refused by a backend (:class:`~executors.errors.BackendRefused`);
* ``applied`` / ``failed`` -- what the backend did.

Before anything else, :class:`executors.intake.Intake` screens each batch
read: entries with no valid key id (unsigned, an unknown key id, not a JSON
object) are acknowledged with one ``XACK`` and reported as one summary
record per batch, counted on ``governor_executor_entries_refused_total``, so
a flood of junk entries cannot delay a real command past its TTL.

Then :class:`executors.guard.CommandGuard` checks the
command: ``rejected`` -- unsigned, unknown key id, bad signature, a
``command_id`` that does not match its content, an unknown target, a scale
target outside the model's replica bounds, a lifetime above the command TTL,
or an ``issued_at_ms`` / ``basis_ms`` / ``hlc`` / ``apply_at_ms`` too far ahead of this
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
is held (:class:`executors.timing.Held`, see there), its entry pending; the
poll loop goes on meanwhile, and a later command for the same ``kind:model``
supersedes it by the HLC rule.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable
from typing import Any, cast

import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer
from redis.exceptions import ResponseError

from controllers.hlc import Hlc
from core import names
from core.clock import ScaledClock
from core.defaults import HEARTBEAT_S, MAX_DELIVERIES
from executors.backends import Backend, BackendRefused, BackendRejected, BackendUnavailable, applied_by
from executors.entry import apply_at, decode_entry, echo, stored_int, valid_int
from executors.guard import CommandGuard
from executors.heartbeat import Heartbeat
from executors.intake import Intake, JunkBatch
from executors.loop import TRANSPORT, is_nogroup, retry_until_ok, run_until_stopped
from executors.metrics import ExecutorMetrics
from executors.outcomes import OutcomeRelay
from executors.results import ExecutorStats, ResultPublisher, result_record
from executors.timing import Held, ZoneTiming, supersedes
from loop.commands import Command, CommandError, hlc_stale

log = logging.getLogger(__name__)

GROUP = "executors"
#: The reason of a ``duplicate``: the command's marker exists (it was applied, or reported advisory).
SEEN = "command_id already applied (or reported advisory while paused)"
#: The marker's value for a command reported ``advisory`` (an applied one holds its apply time).
ADVISORY_MARK = "advisory"


def _basis_field(cmd: Command) -> str:
    """The ``last_basis`` field of a command: the model for ``scale``, ``kind:model`` for the others."""
    return cmd.model if cmd.kind == "scale" else cmd.order_field


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
        max_deliveries: int = MAX_DELIVERIES,
        heartbeat_s: float = HEARTBEAT_S,
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
        self.intake = Intake(zone, guard.keyring.key_ids, guard.accept_unsigned_v1, reg)
        self.held: dict[str, Held] = {}  # by Command.order_field: commands waiting for apply_at_ms
        self.timing = timing or ZoneTiming(
            zone, redis, producer=results, results_topic=results_topic, registry=reg, factor=rtt_factor,
            wall_ms=clock.wall_ms,
        )  # fmt: skip
        self.heartbeat = Heartbeat(redis, prefix, zone, self.executor_id, backend.name, heartbeat_s, clock.now_ms, reg)
        self.heartbeat.timing = self.timing.summary  # the worker's apply_at_ms for cross-zone actions
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

    def _hold(self, entry_id: bytes | str, fields: Any, cmd: Command) -> Held | None:
        """A :class:`Held` for a command whose ``detail.apply_at_ms`` is still ahead of the corrected
        clock, due then but never past its expiry nor after ``GOVERNOR_MAX_CLOCK_SKEW_S`` of wall time;
        None when it applies now."""
        at, now = apply_at(cmd), self.clock.now_ms()
        target = None if at is None else min(at, float(cmd.expires_at_ms))
        if target is None or target <= self.corrected_now_ms():
            return None
        room_ms = min(self.guard.max_clock_skew_s * 1000 * self.clock.speed, cmd.expires_at_ms - now)
        until = time.monotonic() + self.clock.to_wall_s(max(0.0, room_ms))
        return Held(entry_id, fields, cmd, target, until, self.timing.prep_ms() * self.clock.speed)

    def _block_ms(self) -> int:
        """XREADGROUP's block: ``block_ms``, shorter when a held command is due sooner (never 0: forever)."""
        if not self.held:
            return self.block_ms
        now, mono = self.corrected_now_ms(), time.monotonic()
        wait_s = min(h.wait_s(now, self.clock.to_wall_s, mono) for h in self.held.values())
        return max(1, min(self.block_ms, int(wait_s * 1000) + 1))

    async def release_due(self) -> int:
        """Apply (or refuse) each held command that is due; the number acknowledged.  Not while
        stopping: a held entry left pending is handled again by the zone's next executor."""
        done = 0
        for key, h in list(self.held.items()):
            if self._stopping.is_set() or not h.due(self.corrected_now_ms(), time.monotonic()):
                continue
            del self.held[key]
            n = await self._guarded(h.entry_id, h.fields, self._release(h))
            if n == 0 and self._transport_error is not None and key not in self.held:
                self.held[key] = h  # Redis trouble: kept, tried again after the back-off
            done += n
            self._check_transport()
        return done

    async def _release(self, h: Held) -> int:
        """The checks first (a peer may have applied something meanwhile; the pause), then the wait for the
        time itself, then the backend: the checks' Redis round trips end before ``apply_at_ms``."""
        started = time.monotonic()
        if h.early_ms > 0:  # how late the poll loop came to it: the next holds end that much earlier
            self.timing.observe_wake((self.corrected_now_ms() - (h.target_ms - h.early_ms)) / self.clock.speed)
        refused = await self._order_refusal(h.cmd)
        if refused is not None:
            await self._finish(h.entry_id, h.cmd, *refused)
            return 1
        pause = await self.paused()
        self.timing.observe_prep((time.monotonic() - started) * 1000.0)
        wait_s = h.wait_s(self.corrected_now_ms(), self.clock.to_wall_s, time.monotonic(), early_ms=0.0)
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        if apply_at(h.cmd) is not None and h.target_ms > self.corrected_now_ms():
            log.info("executor %s: %s held to its limit, apply_at_ms not reached", self.zone, h.cmd.command_id)
        return await self._apply(h.entry_id, h.cmd, (pause,))

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
        """Release held commands that are due, handle what is pending for too long (ours or a dead
        peer's; not our held ones), then new entries; junk is refused in bulk (:mod:`executors.intake`)."""
        handled = await self.release_due()
        if time.monotonic() - self._pause_checked >= 1.0:
            await self.paused()  # the gauge, at most once a second
        claimed = await self.redis.xautoclaim(
            self.stream, GROUP, self.consumer, min_idle_time=self.retry_idle_ms, start_id="0-0", count=100
        )
        held_ids = {h.entry_id for h in self.held.values()}
        handled += await self._handle_batch([e for e in (claimed[1] if claimed else []) if e[0] not in held_ids], True)
        # redis-py types the reply for every protocol/decoding mode; ours is RESP2, undecoded
        resp = cast(
            "list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes] | None]]]] | None",
            await self.redis.xreadgroup(GROUP, self.consumer, {self.stream: ">"}, count=100, block=self._block_ms()),
        )
        for _stream, entries in resp or []:
            handled += await self._handle_batch(entries, False)
        return handled + await self.release_due()

    async def _handle_batch(self, entries: list[Any], claimed: bool) -> int:
        """Junk refused in bulk, then each other entry handled (its delivery count read when ``claimed``)."""
        keep, junk = self.intake.split(entries)
        if junk.ids:
            await self._refuse(junk)
        handled = len(junk.ids)
        for entry_id, fields in keep:
            handled += await self.handle(entry_id, fields, await self._deliveries(entry_id) if claimed else 1)
            self._check_transport()
        return handled

    async def _refuse(self, junk: JunkBatch) -> None:
        """Acknowledge a batch's junk entries at once; one summary result and log line for them all."""
        try:
            await self.redis.xack(self.stream, GROUP, *junk.ids)
        except ResponseError as exc:
            if not is_nogroup(exc):
                raise
        self.intake.count(junk)
        self.stats.count("refused_in_bulk", len(junk.ids))
        if self.results is not None:
            await self._report(junk.record(self.zone, applied_by(self.backend, None), self.clock.now_ms()))

    async def handle(self, entry_id: bytes | str, fields: Any, deliveries: int = 1) -> int:
        """Handle one stream entry; 1 when it was acknowledged, 0 when it stays pending (held until its
        ``apply_at_ms``, or retried).  Never raises: Redis transport errors leave the entry pending
        (and make :meth:`poll_once` back off)."""
        return await self._guarded(entry_id, fields, self._handle(entry_id, fields, deliveries))

    async def _guarded(self, entry_id: bytes | str, fields: Any, step: Awaitable[int]) -> int:
        """``await step``, never raising (see :meth:`handle`)."""
        try:
            return await step
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
            await self._finish(entry_id, cmd, "duplicate", SEEN, now)
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
        refused_order = await self._order_refusal(cmd, check_marker=False)
        if refused_order is not None:
            await self._finish(entry_id, cmd, *refused_order)
            return 1
        prev = self.held.get(cmd.order_field)
        if prev is not None:
            if prev.entry_id == entry_id:
                return 0  # already held here
            if prev.cmd.command_id == cmd.command_id:
                await self._finish(entry_id, cmd, "duplicate", "command_id already held for its apply_at_ms", now)
                return 1
            if not supersedes(cmd, prev.cmd):
                await self._finish(entry_id, cmd, "stale", f"older than held {prev.cmd.command_id}", now)
                return 1
            del self.held[cmd.order_field]
            await self._finish(prev.entry_id, prev.cmd, "stale", f"superseded by {cmd.command_id}", now)
        if deliveries == 1:
            self.timing.observe_ready(entry_id)  # the zone's lead, for the worker's apply_at_ms
        held = self._hold(entry_id, fields, cmd)
        if held is not None:
            self.held[cmd.order_field] = held
            log.info("executor %s: %s held until apply_at_ms %s", self.zone, cmd.command_id, apply_at(cmd))
            return 0  # pending; release_due applies it
        return await self._apply(entry_id, cmd)

    async def _order_refusal(self, cmd: Command, check_marker: bool = True) -> tuple[str, str, int, Any] | None:
        """``(outcome, reason, now, detail)`` when ``cmd`` was seen (its marker) or is older than what was
        applied for its (zone, kind, model) by HLC or ``basis_ms``; None when it may apply."""
        now = self.clock.now_ms()
        if check_marker and await self.redis.exists(names.applied_marker(self.prefix, self.zone, cmd.command_id)):
            return "duplicate", SEEN, now, None
        last_hlc = await self._stored(self._hlc_key, cmd.order_field)
        if hlc_stale(cmd.hlc, last_hlc):
            return "stale", "hlc older than last applied", now, {"last_hlc": last_hlc}
        last_basis = await self._stored(self._basis_key, _basis_field(cmd))
        if last_basis is not None and cmd.basis_ms < last_basis:
            return "stale", f"basis {cmd.basis_ms} older than applied {last_basis}", now, None
        return None

    async def _apply(self, entry_id: bytes | str, cmd: Command, paused: tuple[dict[str, Any] | None, ...] = ()) -> int:
        """The last steps of an admitted command: expiry after a hold, the pause (``paused``: as read just
        before, else read now), the backend, the marker."""
        now = self.clock.now_ms()
        if apply_at(cmd) is not None and cmd.expired(self.clock.now_ms()):
            self.metrics.expired.labels(self.zone).inc()
            why = f"apply_at_ms {apply_at(cmd)} not reached before expires_at_ms {cmd.expires_at_ms}"
            await self._finish(entry_id, cmd, "expired", why, self.clock.now_ms())
            return 1
        pause = paused[0] if paused else await self.paused()
        if pause is not None:
            # Kill switch: acknowledged and reported, nothing applied; only its marker is kept, so a
            # replay after resume is a duplicate (a new decision has a new command_id).
            marker = names.applied_marker(self.prefix, self.zone, cmd.command_id)
            await self.redis.set(marker, ADVISORY_MARK, ex=self.marker_ttl_s)
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
                pipe.hset(self._basis_key, _basis_field(cmd), cmd.basis_ms)
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
