"""The only clock the I/O layers read.

Production runs at ``speed=1``: ``now_ms()`` is the wall clock.  A replay
(the demo, benchmarks) runs trace time faster than wall time; every process
of one run shares ``origin_s`` and ``speed`` through the settings, so the
fleet, the stream worker and the executors agree on what "now" is and on
when a command expires.

``offset_ms`` shifts this process's idea of the wall clock (a test hook: the
cross-zone tests give each executor a clock that is off by a known amount;
production leaves it 0).  Everything the clock answers moves with it,
``now_ms``, ``wall_ms`` and the stamp.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class ScaledClock:
    speed: float = 1.0
    origin_s: float = 0.0  # wall epoch seconds where scaled time == wall time
    offset_ms: float = 0.0  # injected error of this process's wall clock (tests; 0 in production)

    def wall_ms(self) -> float:
        """This process's wall clock, ms (the system clock plus the injected ``offset_ms``)."""
        return time.time() * 1000.0 + self.offset_ms

    def now_ms(self) -> int:
        if self.speed == 1.0 or self.origin_s <= 0:
            return int(self.wall_ms())
        wall = self.wall_ms() / 1000.0
        return int((self.origin_s + (wall - self.origin_s) * self.speed) * 1000)

    def stamp(self) -> dict[str, float]:
        """Now on this clock and on the wall, with the clock itself: what a heartbeat publishes, so
        another process (``governor status`` in an operator's shell, at speed 1) can turn this run's
        times into wall ages without being told ``GOVERNOR_CLOCK_SPEED`` / ``GOVERNOR_CLOCK_ORIGIN_S``."""
        return {
            "ts_ms": self.now_ms(),
            "wall_ms": int(self.wall_ms()),
            "clock_speed": self.speed,
            "clock_origin_s": self.origin_s,
        }

    def to_wall_s(self, dt_ms: float) -> float:
        """How many wall seconds a span of scaled milliseconds takes."""
        return dt_ms / 1000.0 / self.speed
