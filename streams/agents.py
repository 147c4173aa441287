"""The Faust agents (thin): they move bytes between topics and call the pure
processors in :mod:`loop.pipeline` and :mod:`loop.scaler_driver`.

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
Each agent handles a message inside one boundary (:mod:`streams.boundary`).

Over 400 lines: the three agents share one closure (the loop, the topics, the
publishing and side-channel helpers, the rebalance hooks); apart, each would be
handed that state and the wiring of one ControlLoop would spread over modules.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
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

from controllers.window_record import WindowRecord
from core import names
from core.clock import ScaledClock
from core.settings import Settings
from core.signing import MissingKeysError
from core.transport import redis_options
from loop.admission_driver import AdmissionDriver
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
    """The log context of a command (JSON logs: top-level keys; governor.logs)."""
    return {"model": cmd.model, "zone": cmd.zone, "command_id": cmd.command_id, "window_end_ms": cmd.basis_ms}


def _headers(raw: Any) -> dict[str, Any]:
    """A Kafka message's headers (Faust: a list of ``(str, bytes)`` pairs, or a mapping) as a dict."""
    if not raw:
        return {}
    if isinstance(raw, Mapping):
        return dict(raw)
    return {k: v for k, v in raw}


def build_pipeline(
    app: GovernorApp,
    settings: Settings,
    clock: ScaledClock,
    metrics: WorkerMetrics | None = None,
    readiness: Readiness | None = None,
) -> Pipeline:
    """The worker's Faust agents around one :class:`~loop.control_loop.ControlLoop`
    (``readiness``: failed by an agent's crash until it runs again)."""
    metrics = metrics or WorkerMetrics()
    watch = AgentWatch(metrics, readiness, ("ingest", "control", "bridge"))
    keyring = settings.keyring()
    if keyring is None:
        raise MissingKeysError
    loop = ControlLoop(settings, metrics, keyring)  # window records carry a MAC header
    loop.ingests.partitioned, parts = True, settings.partitions  # a watermark per telemetry partition
    telemetry = app.topic(settings.topic("telemetry"), partitions=parts)
    metrics_topic = app.topic(settings.topic("metrics"), partitions=parts)
    commands = app.topic(settings.topic("commands"), partitions=parts)
    deadletter = app.topic(settings.topic("deadletter"), partitions=1)
    events = app.topic(settings.topic("events"), partitions=parts)
    redis = aioredis.Redis.from_url(
        str(settings.redis_url), socket_timeout=5.0, socket_connect_timeout=5.0, **redis_options(settings)
    )
    zones = set(settings.zones)
    canary = CanaryStore(settings, redis)  # rollouts in <prefix>:canary:<model> (loop.canary_driver)
    snapshots = SnapshotStore(  # sealed, one key per model and routed family (streams.snapshots)
        redis,
        settings.topic_prefix,
        loop,
        keyring,
        clock.now_ms,
        max_age_s=settings.snapshot_max_age_s,
        metrics=metrics,
    )

    # Window records keyed by model (family), on its partition: a model's zones meet at one worker.
    ownership = Ownership(settings)

    async def send_dead_letter(dl: dict[str, Any]) -> None:
        await deadletter.send(value=orjson.dumps(dl))

    def sign_windows(closed: list[dict[str, Any]]) -> list[tuple[str, bytes, list[tuple[str, bytes]]]]:
        return [(m["model"], *loop.sign_window(m)) for m in closed]

    async def publish_windows(closed: list[dict[str, Any]], signed: list[Any] | None = None) -> None:
        for model, value, headers in signed if signed is not None else sign_windows(closed):
            await metrics_topic.send(
                key=ownership.key(model), partition=ownership.partition(model), value=value, headers=headers
            )
        for dl in loop.ingests.drain_dead_letters():  # the node cap's: one per closed window, with its count
            await send_dead_letter(dl)

    async def publish(cmd: Command, what: str, value: bytes | None = None) -> None:
        metrics.commands.labels(cmd.kind, cmd.zone).inc()
        log.info("command %s %s %s (%s)", cmd.command_id, cmd.zone, what, cmd.reason, extra=_fields(cmd))
        # Signed here too: the bridge re-signs only what the control agent signed, so whoever can
        # write to the commands topic cannot have the bridge sign a command of their own.
        await commands.send(key=cmd.zone.encode(), value=value or cmd.signed(keyring).encode())

    # Telemetry is acknowledged (its offset committed) only once every window it fed has closed:
    # a worker killed mid-window re-reads those records (ControlLoop.committable). Rebalances
    # (streams.ownership): on revocation drop open windows, save snapshots; on assignment
    # release the models gone elsewhere, restore those gained (Faust resumes streams after).
    rebalance = Rebalance(loop, ownership, snapshots, settings.topic("metrics"))
    ack_closed = rebalance.ack_closed

    def highwater(partition: int) -> int | None:  # of a telemetry partition; None: not known, not assigned
        try:
            return app.consumer.highwater(TP(settings.topic("telemetry"), partition))
        except (AssertionError, KeyError, AttributeError):  # aiokafka asserts the partition is assigned
            return None

    @app.agent(telemetry, name="ingest")
    @watch.agent("ingest")
    async def ingest(stream: Any) -> None:
        async for event in stream.noack().events():
            msg = event.message
            source = {"topic": msg.topic, "partition": msg.partition, "offset": msg.offset}
            generation = rebalance.generation
            try:  # the boundary (streams.boundary): what a message makes raise is its dead letter
                res = loop.ingest(event.value, source, clock.now_ms())
                signed = sign_windows(res.windows)
            except Exception as exc:  # noqa: BLE001 - nothing a message holds stops ingest
                dl = unprocessable("bad envelope", exc, source, event.value, clock.now_ms())
                log.error("ingest of %s[%d]@%d dead-lettered: %s", msg.topic, msg.partition, msg.offset, dl["reason"])
                metrics.observe_dead_letter(dl["reason"])
                res, signed = Ingested(dead_letters=[dl]), []
            if res.dead_letters:
                # One log line per message, not per record: a replay of old data or a broken
                # producer must not become a flood of log lines (measured: the per-record line
                # was ~30 % of the worker's time on an all-late stream).
                log.info(
                    "%d dead letter(s) from %s[%d]@%d, first: %s",
                    len(res.dead_letters),
                    msg.topic,
                    msg.partition,
                    msg.offset,
                    res.dead_letters[0]["reason"],
                )
            for dl in res.dead_letters:
                await send_dead_letter(dl)
            await publish_windows(res.windows, signed)
            rebalance.hold(event, res.max_ts_ms, generation)
            ack_closed()

    @app.timer(  # type: ignore[untyped-decorator]  # Faust's timer decorator is untyped
        max(0.05, clock.to_wall_s(settings.window_s * 1000) / 10), name="close-windows"
    )
    async def close_windows() -> None:
        if not app.rebalancing:  # consumers paused: a window closed by the clock now would miss records
            await publish_windows(loop.close_due(clock.now_ms(), highwater))
            ack_closed()
        await watch_liveness()
        # Saved here too: a snapshot is at most every_s old, traffic or not.
        await side.call("snapshots", lambda: snapshots.save(asyncio.get_running_loop().time()))

    # Best-effort Redis work (canary, status, heartbeats, snapshots) never holds up a decision.
    side = SideChannel()
    heartbeat_keys = [names.executor_heartbeat(settings.topic_prefix, z) for z in settings.zones]
    allowance_keys = [names.zone_allowance(settings.topic_prefix, z) for z in settings.zones]  # core/budget.py
    platform_keys = [(z, names.platform_replicas(settings.topic_prefix, z)) for z in settings.zones]
    platform_refused: dict[str, list[str]] = {}
    admission = AdmissionDriver(settings.window_s, metrics)  # periodic agent tasks (loop/admission_driver.py)
    admission_runner = OffLoopReview(admission)  # the review off the event loop (streams/admission_review.py)
    admission_key = names.admission(settings.topic_prefix)

    async def review_admission() -> None:
        """Start a review: decide pending tasks, re-check admitted sets (at most once a second, with the heartbeats).

        One writer: the worker holding metrics partition 0 (several workers would race on the registry).
        Not waited for: the analysis runs in a worker thread, one review at a time (AdmissionDriver.launch).
        """
        if 0 in ownership.assigned:
            admission_runner.launch(admission_round)

    async def admission_round() -> None:
        entries = await side.call("admission", functools.partial(redis.hgetall, admission_key))
        if not entries:
            return
        writes, evs = await admission_runner.review(entries, clock.now_ms())
        if 0 not in ownership.assigned:  # released while the review ran: the new owner reviews
            return
        if writes:  # only entries nobody changed or removed meanwhile (the review took a while)
            now = await side.call("admission", functools.partial(redis.hgetall, admission_key))
            writes = admission.still_current(writes, entries, now or {})
        if writes:
            fields: dict[EncodableT, EncodableT] = {k: v for k, v in writes.items()}
            await side.call("admission", functools.partial(redis.hset, admission_key, mapping=fields))
        for ev in evs:
            await events.send(key=partition_key(ev["model"], ev["zone"]), value=orjson.dumps(ev))

    next_heartbeat_read = [0.0]

    async def watch_liveness() -> None:
        """Executor heartbeats (zone loss needs its executor gone) and silent (model, zone)s, every >= 1 s."""
        now_s = asyncio.get_running_loop().time()
        if now_s < next_heartbeat_read[0]:
            return
        next_heartbeat_read[0] = now_s + 1.0
        read = await side.call("heartbeats", lambda: redis.mget(heartbeat_keys + allowance_keys))
        n = len(settings.zones)
        # No view (Redis hangs or is down): silence alone decides, as before heartbeats.
        loop.set_heartbeats(None if read is None else [z for z, b in zip(settings.zones, read[:n], strict=True) if b])
        loop.set_allowances(None if read is None else dict(zip(settings.zones, read[n:], strict=True)))
        await review_admission()
        for zone, key in platform_keys:  # replica truth from the platform (loop/platform_truth.py)
            fields = await side.call("platform replicas", functools.partial(redis.hgetall, key))
            refused = loop.platform.set(zone, fields or {})
            if refused != platform_refused.get(zone):  # said once per change, not every second
                platform_refused[zone] = refused
                for why in refused:
                    log.warning("platform replicas of %s refused: %s", zone, why)
        for ev in loop.check_silence(clock.now_ms()):
            await events.send(key=partition_key(ev["model"], ev["zone"]), value=orjson.dumps(ev))
        beat = {"ts_ms": clock.now_ms(), "wall_ms": int(time.time() * 1000)}
        ttl_ms = int(max(3.0, 3 * settings.heartbeat_s) * 1000)  # the worker's own liveness, for governor status
        await side.call("worker heartbeat", lambda: redis.set(worker_beat, orjson.dumps(beat), px=ttl_ms))

    status_key, worker_beat = names.status(settings.topic_prefix), names.worker_heartbeat(settings.topic_prefix)
    last_drift: dict[tuple[str, str], dict[str, Any]] = {}

    async def write_status(w: WindowRecord, decided_events: list[dict[str, Any]]) -> None:
        """One HSET per zone window: what ``governor status`` shows of (model, zone); never raises."""
        key = (w.model, w.zone)
        for ev in decided_events:
            if ev.get("kind") == "drift":
                last_drift[(ev["model"], ev["zone"])] = {k: ev.get(k) for k in ("signal", "direction", "window_end_ms")}
        ks, stale, spec = loop.scaler.states.get(key), loop.watch.stale.get(key), settings.model(w.model)
        record = {
            **{f: getattr(w, f) for f in ("window_end_ms", "rate_rps", "violation_rate", "unfixable_rate")},
            **{f: getattr(w, f) for f in ("ttft_p95_ms", "replicas_ready", "replicas_starting")},
            "ttft_slo_ms": w.ttft_slo_ms or (spec.ttft_slo_ms if spec else None),
            "written_ms": clock.now_ms(),
            "target": None if ks is None else ks.ctrl.last_target,
            "ff_mode": None if ks is None else ks.ff_mode,
            "drift": last_drift.get(key),
            "stale": bool(stale and stale.stale),
            "stale_reason": stale.reason if stale else "",
            "zone_status": loop.scaler.zone_status(w.model).get(w.zone, ""),
        }
        await side.call("status", lambda: redis.hset(status_key, f"{w.model}|{w.zone}", orjson.dumps(record)))

    async def drive_canary(w: WindowRecord) -> None:
        try:
            steps = await side.call("canary", lambda: canary.on_window(w, clock.now_ms()))
        except (ValueError, KeyError, TypeError) as exc:  # a malformed rollout key: operator's to fix
            log.error("canary step failed for %s: %s", w.model, exc)
            return
        for cc in steps or []:
            await publish(cc, f"canary {cc.model} -> {cc.payload['share']:.2f}")

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # Faust's receiver type requires signal=
    async def _revoked(sender, revoked, **kwargs) -> None:  # type: ignore[no-untyped-def]
        try:
            done = await rebalance.revoked(asyncio.get_running_loop().time())
            log.info("rebalance: partitions revoked; %s", done)
        except Exception:  # a rebalance that raises would crash the worker: logged, the next one retries
            log.exception("rebalance: revocation failed")

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def _assigned(sender, assigned, **kwargs) -> None:  # type: ignore[no-untyped-def]
        try:
            done = await rebalance.assigned((tp.topic, tp.partition) for tp in assigned)
            log.info("control owns %d models: %s", len(done["models"]), done, extra={"ownership": done})
            next_heartbeat_read[0] = 0.0  # executor heartbeats known before a gained model's first window:
            await watch_liveness()  # its zones arrive with different lags, and a lag alone is no zone loss
        except Exception:
            log.exception("rebalance: assignment failed")

    @app.agent(metrics_topic, name="control")
    @watch.agent("control")
    async def control(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            source = {"topic": msg.topic, "partition": msg.partition, "offset": msg.offset}
            try:  # the boundary (streams.boundary): a record that makes decoding raise is its dead letter
                w, dl = loop.decode(event.value, source, clock.now_ms(), _headers(msg.headers))
            except Exception as exc:  # noqa: BLE001 - nothing a message holds stops the control agent
                w, dl = None, unprocessable("bad metrics record", exc, source, event.value, clock.now_ms())
                metrics.observe_dead_letter(dl["reason"])
            if w is None:
                assert dl is not None
                await send_dead_letter(dl)
                continue
            if ownership.partition(w.model) != msg.partition:
                # Authentic (MAC'd) but not on its model's partition: written by a worker of an earlier
                # version (keyed model|zone). Deciding it here could decide a model another worker owns.
                reason = f"misrouted window record: {w.model!r} belongs on partition {ownership.partition(w.model)}"
                metrics.observe_dead_letter(reason)
                raw = bytes(event.value or b"").decode("utf-8", "replace")[:4096]
                await send_dead_letter(dead_letter(reason, source, raw, clock.now_ms()))
                continue
            if msg.partition not in ownership.assigned:  # read across a rebalance: its new owner decides it
                log.debug("window record of partition %d skipped: not held since the rebalance", msg.partition)
                continue
            if w.scope == "zone":
                await drive_canary(w)
            if msg.partition not in ownership.assigned:  # released while the canary step awaited Redis
                continue
            try:  # the boundary: the decision and what it publishes, encoded before anything is sent
                if w.scope == "zone":
                    admission.on_window(w)
                decided = loop.decide(w, clock.now_ms())
                evs = [(partition_key(ev["model"], ev["zone"]), orjson.dumps(ev)) for ev in decided.events]
                cmds = [cmd.signed(keyring).encode() for cmd in decided.commands]
            except Exception as exc:  # noqa: BLE001 - a window the drivers cannot take is its dead letter
                dl = unprocessable("bad metrics record", exc, source, event.value, clock.now_ms())
                log.error("decision on %s[%d]@%d dead-lettered: %s", msg.topic, msg.partition, msg.offset, dl["reason"])
                metrics.observe_dead_letter(dl["reason"])
                await send_dead_letter(dl)
                continue
            if w.scope == "zone":
                await write_status(w, decided.events)
            for key, value in evs:
                await events.send(key=key, value=value)
            for cmd, what, signed_cmd in zip(decided.commands, decided.described, cmds, strict=True):
                await publish(cmd, what, signed_cmd)
            await side.call("snapshots", lambda: snapshots.save(asyncio.get_running_loop().time()))

    @app.agent(commands, name="bridge")
    @watch.agent("bridge")
    async def bridge(stream: Any) -> None:
        # One hybrid logical clock per worker: each bridged command is a send event,
        # stamped (tick at the clock's physical ms) before the XADD.  The stamp is not
        # part of command_id, so a re-delivered decision is still dropped as a duplicate.
        # The bridge is the last writer before Redis: it signs after stamping.
        from controllers.hlc import Hlc

        hlc = Hlc()
        async for event in stream.events():
            msg = event.message
            try:
                cmd = Command.decode(event.value)
                if cmd.zone not in zones:
                    raise CommandError(f"unknown zone {cmd.zone!r} (GOVERNOR_ZONES={sorted(zones)})")
                why = keyring.verify(asdict(cmd))
                if why is not None:
                    raise CommandError(f"unauthenticated command: {why}")
                now = clock.now_ms()
                stamped = hlc.tick(now)
                entry = cmd.with_hlc(stamped.encode()).signed(keyring).encode()
            except (CommandError, ValueError, TypeError, RecursionError) as exc:  # nothing a message holds stops it
                reason = str(exc) if str(exc).startswith("unauthenticated") else f"bad command: {exc}"
                metrics.observe_dead_letter(reason)
                await send_dead_letter(
                    dead_letter(
                        reason,
                        {"topic": msg.topic, "partition": msg.partition, "offset": msg.offset},
                        bytes(event.value or b"").decode("utf-8", "replace"),
                        clock.now_ms(),
                    )
                )
                continue
            except Exception as exc:  # noqa: BLE001 - the boundary (streams.boundary): anything else too
                source = {"topic": msg.topic, "partition": msg.partition, "offset": msg.offset}
                dl = unprocessable("bad command", exc, source, event.value, clock.now_ms())
                metrics.observe_dead_letter(dl["reason"])
                await send_dead_letter(dl)
                continue
            hlc = stamped
            await xadd_with_retry(
                redis,
                names.command_stream(settings.topic_prefix, cmd.zone),
                {"cmd": entry, "bridged_ms": str(now).encode()},
                metrics,
            )
            metrics.bridged.labels(cmd.zone).inc()

    return Pipeline(app, loop, metrics, snapshots, ownership, rebalance, watch)
