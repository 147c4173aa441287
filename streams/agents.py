"""The worker shell (:class:`Worker`): Faust agents and timers that move bytes between topics and
Redis, call the pure :class:`~loop.control_loop.ControlLoop` and perform the effects it returns.

    telemetry --ingest--> metrics (+ deadletter)   telemetry keyed model|zone
    metrics   --control--> commands                window records keyed by model
    commands  --bridge--> Redis stream <prefix>:commands:<zone>

Several workers share the partitions: every zone of a model meets at the one
worker holding its metrics partition, which alone decides for it
(:mod:`streams.ownership`, also for what a rebalance does).
Delivery is at-least-once end to end.  The bridge writes a command to Redis
before it takes the next event, so Faust commits the command's offset only
after Redis has it; while Redis is down it retries with capped exponential
backoff and the offset stays uncommitted.  Duplicates are dropped by the
executors (deterministic ``command_id``).  Commands are signed
(``GOVERNOR_COMMAND_KEYS``, :mod:`core.signing`) by the control agent and,
after the HLC stamp, by the bridge (the last writer before Redis), which
dead-letters a command on the topic whose signature does not hold
(``unauthenticated command: ...``).  Window records carry a MAC header with
the same keys (:meth:`ControlLoop.sign_window`); the control agent
dead-letters the ones whose MAC does not hold.
The control agent's learned state (scaler, routing, breakers, KV policy,
agent weights) is saved to Redis at most every 2 s, sealed, one key per model
and per routed family (:class:`streams.snapshots.SnapshotStore`), and
restored for the models a worker gains when partitions are assigned.
Each agent handles a message inside one boundary (:mod:`streams.boundary`); the ingest
agent takes telemetry in batches (:meth:`Worker.ingest`), a batch that raises is taken again
one message at a time.
What lives in Redis (rollouts, admission entries, executor heartbeats, platform
replicas, allowances) is read here and enters the loop through its one port,
:meth:`~loop.control_loop.ControlLoop.observe`; each decision comes back as one
:class:`~loop.effects.Effects` value (commands, events, status rows, writes),
performed by :meth:`Worker.perform`.  One short method per agent, timer or
effect: no nested functions (a test holds the shell to ``ruff --select C901``
at complexity 12).

"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis
from faust.types import TP
from governor_telemetry.records import partition_key
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT

from controllers.hlc import Hlc
from controllers.window_record import WindowRecord
from core import names
from core.clock import ScaledClock
from core.settings import Settings
from core.signing import MissingKeysError
from core.transport import redis_options
from loop import effects
from loop.admission_driver import still_current
from loop.commands import Command, CommandError
from loop.control_loop import ControlLoop, Ingested
from loop.pipeline import dead_letter
from streams.admission_review import OffLoopReview
from streams.app import GovernorApp
from streams.boundary import AgentWatch, unprocessable
from streams.canary_store import CanaryStore
from streams.health import Readiness
from streams.metrics_export import WorkerMetrics
from streams.ownership import Ownership, Rebalance
from streams.retune_shell import OffLoopRetune, Search
from streams.side_redis import SideChannel
from streams.snapshots import SnapshotStore

log = logging.getLogger(__name__)

STREAM_MAXLEN = 100_000
_REDIS_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)


@dataclass
class Pipeline:
    app: GovernorApp
    loop: ControlLoop
    metrics: WorkerMetrics
    snapshots: SnapshotStore
    ownership: Ownership
    rebalance: Rebalance
    watch: AgentWatch | None = None


async def xadd_with_retry(
    redis: aioredis.Redis,
    key: str,
    fields: dict[str, bytes],
    metrics: WorkerMetrics | None = None,
    *,
    base_s: float = 0.1,
    cap_s: float = 5.0,
    sleep: Callable[[float], Any] = asyncio.sleep,
) -> bytes:
    """XADD until it succeeds; temporary Redis failures back off, never drop."""
    delay = base_s
    while True:
        try:
            # redis-py: ``fields`` is typed as an invariant dict of any encodable, and the id as
            # bytes | str for every decoding mode (this client does not decode: bytes)
            return await redis.xadd(  # type: ignore[return-value]
                key,
                fields,  # type: ignore[arg-type]
                maxlen=STREAM_MAXLEN,
                approximate=True,
            )
        except _REDIS_ERRORS as exc:
            log.warning("redis unavailable writing %s (%s); retry in %.1f s", key, exc, delay)
            if metrics is not None:
                metrics.redis_retries.inc()
            await sleep(delay)
            delay = min(cap_s, delay * 2)


def _fields(cmd: Command) -> dict[str, Any]:
    """The log context of a command (JSON logs: top-level keys; launch.logs)."""
    return {"model": cmd.model, "zone": cmd.zone, "command_id": cmd.command_id, "window_end_ms": cmd.basis_ms}


def _headers(raw: Any) -> dict[str, Any]:
    """A Kafka message's headers (Faust: a list of ``(str, bytes)`` pairs, or a mapping) as a dict."""
    if not raw:
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    return {k: v for k, v in raw}


