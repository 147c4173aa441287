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

Apply at a compensated time: a command whose ``detail`` has ``apply_at_ms``
(on the shared run clock, i.e. the reference clock) is held until this
executor's clock *corrected by the estimated offset* (``now + offset``; the
offset is Redis minus local, scaled by the clock speed) reaches it, but never
past ``expires_at_ms`` -- if the wait reaches the expiry the command is
refused as ``expired`` -- and never longer than ``GOVERNOR_MAX_CLOCK_SKEW_S``
(wall time; the guard refuses an ``apply_at_ms`` further ahead anyway).
The wait (:func:`hold_until`) holds the zone executor's poll loop (commands
of one zone apply in order).  Commands without ``apply_at_ms`` (the default)
apply at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaProducer
from prometheus_client import CollectorRegistry, Gauge
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from controllers.hlc import ClockOffsetEstimator, RttEstimator

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
    ) -> None:
        self.zone = zone
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

    async def probe_once(self) -> dict[str, Any]:
        """One PING + one TIME exchange (+ the Kafka publish of the record); returns the record."""
        p0 = time.perf_counter()
        await self.redis.ping()
        redis_rtt = max((time.perf_counter() - p0) * 1000.0, 1e-3)
        self.rtt = self.rtt.probe(self.zone, redis_rtt)
        t0 = _wall_ms()
        secs, usecs = await self.redis.time()
        t3 = _wall_ms()
        server = secs * 1000.0 + usecs / 1000.0
        self.offset = self.offset.sample(t0, server, server, t3)
        self.probes += 1
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


async def hold_until(
    target_ms: float,
    now_ms: Callable[[], float],
    to_wall_s: Callable[[float], float],
    max_wall_s: float,
    stopping: asyncio.Event,
) -> bool:
    """Wait until ``now_ms()`` reaches ``target_ms``, at most ``max_wall_s`` wall seconds (or until
    ``stopping``); whether the target was reached.  Sleeps in steps of at most 1 s, so a clock
    correction meanwhile is seen.

    >>> asyncio.run(hold_until(1e18, lambda: 0.0, lambda ms: ms / 1000, 0.01, asyncio.Event()))
    False
    """
    deadline = time.monotonic() + max(0.0, max_wall_s)
    while (gap := target_ms - now_ms()) > 0:
        left = deadline - time.monotonic()
        if left <= 0 or stopping.is_set():
            return False
        await asyncio.sleep(max(0.001, min(to_wall_s(gap), 1.0, left)))
    return True
