"""The Faust agents (thin): they move bytes between topics and call the pure
processors in :mod:`streams.pipeline` and :mod:`streams.scaler_driver`.

    telemetry --ingest--> metrics (+ deadletter)
    metrics   --control--> commands
    commands  --bridge--> Redis stream <prefix>:commands:<zone>

Delivery is at-least-once end to end.  The bridge writes a command to Redis
before it takes the next event, so Faust commits the command's offset only
after Redis has it; while Redis is down it retries with capped exponential
backoff and the offset stays uncommitted.  Duplicates are dropped by the
executors (deterministic ``command_id``).

The control agent's learned state -- the scaler, the routing driver, the
circuit breakers, the KV policy and the agent weights -- is saved to Redis
(``<prefix>:snapshot:<name>``, :class:`SnapshotStore`) at most every 2 s and
restored when the agent starts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
import redis.asyncio as aioredis
from governor_telemetry.records import partition_key
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core import names
from core.clock import ScaledClock
from core.settings import Settings
from streams.agent_weights_driver import AgentWeightsDriver
from streams.app import GovernorApp
from streams.breaker_driver import BreakerDriver
from streams.canary_driver import CanaryDriver
from streams.commands import Command, CommandError
from streams.kv_policy_driver import KvPolicyDriver
from streams.metrics_export import WorkerMetrics
from streams.pipeline import TelemetryProcessor, dead_letter
from streams.routing_driver import RoutingDriver
from streams.scaler_driver import Scaler

log = logging.getLogger(__name__)

STREAM_MAXLEN = 100_000
_REDIS_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)


class Snapshotting(Protocol):
    def snapshot(self) -> bytes: ...

    def restore(self, blob: bytes) -> int: ...


@dataclass
class SnapshotStore:
    """Saves and restores the control agent's state objects in Redis, one key each.

    ``parts`` maps a name to an object with ``snapshot() -> bytes`` and
    ``restore(blob) -> int``; its key is ``<prefix>:snapshot:<name>``.  All
    parts are written in one ``MSET`` at most every ``every_s`` (loop time);
    Redis trouble is logged and the next window retries.  A part whose
    snapshot is missing or unreadable starts fresh (logged), the others are
    still restored.
    """

    redis: aioredis.Redis
    prefix: str
    parts: Mapping[str, Snapshotting]
    every_s: float = 2.0
    _last_s: float = field(default=-float("inf"), init=False)

    def key(self, name: str) -> str:
        return names.snapshot(self.prefix, name)

    async def restore(self) -> dict[str, int]:
        """Restore every part that has a snapshot; returns what each restored."""
        done: dict[str, int] = {}
        for name, part in self.parts.items():
            try:
                blob = await self.redis.get(self.key(name))
            except _REDIS_ERRORS as exc:
                log.warning("no %s snapshot restored (redis: %s)", name, exc)
                continue
            if not blob:
                continue
            try:
                done[name] = part.restore(blob.encode() if isinstance(blob, str) else blob)
            except Exception as exc:  # a corrupt snapshot must not stop the agent
                log.error("%s snapshot %s unreadable, starting fresh: %r", name, self.key(name), exc)
                continue
            log.info("%s state restored from %s: %d keys", name, self.key(name), done[name])
        return done

    async def save(self, now_s: float) -> bool:
        """Write every part's snapshot unless the last write is under ``every_s`` old."""
        if now_s - self._last_s < self.every_s:
            return False
        self._last_s = now_s
        try:
            await self.redis.mset({self.key(n): p.snapshot() for n, p in self.parts.items()})
        except _REDIS_ERRORS as exc:
            log.warning("snapshots not saved (redis: %s); next window retries", exc)
            return False
        return True


@dataclass
class Pipeline:
    app: GovernorApp
    processor: TelemetryProcessor
    scaler: Scaler
    metrics: WorkerMetrics
    breaker: BreakerDriver
    snapshots: SnapshotStore


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


