"""Per-zone timing probes of an executor: network RTT and clock offset.

Every ``interval_s`` the executor's :class:`ZoneTiming` probes

* the round trip to Redis (``PING``) -- the zone's network RTT proxy, fed to
  an :class:`~controllers.hlc.RttEstimator` (base = mean of the last 5
  probes; factor configured per zone, else learned from observed command
  delivery delays, see :meth:`ZoneTiming.observe_delivery`);
* the round trip of the previous timing record to the Kafka results
  producer (``send_and_wait``; optional, only with a producer);
* the clock offset against Redis ``TIME``, NTP style: ``t0`` local send,
  ``t1 = t2 =`` Redis ``TIME`` (the server clock), ``t3`` local receive, into
  a :class:`~controllers.hlc.ClockOffsetEstimator` (minimum-delay sample of
  the last 8).  Offset is *server minus local* (ms of wall time), so the
  reference time is ``local + offset``.

Each probe is published to the results topic as a ``timing`` record
(``outcome: "timing"``) and to the Prometheus gauges
``governor_zone_rtt_ms{zone, path}`` (``path`` = ``redis``, ``kafka``,
``base``, ``compensation``) and ``governor_zone_clock_offset_ms{zone}`` on
the executor's registry.

The lead a cross-zone command needs here (:meth:`ZoneTiming.lead_ms`, in
the heartbeat for the worker, :mod:`controllers.apply_at`): the largest of
the last 8 delays from the bridge's ``XADD`` (the entry id: Redis's clock)
to the command being ready to apply here (this clock corrected by the
offset, so no clock difference enters it; :meth:`ZoneTiming.observe_ready`),
plus the checks a held command's release repeats (measured; at least 4
probe RTTs) and how late the poll loop comes to a due hold (measured; at
least 3 probe RTTs: its ``XAUTOCLAIM``, pause read and blocked read).  Before
any command arrived the ready delay is taken as 4 RTT compensations.

Apply at a compensated time: a command whose ``detail`` has ``apply_at_ms``
(on the shared run clock, i.e. the reference clock) is held until this
executor's clock *corrected by the estimated offset* (``now + offset``; the
offset is Redis minus local, scaled by the clock speed) reaches it, but never
past ``expires_at_ms`` -- if the wait reaches the expiry the command is
refused as ``expired`` -- and never longer than ``GOVERNOR_MAX_CLOCK_SKEW_S``
(wall time; the guard refuses an ``apply_at_ms`` further ahead anyway).
The hold ends early by the release's checks and the poll's lateness: the checks run
then, and the backend is called once the corrected clock reaches the time,
so the zone's own Redis round trips do not add to its apply time.
A held command holds only itself: the executor keeps it as a :class:`Held`
(its stream entry stays pending, unacknowledged) and goes on polling, so
commands for other models apply meanwhile; a later command for the same
``kind:model`` (``Command.order_field``) that is not older by the HLC rule
(:func:`supersedes`) ends the held one as ``stale`` (``superseded by ...``),
and an older one is itself ``stale``.  Commands without ``apply_at_ms`` (the
default) apply at once.  While it waits, XAUTOCLAIM (this executor's, every
``retry_idle_ms``; a peer's likewise) claims the pending entry again: this
executor skips its own held entries, a peer holds the command too and the
later of the two to apply finds the marker (``duplicate``); each claim
raises the entry's delivery counter, so an executor that dies mid-hold may
leave it to end as ``failed`` (``delivery limit``) rather than late.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer
from prometheus_client import CollectorRegistry, Gauge
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from controllers.hlc import ClockOffsetEstimator, RttEstimator
from loop.commands import Command

log = logging.getLogger(__name__)

TIMING_SCHEMA_VERSION = 1


def _wall_ms() -> float:
    return time.time() * 1000.0


class ZoneTiming:
    """RTT and clock-offset estimates of one zone's executor (mutable holder of pure values)."""

    def __init__(
        self,
        zone: str,
        redis: aioredis.Redis,
        *,
        producer: AIOKafkaProducer | None = None,
        results_topic: str = "",
        registry: CollectorRegistry | None = None,
        factor: float | None = None,
        window: int = 5,
        offset_window: int = 8,
        wall_ms: Callable[[], float] = _wall_ms,
    ) -> None:
        self.zone = zone
        self.wall_ms = wall_ms  # this process's wall clock (ScaledClock.wall_ms: an injected offset moves it)
        self.ready: deque[float] = deque(maxlen=offset_window)  # XADD -> ready to apply, reference ms
        self.prep: deque[float] = deque(maxlen=offset_window)  # a held command's release checks, wall ms
        self.wake: deque[float] = deque(maxlen=offset_window)  # the poll loop's lateness to a due hold, wall ms
        self.probed_ms: float | None = None  # this wall clock at the last probe
        self.redis = redis
        self.producer = producer
        self.results_topic = results_topic
        self.rtt = RttEstimator(window=window, factors={zone: factor} if factor else {})
        self.offset = ClockOffsetEstimator(window=offset_window)
        self.kafka_rtt_ms: float | None = None
        self.probes = 0
        r = registry or CollectorRegistry()
        self.g_rtt = Gauge(
            "governor_zone_rtt_ms",
            "zone network RTT proxy: redis/kafka probe, base, compensation",
            ("zone", "path"),
            registry=r,
        )
        self.g_offset = Gauge(
            "governor_zone_clock_offset_ms", "Redis TIME minus executor clock (NTP filter)", ("zone",), registry=r
        )

    def offset_ms(self) -> float:
        """Estimated reference (Redis) clock minus this executor's clock, ms (0 before a probe)."""
        return self.offset.offset_ms()

    def observe_delivery(self, delay_ms: float) -> None:
        """Learn the zone's RTT factor from one observed bridge -> executor delay (ms)."""
        if delay_ms > 0:
            self.rtt = self.rtt.observe_delay(self.zone, delay_ms)

    def observe_ready(self, entry_id: bytes | str) -> float | None:
        """One delay from the ``XADD`` of stream entry ``entry_id`` to now, on the reference clock (the
        entry id's ms are Redis's); kept when plausible (0 to 60 s, after a probe), returned."""
        raw = entry_id.decode("ascii", "replace") if isinstance(entry_id, bytes) else str(entry_id)
        ms, _, _ = raw.partition("-")
        if not self.probes or not ms.isdigit():
            return None
        delay = self.wall_ms() + self.offset_ms() - int(ms)
        if not 0.0 <= delay < 60_000.0:
            return None
        self.ready.append(delay)
        return delay

    def observe_prep(self, spent_ms: float) -> None:
        """How long one held command's release checks took (wall ms)."""
        if 0.0 <= spent_ms < 60_000.0:
            self.prep.append(spent_ms)

    def observe_wake(self, late_ms: float) -> None:
        """How late (wall ms) the poll loop came to a held command that was due."""
        if 0.0 <= late_ms < 60_000.0:
            self.wake.append(late_ms)

    def prep_ms(self) -> float:
        """How early a hold ends: the release's checks (the largest of the last 8, at least 4 probe RTTs: its
        four Redis reads) and the poll loop's lateness (the largest of the last 8, at least 3 probe RTTs: its
        XAUTOCLAIM, pause read and blocked read)."""
        base = self.rtt.base_ms(self.zone)
        return max([4.0 * base, *self.prep]) + max([3.0 * base, *self.wake])

    def lead_ms(self) -> float:
        """The lead a command needs to be applied here on time, wall ms (see the module docstring)."""
        ready = max(self.ready) if self.ready else 4.0 * self.rtt.compensation_ms(self.zone)
        return ready + self.prep_ms()

    def summary(self) -> dict[str, Any] | None:
        """What the heartbeat publishes for the worker (:func:`controllers.apply_at.parse_zone_lead`); None
        before the first probe."""
        if self.probed_ms is None:
            return None
        return {
            "lead_ms": round(self.lead_ms(), 3),
            "ready_ms": round(max(self.ready), 3) if self.ready else None,
            "prep_ms": round(self.prep_ms(), 3),
            "rtt_ms": round(self.rtt.base_ms(self.zone), 3),
            "offset_ms": round(self.offset_ms(), 3),
            "offset_error_ms": round(self.offset.error_bound_ms(), 3),
            "age_ms": round(max(0.0, self.wall_ms() - self.probed_ms), 3),
            "samples": len(self.ready),
        }

    async def probe_once(self) -> dict[str, Any]:
        """One PING + one TIME exchange (+ the Kafka publish of the record); returns the record."""
        p0 = time.perf_counter()
        await self.redis.ping()
        redis_rtt = max((time.perf_counter() - p0) * 1000.0, 1e-3)
        self.rtt = self.rtt.probe(self.zone, redis_rtt)
        t0 = self.wall_ms()
        secs, usecs = await self.redis.time()
        t3 = self.wall_ms()
        server = secs * 1000.0 + usecs / 1000.0
        self.offset = self.offset.sample(t0, server, server, t3)
        self.probes += 1
        self.probed_ms = t3
        base, comp, offset = (self.rtt.base_ms(self.zone), self.rtt.compensation_ms(self.zone), self.offset.offset_ms())
        record: dict[str, Any] = {
            "schema_version": TIMING_SCHEMA_VERSION,
            "record": "timing",
            "outcome": "timing",
            "zone": self.zone,
            "at_ms": int(t3),
            "redis_rtt_ms": redis_rtt,
            "kafka_rtt_ms": self.kafka_rtt_ms,
            "base_rtt_ms": base,
            "rtt_factor": self.rtt.factor(self.zone),
            "compensation_ms": comp,
            "clock_offset_ms": offset,
            "offset_delay_ms": self.offset.delay_ms(),
            "offset_error_bound_ms": self.offset.error_bound_ms(),
            "probes": self.probes,
        }
        self.g_rtt.labels(self.zone, "redis").set(redis_rtt)
        self.g_rtt.labels(self.zone, "base").set(base)
        self.g_rtt.labels(self.zone, "compensation").set(comp)
        self.g_offset.labels(self.zone).set(offset)
        if self.producer is not None and self.results_topic:
            k0 = time.perf_counter()
            await self.producer.send_and_wait(self.results_topic, orjson.dumps(record), key=self.zone.encode())
            self.kafka_rtt_ms = (time.perf_counter() - k0) * 1000.0
            self.g_rtt.labels(self.zone, "kafka").set(self.kafka_rtt_ms)
        return record

    async def run(self, interval_s: float, stopping: asyncio.Event) -> None:
        """Probe every ``interval_s`` until ``stopping`` is set; transient failures are logged and skipped."""
        while not stopping.is_set():
            try:
                await self.probe_once()
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                log.warning("timing %s: redis probe failed (%s)", self.zone, exc)
            except Exception as exc:  # noqa: BLE001 - Kafka trouble must not stop the probes
                log.warning("timing %s: probe failed (%s)", self.zone, exc)
            try:
                await asyncio.wait_for(stopping.wait(), timeout=interval_s)
            except TimeoutError:
                pass


