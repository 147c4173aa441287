"""An executor's liveness key: ``<prefix>:executor:<zone>:heartbeat``.

Every ``interval_s`` (``GOVERNOR_HEARTBEAT_S``, default 5) a running
:class:`~executors.executor.ZoneExecutor` writes
:func:`core.names.executor_heartbeat` (``SET ... PX``) with a TTL of three
intervals, JSON ``{"ts_ms", "wall_ms", "executor", "backend", "timing"}`` (``executor``: a unique
id of this process, ``ts_ms``: its clock, ``wall_ms``: the wall clock, ``timing``: once
probed, the zone's measured lead for cross-zone actions,
:meth:`executors.timing.ZoneTiming.summary`, read by the worker).  While the key exists some
executor of the zone is alive; it disappears at most three intervals after
the last one stopped or lost Redis.  A clean stop expires the key at once
when this executor wrote it last (an optimistic compare-and-expire:
``WATCH``, ``GET``, then ``MULTI`` / ``SET ... PX 1`` / ``EXEC``, which
Redis refuses when another replica wrote the key in between; no script:
the ACL grants neither ``EVAL`` nor ``DEL``); another replica of the zone
writes it again within one interval.

A write that fails is logged (one line per failure) and counted on
``governor_executor_heartbeat_failures_total{zone}``; the gauge
``governor_executor_heartbeat_ms{zone}`` holds the time of the last one
written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge
from redis.exceptions import WatchError

from core import names

log = logging.getLogger(__name__)


class Heartbeat:
    """Writes one zone executor's heartbeat key until stopped (see the module docstring)."""

    def __init__(
        self,
        redis: Any,
        prefix: str,
        zone: str,
        executor: str,
        backend: str,
        interval_s: float,
        now_ms: Callable[[], int],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.redis, self.key, self.zone = redis, names.executor_heartbeat(prefix, zone), zone
        self.executor, self.backend = executor, backend
        self.interval_s = interval_s
        self.now_ms = now_ms
        self.written = 0
        self.failures = 0
        self._last: bytes = b""
        self.timing: Callable[[], dict[str, Any] | None] | None = None  # the zone's measured lead, if any
        r = registry or CollectorRegistry()
        self.g_last = Gauge(
            "governor_executor_heartbeat_ms", "executor clock of the last heartbeat written", ("zone",), registry=r
        )
        self.c_fail = Counter(
            "governor_executor_heartbeat_failures", "heartbeat writes that failed", ("zone",), registry=r
        )

    @property
    def ttl_ms(self) -> int:
        return max(1, int(self.interval_s * 3000))

    async def beat(self) -> bool:
        """Write the key once; whether it was written (a failure is logged and counted)."""
        now = self.now_ms()
        wall_ms = int(time.time() * 1000)  # status's age: wall time, whatever the run's clock
        beat: dict[str, Any] = {"ts_ms": now, "wall_ms": wall_ms, "executor": self.executor, "backend": self.backend}
        try:
            timing = self.timing() if self.timing is not None else None
        except Exception:  # noqa: BLE001 - the beat goes out without it: the worker's fixed lead then
            log.exception("executor %s: timing summary failed; heartbeat written without it", self.zone)
            timing = None
        if timing is not None:
            beat["timing"] = timing
        value = orjson.dumps(beat)
        try:
            await self.redis.set(self.key, value, px=self.ttl_ms)
        except Exception as exc:  # noqa: BLE001 - never stops the executor
            self.failures += 1
            self.c_fail.labels(self.zone).inc()
            log.warning("executor %s: heartbeat %s not written (%s)", self.zone, self.key, exc)
            return False
        self._last = value
        self.written += 1
        self.g_last.labels(self.zone).set(now)
        return True

    async def run(self, stopping: asyncio.Event) -> None:
        """Beat every ``interval_s`` until ``stopping`` is set, then expire the key if ours."""
        while not stopping.is_set():
            await self.beat()
            try:
                await asyncio.wait_for(stopping.wait(), timeout=self.interval_s)
            except TimeoutError:
                pass
        await self.clear()

    async def clear(self) -> None:
        """Expire the key now if this executor wrote it last (best effort)."""
        if not self._last:
            return
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                await pipe.watch(self.key)
                if await pipe.get(self.key) != self._last:
                    return  # another replica of the zone wrote it since: its key, not ours
                pipe.multi()
                pipe.set(self.key, self._last, px=1)
                await pipe.execute()
        except WatchError:
            return  # written by another replica in between: left alone
        except Exception as exc:  # noqa: BLE001 - the TTL removes it anyway
            log.warning("executor %s: heartbeat %s not cleared (%s); it expires by TTL", self.zone, self.key, exc)