def build_pipeline(
    app: GovernorApp, settings: Settings, clock: ScaledClock, metrics: WorkerMetrics | None = None
) -> Pipeline:
    metrics = metrics or WorkerMetrics()
    processor = TelemetryProcessor(settings)
    scaler = Scaler(settings)
    kv_policy = KvPolicyDriver(ttl_ms=int(settings.command_ttl_s * 1000))  # KV relocation (node windows)
    breaker = BreakerDriver(settings)  # one circuit breaker per model|zone (streams.breaker_driver)
    agent_weights = AgentWeightsDriver(settings)  # RAG/tool/LLM weights per model|zone (docs/model.md §15 (agents))
    parts = settings.partitions
    telemetry = app.topic(settings.topic("telemetry"), partitions=parts)
    metrics_topic = app.topic(settings.topic("metrics"), partitions=parts)
    commands = app.topic(settings.topic("commands"), partitions=parts)
    deadletter = app.topic(settings.topic("deadletter"), partitions=1)
    events = app.topic(settings.topic("events"), partitions=parts)
    redis = aioredis.Redis.from_url(str(settings.redis_url), socket_timeout=5.0, socket_connect_timeout=5.0)
    zones = set(settings.zones)
    routed_families = {m for pair in settings.fallbacks for m in pair}  # the RoutingDriver's
    canary = CanaryDriver(settings, redis)  # rollouts in <prefix>:canary:<model> (streams.canary_driver)
    # Routing runs on a window before the scaler sees it: the forecast 2 windows past the
    # scaler's last one is the window the new routes apply to.
    routing = RoutingDriver(
        settings, breaker_of=breaker.state_of, forecast_of=lambda m, z: scaler.rate_forecast(m, z, steps=2)
    )  # GOVERNOR_FALLBACKS families (streams.canary_driver)
    snapshots = SnapshotStore(
        redis,
        settings.topic_prefix,
        {"scaler": scaler, "routing": routing, "breaker": breaker, "kv": kv_policy, "agents": agent_weights},
    )

    async def send_dead_letter(dl: dict[str, Any]) -> None:
        metrics.observe_dead_letter(dl["reason"])
        await deadletter.send(value=orjson.dumps(dl))

    async def publish_windows(closed: list[dict[str, Any]]) -> None:
        for m in closed:
            metrics.observe_window(m)
            await metrics_topic.send(key=partition_key(m["model"], m["zone"]), value=orjson.dumps(m))

    @app.agent(telemetry, name="ingest")
    async def ingest(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            now = clock.now_ms()
            source = {"topic": msg.topic, "partition": msg.partition, "offset": msg.offset}
            res = processor.process(event.value, source, now)
            metrics.records.inc(res.valid + len(res.dead_letters))
            if res.dead_letters:
                # One log line per message, not per record: a replay of old data or a
                # broken producer must not become a flood of log lines (measured: the
                # per-record line was ~30 % of the worker's time on an all-late stream).
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
            closed = processor.close_due(None, now)
            if closed:
                await publish_windows(closed)

    @app.timer(  # type: ignore[untyped-decorator]  # Faust's timer decorator is untyped
        max(0.05, clock.to_wall_s(settings.window_s * 1000) / 10), name="close-windows"
    )
    async def close_windows() -> None:
        now = clock.now_ms()
        await publish_windows(processor.close_due(now, now))

    async def publish(cmd: Command, what: str) -> None:
        metrics.commands.labels(cmd.kind, cmd.zone).inc()
        log.info("command %s %s %s (%s)", cmd.command_id, cmd.zone, what, cmd.reason)
        await commands.send(key=cmd.zone.encode(), value=cmd.encode())

    async def drive_canary(m: dict[str, Any]) -> None:
        try:
            cmds = await canary.on_window(m, clock.now_ms())
        except _REDIS_ERRORS as exc:
            log.warning("canary step skipped (redis: %s)", exc)
            return
        except (ValueError, KeyError, TypeError) as exc:  # a malformed rollout key: operator's to fix
            log.error("canary step failed for %s: %s", m.get("model"), exc)
            return
        for cc in cmds:
            await publish(cc, f"canary {cc.model} -> {cc.payload['share']:.2f}")

    async def drive_routing(m: dict[str, Any]) -> None:
        try:
            cmds = routing.on_window(m, clock.now_ms())
        except ValueError as exc:  # a window the router cannot use (ParameterError)
            log.error("routing step failed for %s/%s: %s", m.get("model"), m.get("zone"), exc)
            return
        for rc in cmds:
            await publish(rc, f"route {rc.model}")

    async def drive_breaker(m: dict[str, Any]) -> None:
        cmds = breaker.on_window(m, clock.now_ms())  # malformed windows are skipped (logged) inside
        for t in breaker.drain_transitions():
            metrics.observe_breaker(t.model, t.zone, t.state, changed=True)
        target = (str(m.get("model")), str(m.get("zone")))
        if target in breaker.states:  # a target the breaker judges (not a malformed window)
            metrics.observe_breaker(*target, breaker.states[target].name, changed=False)
        for bc in cmds:
            await publish(bc, f"breaker {bc.payload['target']} -> {bc.payload['state']}")

    async def drive_agent_weights(m: dict[str, Any]) -> None:
        for ac in agent_weights.on_window(m, clock.now_ms()):  # malformed windows are skipped (logged) inside
            metrics.observe_agent_weights(ac.model, ac.zone, ac.payload["weights"])
            await publish(ac, f"agents {ac.model}")

    @app.agent(metrics_topic, name="control")
    async def control(stream: Any) -> None:
        await snapshots.restore()
        async for event in stream.events():
            try:
                m = orjson.loads(event.value)
            except orjson.JSONDecodeError as exc:
                await send_dead_letter(
                    dead_letter(
                        f"bad metrics record: {exc}",
                        {"topic": event.message.topic, "offset": event.message.offset},
                        event.value.decode("utf-8", "replace"),
                        clock.now_ms(),
                    )
                )
                continue
            if m.get("scope") == "node" and (rc := kv_policy.on_node_window(m, clock.now_ms())) is not None:
                await publish(rc, f"relocate {rc.payload['node']}")
            if m.get("scope") == "zone":
                await drive_canary(m)
                await drive_breaker(m)  # before routing: the route sees this window's breaker state
                await drive_routing(m)
                await drive_agent_weights(m)
            cmd = scaler.on_window(m, clock.now_ms())
            for ev in scaler.drain_events():
                metrics.events.labels(ev["kind"], ev.get("signal", "")).inc()
                if ev["kind"] == "feedforward_mode":
                    metrics.ff_mode.labels(ev["model"], ev["zone"]).set(1.0 if ev["on"] else 0.0)
                await events.send(key=partition_key(ev["model"], ev["zone"]), value=orjson.dumps(ev))
                if ev["kind"] in ("zone_lost", "zone_returned") and ev["model"] not in routed_families:
                    # Zone-aware routing: gateways stop sending to a lost zone and wait for a
                    # healed one's capacity.  A fallback family's routes are the RoutingDriver's
                    # (a lost zone has no windows there, so it gets no weight either).
                    for rc in scaler.zone_route_commands(ev["model"], int(ev["window_end_ms"]), clock.now_ms()):
                        await publish(rc, f"route {rc.model} by zone")
            await snapshots.save(asyncio.get_running_loop().time())
            for (model, zone), est in scaler.sde_estimates().items():
                for name in ("theta", "mu", "sigma"):
                    metrics.sde.labels(model, zone, name).set(getattr(est, name))
            if cmd is None:
                continue
            metrics.target.labels(cmd.model, cmd.zone).set(cmd.target_replicas)
            await publish(cmd, f"{cmd.model} -> {cmd.target_replicas}")

    @app.agent(commands, name="bridge")
    async def bridge(stream: Any) -> None:
        # One hybrid logical clock per worker: each bridged command is a send event,
        # stamped (tick at the clock's physical ms) before the XADD.  The stamp is not
        # part of command_id, so a re-delivered decision is still dropped as a duplicate.
        from controllers.hlc import Hlc

        hlc = Hlc()
        async for event in stream.events():
            msg = event.message
            try:
                cmd = Command.decode(event.value)
                if cmd.zone not in zones:
                    raise CommandError(f"unknown zone {cmd.zone!r} (GOVERNOR_ZONES={sorted(zones)})")
            except CommandError as exc:
                await send_dead_letter(
                    dead_letter(
                        f"bad command: {exc}",
                        {"topic": msg.topic, "partition": msg.partition, "offset": msg.offset},
                        bytes(event.value).decode("utf-8", "replace"),
                        clock.now_ms(),
                    )
                )
                continue
            now = clock.now_ms()
            hlc = hlc.tick(now)
            await xadd_with_retry(
                redis,
                names.command_stream(settings.topic_prefix, cmd.zone),
                {"cmd": cmd.with_hlc(hlc.encode()).encode(), "bridged_ms": str(now).encode()},
                metrics,
            )
            metrics.bridged.labels(cmd.zone).inc()

    return Pipeline(app=app, processor=processor, scaler=scaler, metrics=metrics, breaker=breaker, snapshots=snapshots)