@dataclass(frozen=True)
class Held:
    """A command waiting for its ``apply_at_ms``: due once the corrected clock reaches ``target_ms``
    (``min(apply_at_ms, expires_at_ms)``) or the wall clock (``time.monotonic()``) ``until_s``."""

    entry_id: Any
    fields: Any
    cmd: Command
    target_ms: float
    until_s: float
    early_ms: float = 0.0  # the release starts this much (run ms) before target_ms: its checks, then the wait

    def due(self, corrected_now_ms: float, monotonic_s: float) -> bool:
        return corrected_now_ms >= self.target_ms - self.early_ms or monotonic_s >= self.until_s

    def wait_s(
        self, corrected_now_ms: float, to_wall_s: Callable[[float], float], monotonic_s: float, early_ms: float = -1.0
    ) -> float:
        """Wall seconds until this is due (0 when it is); ``early_ms`` (default: its own) before ``target_ms``."""
        early = self.early_ms if early_ms < 0 else early_ms
        return max(0.0, min(to_wall_s(self.target_ms - early - corrected_now_ms), self.until_s - monotonic_s))


def supersedes(new: Command, held: Command) -> bool:
    """Whether ``new`` replaces ``held`` (same ``order_field``): by HLC when both are stamped
    (:func:`~loop.commands.hlc_stale`'s rule: an equal stamp is not older), else by ``basis_ms``.

    >>> from loop.commands import Command
    >>> def c(basis, hlc=0):
    ...     return Command(kind="scale", zone="z", model="m", target_replicas=1, reason="", issued_at_ms=0,
    ...                    expires_at_ms=1, basis_ms=basis).with_hlc(hlc)
    >>> supersedes(c(5, 7 << 16), c(9, 6 << 16)), supersedes(c(5, 5 << 16), c(1, 6 << 16)), supersedes(c(2), c(1))
    (True, False, True)
    """
    if new.hlc and held.hlc:
        return new.hlc >= held.hlc
    return new.basis_ms >= held.basis_ms
