"""Redis for what must never hold up a decision: a short timeout, and a pause after a failure.

The worker's control agent touches Redis on the way for things that are not
the decision itself: the canary rollout it may advance, the status record for
``governor status``, the executor heartbeats, the snapshots.  A Redis that
*hangs* (a SIGSTOP, a stalled failover) answers none of them, and with the
client's socket timeout each call held the agent for 5 s: no window was
decided while Redis hung, and the silence check then called live telemetry
stale.  :class:`SideChannel` runs each such call with a short timeout; after
a failure it skips the side work for a back-off (doubling to a cap) instead
of timing out again on every window, and says so once.  Commands still go
through the bridge's own client, which retries until Redis has them.

>>> import asyncio
>>> side = SideChannel(timeout_s=0.05, clock=lambda: 0.0)
>>> async def hang() -> int:
...     await asyncio.sleep(1)
...     return 1
>>> async def fine() -> int:
...     return 2
>>> asyncio.run(side.call("probe", hang)) is None, side.degraded
(True, True)
>>> asyncio.run(side.call("probe", fine)) is None  # skipped during the back-off
True
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["SideChannel"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError, asyncio.TimeoutError)


class SideChannel:
    """Runs best-effort Redis calls with a timeout and a back-off after a failure."""

    def __init__(
        self,
        timeout_s: float = 0.5,
        backoff_s: float = 1.0,
        max_backoff_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self._skip_until = 0.0
        self._next_backoff = backoff_s
        self.degraded = False
        self.skipped = 0

    async def call(self, what: str, fn: Callable[[], Awaitable[T]]) -> T | None:
        """``await fn()`` within the timeout; None when it failed or is skipped (logged once per spell)."""
        if self.degraded and self.clock() < self._skip_until:
            self.skipped += 1
            return None
        try:
            out = await asyncio.wait_for(fn(), self.timeout_s)
        except _ERRORS as exc:
            if not self.degraded:
                log.warning("redis side work (%s) failed: %r; skipping it for %.1f s", what, exc, self._next_backoff)
            self.degraded = True
            self._skip_until = self.clock() + self._next_backoff
            self._next_backoff = min(self.max_backoff_s, self._next_backoff * 2)
            return None
        if self.degraded:
            log.warning("redis side work answers again (%s); %d calls were skipped", what, self.skipped)
        self.degraded, self._next_backoff, self.skipped = False, self.backoff_s, 0
        return out