def _source(msg: Any) -> dict[str, Any]:
    return {"topic": msg.topic, "partition": msg.partition, "offset": msg.offset}


# The most telemetry messages (and bytes) the ingest agent takes together, and the longest a message
# waits for its batch (Worker.ingest): Faust hands the agent one message per turn of the event loop.
INGEST_BATCH_MESSAGES = 256
INGEST_BATCH_BYTES = 8 << 20
INGEST_WITHIN_S = 0.05


class Worker:
    """The worker's Faust agents and timers around one :class:`~loop.control_loop.ControlLoop`
    (``readiness``: failed by an agent's crash until it runs again)."""

    def __init__(
        self,
        app: GovernorApp,
        settings: Settings,
        clock: ScaledClock,
        metrics: WorkerMetrics | None = None,
        readiness: Readiness | None = None,
        retune_search: Search | None = None,
    ) -> None:
        self.app, self.settings, self.clock = app, settings, clock
        self.metrics = metrics = metrics or WorkerMetrics()
        self.watch = AgentWatch(metrics, readiness, ("ingest", "control", "bridge"))
        keyring = settings.keyring()
        if keyring is None:
            raise MissingKeysError
        self.keyring = keyring
        self.loop = loop = ControlLoop(settings, metrics, keyring)  # window records carry a MAC header
        loop.ingests.partitioned, parts = True, settings.partitions  # a watermark per telemetry partition
        self.telemetry = app.topic(settings.topic("telemetry"), partitions=parts)
        self.metrics_topic = app.topic(settings.topic("metrics"), partitions=parts)
        self.commands = app.topic(settings.topic("commands"), partitions=parts)
        self.deadletter = app.topic(settings.topic("deadletter"), partitions=1)
        self.events = app.topic(settings.topic("events"), partitions=parts)
        self.redis = aioredis.Redis.from_url(
            str(settings.redis_url), socket_timeout=5.0, socket_connect_timeout=5.0, **redis_options(settings)
        )
        self.zones = set(settings.zones)
        self.canary = CanaryStore(settings, self.redis)  # rollouts in <prefix>:canary:<model>
        self.snapshots = SnapshotStore(  # sealed, one key per model and routed family (streams.snapshots)
            self.redis, settings.topic_prefix, loop, keyring, clock.now_ms,
            max_age_s=settings.snapshot_max_age_s, metrics=metrics,
        )  # fmt: skip
        # Window records keyed by model (family), on its partition: a model's zones meet at one worker.
        self.ownership = Ownership(settings)
        # Telemetry is acknowledged (its offset committed) only once every window it fed has closed:
        # a worker killed mid-window re-reads those records (ControlLoop.committable). Rebalances
        # (streams.ownership): on revocation drop open windows, save snapshots; on assignment
        # release the models gone elsewhere, restore those gained (Faust resumes streams after).
        self.rebalance = Rebalance(loop, self.ownership, self.snapshots, settings.topic("metrics"))
        # Best-effort Redis work (canary, status, heartbeats, snapshots) never holds up a decision.
        self.side = SideChannel()
        prefix, zones = settings.topic_prefix, settings.zones
        self.heartbeat_keys = [names.executor_heartbeat(prefix, z) for z in zones]
        self.allowance_keys = [names.zone_allowance(prefix, z) for z in zones]  # core/budget.py
        self.platform_keys = [(z, names.platform_replicas(prefix, z)) for z in zones]
        self.admission_key = names.admission(prefix)
        self.reviews = OffLoopReview()  # the admission review off the event loop (streams/admission_review.py)
        self.status_key, self.worker_beat = names.status(prefix), names.worker_heartbeat(prefix)
        self.next_heartbeat_read = 0.0
        self.hlc = Hlc()  # the bridge's: one hybrid logical clock per worker
        # Online retuning (streams.retune_shell): the search in its own process, the kill switch read each second.
        self.retune = OffLoopRetune(loop.retune, retune_search, self.redis, prefix, clock, self.side)
        self.taken: list[tuple[Any, int]] = []  # telemetry events not ingested yet, with their ingest generation
        self.taken_bytes = 0
        self.ingest_lock = asyncio.Lock()
        self._register()

    def _register(self) -> None:
        app, watch = self.app, self.watch
        app.agent(self.telemetry, name="ingest")(watch.agent("ingest")(self.ingest))
        app.agent(self.metrics_topic, name="control")(watch.agent("control")(self.control))
        app.agent(self.commands, name="bridge")(watch.agent("bridge")(self.bridge))
        tick_s = max(0.05, self.clock.to_wall_s(self.settings.window_s * 1000) / 10)
        app.timer(tick_s, name="close-windows")(self.close_windows)
        app.task(self.flush_ingest_every)
        app.on_partitions_revoked.connect(self.on_revoked)  # type: ignore[arg-type]  # Faust wants signal=
        app.on_partitions_assigned.connect(self.on_assigned)  # type: ignore[arg-type]

    @property
    def pipeline(self) -> Pipeline:
        return Pipeline(self.app, self.loop, self.metrics, self.snapshots, self.ownership, self.rebalance, self.watch)

    def now_s(self) -> float:
        return asyncio.get_running_loop().time()

    # -- sending ----------------------------------------------------------------------------------
    async def send_dead_letter(self, dl: dict[str, Any]) -> None:
        await self.deadletter.send(value=orjson.dumps(dl))

    async def dead_letter_of(self, prefix: str, exc: BaseException, msg: Any, raw: Any) -> dict[str, Any]:
        """The boundary (streams.boundary): what a message makes raise is its dead letter, counted and sent."""
        dl = unprocessable(prefix, exc, _source(msg), raw, self.clock.now_ms())
        self.metrics.observe_dead_letter(dl["reason"])
        await self.send_dead_letter(dl)
        return dl

    def sign_windows(self, closed: list[dict[str, Any]]) -> list[tuple[str, bytes, list[tuple[str, bytes]]]]:
        return [(m["model"], *self.loop.sign_window(m)) for m in closed]

    async def publish_windows(self, closed: list[dict[str, Any]], signed: list[Any] | None = None) -> None:
        own = self.ownership
        for model, value, headers in signed if signed is not None else self.sign_windows(closed):
            await self.metrics_topic.send(
                key=own.key(model), partition=own.partition(model), value=value, headers=headers
            )
        for dl in self.loop.ingests.drain_dead_letters():  # the node cap's: one per closed window, with its count
            await self.send_dead_letter(dl)

    async def publish(self, cmd: Command, what: str, value: bytes | None = None) -> None:
        self.metrics.commands.labels(cmd.kind, cmd.zone).inc()
        log.info("command %s %s %s (%s)", cmd.command_id, cmd.zone, what, cmd.reason, extra=_fields(cmd))
        # Signed here too: the bridge re-signs only what the control agent signed, so whoever can
        # write to the commands topic cannot have the bridge sign a command of their own.
        await self.commands.send(key=cmd.zone.encode(), value=value or cmd.signed(self.keyring).encode())

    @staticmethod
    def encode_events(events: list[dict[str, Any]]) -> list[tuple[bytes, bytes]]:
        return [(partition_key(ev["model"], ev["zone"]), orjson.dumps(ev)) for ev in events]

    async def save_snapshots(self) -> None:
        await self.side.call("snapshots", functools.partial(self.snapshots.save, self.now_s()))

    # -- effects ------------------------------------------------------------------------------------
    async def perform(
        self, fx: effects.Effects, signed: list[bytes] | None = None, events: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        """Perform one decision's effects: writes (a swap's commands once it is written), status rows,
        events, commands, dead letters (``signed``, ``events``: encoded inside the agent's boundary)."""
        for write in fx.writes:
            await self.write(write)
        for row in fx.status:
            await self.write_status(row)
        for key, value in events if events is not None else self.encode_events(fx.events):
            await self.events.send(key=key, value=value)
        values: list[bytes | None] = list(signed) if signed is not None else [None] * len(fx.commands)
        for cmd, what, signed_cmd in zip(fx.commands, fx.described, values, strict=True):
            await self.publish(cmd, what, signed_cmd)
        for dl in fx.dead_letters:
            await self.send_dead_letter(dl)

    async def write(self, write: effects.HashWrite | effects.SwapWrite) -> None:
        if isinstance(write, effects.SwapWrite):
            if await self.side.call("canary", functools.partial(self.canary.swap, write)):
                for cmd, what in write.then:
                    await self.publish(cmd, what)
            return
        fields = dict(write.fields)
        if write.reviewed is not None:  # only entries nobody changed or removed meanwhile (a review takes a while)
            now = await self.side.call("admission", functools.partial(self.redis.hgetall, write.key))
            fields = still_current(fields, write.reviewed, now or {})
        if fields:
            mapping: dict[EncodableT, EncodableT] = {k: v for k, v in fields.items()}
            await self.side.call("admission", functools.partial(self.redis.hset, write.key, mapping=mapping))

    async def write_status(self, row: effects.StatusRow) -> None:
        """One HSET per zone window: what ``governor status`` shows of (model, zone); never raises."""
        value = orjson.dumps(row.record)
        await self.side.call("status", functools.partial(self.redis.hset, self.status_key, row.field, value))

    # -- ingest ------------------------------------------------------------------------------------
    async def ingest(self, stream: Any) -> None:
        """Telemetry is taken in batches: every message the consumer hands over joins the batch, which is
        ingested at INGEST_BATCH_MESSAGES or INGEST_BATCH_BYTES, or by the flush timer (every
        INGEST_WITHIN_S): a backlog is read hundreds of messages at a time, a lone message waits at
        most INGEST_WITHIN_S."""
        async for event in stream.noack().events():
            self.taken.append((event, self.rebalance.generation))
            self.taken_bytes += len(event.value) if isinstance(event.value, bytes) else 0
            if len(self.taken) >= INGEST_BATCH_MESSAGES or self.taken_bytes >= INGEST_BATCH_BYTES:
                await self.flush_ingest()

    async def flush_ingest(self) -> None:
        """Ingest the batch taken so far (the agent when it is full, the timer otherwise), one batch at a time."""
        async with self.ingest_lock:
            taken, self.taken, self.taken_bytes = self.taken, [], 0
            if taken:
                await self.ingest_batch(taken)

    async def flush_ingest_every(self) -> None:
        """Every INGEST_WITHIN_S, the batch taken so far (a task, not a timer: a batch may take longer)."""
        while True:
            await asyncio.sleep(INGEST_WITHIN_S)
            try:
                await self.flush_ingest()
            except Exception:  # a send that raised: logged; its events stay unacknowledged (re-read)
                log.exception("ingest of a batch failed")

    async def ingest_batch(self, taken: list[tuple[Any, int]]) -> None:
        """Telemetry events, each partition's together (:meth:`ControlLoop.ingest_many`). An event taken
        before a rebalance is skipped, never acknowledged: its partition is re-read from the committed
        offset.  A batch whose ingest raises is taken again one message at a time (each its own boundary)."""
        generation = self.rebalance.generation
        by_partition: dict[Any, list[Any]] = {}
        for event, gen in taken:
            if gen == generation:
                by_partition.setdefault(event.message.partition, []).append(event)
        self.metrics.ingest_batches.inc()
        for events in by_partition.values():
            if self.rebalance.generation != generation:
                return
            sources = [_source(e.message) for e in events]
            try:
                res = self.loop.ingest_many([e.value for e in events], sources, self.clock.now_ms())
                signed = self.sign_windows(res.windows)
            except Exception:  # noqa: BLE001 - the boundary is the message: one at a time
                log.exception("ingest of %d messages from %s failed; one at a time", len(events), sources[0])
                for event in events:
                    await self.ingest_one(event)
                continue
            await self.emit(res, signed, sources)
            for event in events:
                self.rebalance.hold(event, res.max_ts_ms, generation)
            self.rebalance.ack_closed()

    async def ingest_one(self, event: Any) -> None:
        msg, generation = event.message, self.rebalance.generation
        try:  # the boundary (streams.boundary): what a message makes raise is its dead letter
            res = self.loop.ingest(event.value, _source(msg), self.clock.now_ms())
            signed = self.sign_windows(res.windows)
        except Exception as exc:  # noqa: BLE001 - nothing a message holds stops ingest
            dl = unprocessable("bad envelope", exc, _source(msg), event.value, self.clock.now_ms())
            log.error("ingest of %s[%d]@%d dead-lettered: %s", msg.topic, msg.partition, msg.offset, dl["reason"])
            self.metrics.observe_dead_letter(dl["reason"])
            res, signed = Ingested(dead_letters=[dl]), []
        await self.emit(res, signed, [_source(msg)])
        self.rebalance.hold(event, res.max_ts_ms, generation)
        self.rebalance.ack_closed()

    async def emit(self, res: Ingested, signed: list[Any], sources: list[dict[str, Any]]) -> None:
        """An ingest's dead letters and closed windows, sent."""
        if res.dead_letters:
            # One log line per batch, not per record: a replay of old data or a broken
            # producer must not become a flood of log lines (measured: the per-record line
            # was ~30 % of the worker's time on an all-late stream).
            first, last = sources[0], sources[-1]
            n, topic, part = len(res.dead_letters), first["topic"], first["partition"]
            where = f"{first['offset']}" if len(sources) == 1 else f"{first['offset']}..{last['offset']}"
            log.info(
                "%d dead letter(s) from %s[%d]@%s, first: %s", n, topic, part, where, res.dead_letters[0]["reason"]
            )
        for dl in res.dead_letters:
            await self.send_dead_letter(dl)
        await self.publish_windows(res.windows, signed)

    def highwater(self, partition: int) -> int | None:
        """Of a telemetry partition; None: not known, not assigned."""
        try:
            return self.app.consumer.highwater(TP(self.settings.topic("telemetry"), partition))
        except (AssertionError, KeyError, AttributeError):  # aiokafka asserts the partition is assigned
            return None

    async def close_windows(self) -> None:
        """The timer: windows due by the clock, liveness, and a snapshot at most every_s old, traffic or not."""
        if not self.app.rebalancing:  # consumers paused: a window closed by the clock now would miss records
            await self.publish_windows(self.loop.close_due(self.clock.now_ms(), self.highwater))
            self.rebalance.ack_closed()
        await self.watch_liveness()
        await self.save_snapshots()

    # -- what lives in Redis, through the loop's port ----------------------------------------------
    async def observe(self, event: effects.InputEvent) -> None:
        await self.perform(self.loop.observe(event))

    async def watch_liveness(self) -> None:
        """Executor heartbeats (zone loss needs its executor gone; their measured leads and one Redis TIME
        exchange plan cross-zone apply_at_ms) and silent (model, zone)s, every >= 1 s."""
        if self.now_s() < self.next_heartbeat_read:
            return
        self.next_heartbeat_read = self.now_s() + 1.0
        keys = self.heartbeat_keys + self.allowance_keys
        read = await self.side.call("heartbeats", functools.partial(self.redis.mget, keys))
        zones, n = self.settings.zones, len(self.settings.zones)
        # No view (Redis hangs or is down): silence alone decides, as before heartbeats.
        await self.observe(
            effects.Heartbeats(None if read is None else [z for z, b in zip(zones, read[:n], strict=True) if b])
        )
        await self.observe(effects.Allowances(None if read is None else dict(zip(zones, read[n:], strict=True))))
        await self.observe(effects.ZoneClocks(zone_beats(zones, read), await self.redis_clock(), self.clock.now_ms()))
        self.review_admission()
        for zone, key in self.platform_keys:  # replica truth from the platform (loop/platform_truth.py)
            fields = await self.side.call("platform replicas", functools.partial(self.redis.hgetall, key))
            await self.observe(effects.PlatformReplicas(zone, fields or {}))
        await self.observe(effects.Tick(self.clock.now_ms()))
        await self.retune.tick()
        await self.beat()

    async def redis_clock(self) -> tuple[float, float, float] | None:
        """One exchange of this worker's wall clock against Redis ``TIME``: ``(t0, redis_ms, t3)`` (None: no answer)."""
        t0 = self.clock.wall_ms()
        got = await self.side.call("redis time", self.redis.time)
        t3 = self.clock.wall_ms()
        if not isinstance(got, list | tuple) or len(got) != 2:
            return None
        return t0, float(got[0]) * 1000.0 + float(got[1]) / 1000.0, t3

    async def beat(self) -> None:
        """The worker's own liveness, for ``governor status``."""
        beat = orjson.dumps(self.clock.stamp())  # the clock too: status converts with it
        ttl_ms = int(max(3.0, 3 * self.settings.heartbeat_s) * 1000)
        await self.side.call("worker heartbeat", functools.partial(self.redis.set, self.worker_beat, beat, px=ttl_ms))

    def review_admission(self) -> None:
        """Start a review: decide pending tasks, re-check admitted sets (at most once a second, with the heartbeats).

        One writer: the worker holding metrics partition 0 (several workers would race on the registry).
        Not waited for: the analysis runs in a worker thread, one review at a time (OffLoopReview.launch).
        """
        if 0 in self.ownership.assigned:
            self.reviews.launch(self.admission_round)

    async def admission_round(self) -> None:
        entries = await self.side.call("admission", functools.partial(self.redis.hgetall, self.admission_key))
        if not entries:
            return
        event = effects.AdmissionEntries(dict(entries), self.clock.now_ms(), self.loop.admission.latencies())
        fx = await self.reviews.run(self.loop.observe, event)
        if 0 in self.ownership.assigned:  # released while the review ran: the new owner reviews
            await self.perform(fx)

    # -- control ------------------------------------------------------------------------------------
    async def control(self, stream: Any) -> None:
        async for event in stream.events():
            w = await self.decode(event)
            if w is not None and await self.ready_to_decide(w, event.message):
                await self.decide(w, event)

    async def decode(self, event: Any) -> WindowRecord | None:
        """The window record of a metrics message, or None (its dead letter sent)."""
        msg = event.message
        try:  # the boundary (streams.boundary): a record that makes decoding raise is its dead letter
            w, dl = self.loop.decode(event.value, _source(msg), self.clock.now_ms(), _headers(msg.headers))
        except Exception as exc:  # noqa: BLE001 - nothing a message holds stops the control agent
            await self.dead_letter_of("bad metrics record", exc, msg, event.value)
            return None
        if w is None:
            assert dl is not None
            await self.send_dead_letter(dl)
            return None
        if self.ownership.partition(w.model) != msg.partition:
            # Authentic (MAC'd) but not on its model's partition: written by a worker of an earlier
            # version (keyed model|zone). Deciding it here could decide a model another worker owns.
            reason = f"misrouted window record: {w.model!r} belongs on partition {self.ownership.partition(w.model)}"
            self.metrics.observe_dead_letter(reason)
            raw = bytes(event.value or b"").decode("utf-8", "replace")[:4096]
            await self.send_dead_letter(dead_letter(reason, _source(msg), raw, self.clock.now_ms()))
            return None
        return w

    async def ready_to_decide(self, w: WindowRecord, msg: Any) -> bool:
        """Whether this worker decides ``w`` (its partition held), after reading its rollout for the loop."""
        if msg.partition not in self.ownership.assigned:  # read across a rebalance: its new owner decides it
            log.debug("window record of partition %d skipped: not held since the rebalance", msg.partition)
            return False
        if w.scope == "zone":
            raw = await self.side.call("canary", functools.partial(self.canary.read, w.model))
            self.loop.observe(effects.Rollout(w.model, raw))
        return msg.partition in self.ownership.assigned  # released while the rollout read awaited Redis

    async def decide(self, w: WindowRecord, event: Any) -> None:
        msg = event.message
        try:  # the boundary: the decision and what it publishes, encoded before anything is sent
            fx = self.loop.decide(w, self.clock.now_ms())
            signed = [cmd.signed(self.keyring).encode() for cmd in fx.commands]
            events = self.encode_events(fx.events)
        except Exception as exc:  # noqa: BLE001 - a window the drivers cannot take is its dead letter
            dl = await self.dead_letter_of("bad metrics record", exc, msg, event.value)
            log.error("decision on %s[%d]@%d dead-lettered: %s", msg.topic, msg.partition, msg.offset, dl["reason"])
            return
        await self.perform(fx, signed, events)
        await self.save_snapshots()

    # -- bridge -------------------------------------------------------------------------------------
    async def bridge(self, stream: Any) -> None:
        # Each bridged command is a send event of the worker's hybrid logical clock, stamped (tick at
        # the clock's physical ms) before the XADD.  The stamp is not part of command_id, so a
        # re-delivered decision is still dropped as a duplicate.  The bridge is the last writer
        # before Redis: it signs after stamping.
        async for event in stream.events():
            await self.bridge_one(event)

    def stamp(self, raw: Any) -> tuple[Command, Hlc, bytes, int]:
        """A command from the topic, checked, stamped and signed: (command, the clock after, entry, now)."""
        cmd = Command.decode(raw)
        if cmd.zone not in self.zones:
            raise CommandError(f"unknown zone {cmd.zone!r} (GOVERNOR_ZONES={sorted(self.zones)})")
        why = self.keyring.verify(asdict(cmd))
        if why is not None:
            raise CommandError(f"unauthenticated command: {why}")
        now = self.clock.now_ms()
        stamped = self.hlc.tick(now)
        return cmd, stamped, cmd.with_hlc(stamped.encode()).signed(self.keyring).encode(), now

    async def bridge_one(self, event: Any) -> None:
        msg = event.message
        try:
            cmd, stamped, entry, now = self.stamp(event.value)
        except (CommandError, ValueError, TypeError, RecursionError) as exc:  # nothing a message holds stops it
            reason = str(exc) if str(exc).startswith("unauthenticated") else f"bad command: {exc}"
            self.metrics.observe_dead_letter(reason)
            raw = bytes(event.value or b"").decode("utf-8", "replace")
            await self.send_dead_letter(dead_letter(reason, _source(msg), raw, self.clock.now_ms()))
            return
        except Exception as exc:  # noqa: BLE001 - the boundary (streams.boundary): anything else too
            await self.dead_letter_of("bad command", exc, msg, event.value)
            return
        self.hlc = stamped
        stream_key = names.command_stream(self.settings.topic_prefix, cmd.zone)
        await xadd_with_retry(self.redis, stream_key, {"cmd": entry, "bridged_ms": str(now).encode()}, self.metrics)
        self.metrics.bridged.labels(cmd.zone).inc()

    # -- rebalances -----------------------------------------------------------------------------------
    async def on_revoked(self, sender: Any, revoked: Any = None, **kwargs: Any) -> None:
        try:
            done = await self.rebalance.revoked(self.now_s())
            log.info("rebalance: partitions revoked; %s", done)
        except Exception:  # a rebalance that raises would crash the worker: logged, the next one retries
            log.exception("rebalance: revocation failed")

    async def on_assigned(self, sender: Any, assigned: Any = (), **kwargs: Any) -> None:
        try:
            done = await self.rebalance.assigned((tp.topic, tp.partition) for tp in assigned)
            log.info("control owns %d models: %s", len(done["models"]), done, extra={"ownership": done})
            self.next_heartbeat_read = 0.0  # executor heartbeats known before a gained model's first window:
            await self.watch_liveness()  # its zones arrive with different lags, and a lag alone is no zone loss
        except Exception:
            log.exception("rebalance: assignment failed")


def zone_beats(zones: tuple[str, ...], read: list[Any] | None) -> dict[str, Any] | None:
    """The executors' heartbeats of an MGET, decoded by zone (an unreadable one is ``{}``; None: no view)."""
    if read is None:
        return None
    out: dict[str, Any] = {}
    for zone, raw in zip(zones, read, strict=False):
        if raw:
            try:
                out[zone] = orjson.loads(raw)
            except orjson.JSONDecodeError:
                out[zone] = {}
    return out


def build_pipeline(app: GovernorApp, settings: Settings, clock: ScaledClock, **kw: Any) -> Pipeline:
    """The worker's Faust agents around one :class:`~loop.control_loop.ControlLoop` (:class:`Worker`;
    ``kw``: its ``metrics``, ``readiness`` and ``retune_search``)."""
    return Worker(app, settings, clock, **kw).pipeline
