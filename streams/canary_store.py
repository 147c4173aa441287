"""The canary rollouts in Redis, stepped by the pure :class:`loop.canary_driver.CanaryDriver`.

A rollout is the key ``<prefix>:canary:<model>`` (``governor canary start``
writes it).  For each zone window of a rollout's family the store reads the
rollout, asks the driver which window pairs are due, and applies each step
as an optimistic transaction: an operator's ``abort`` between read and
write makes it re-read, never overwrite it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import orjson
import redis.asyncio as aioredis
from redis.exceptions import WatchError

from controllers.window_record import WindowRecord
from core import names
from core.settings import Settings
from loop.canary_driver import CanaryDriver, Pair
from loop.commands import Command

log = logging.getLogger(__name__)

__all__ = ["CanaryStore"]


@dataclass
class CanaryStore:
    """Advances the rollouts stored in Redis from the worker's zone windows."""

    settings: Settings
    redis: aioredis.Redis
    max_retries: int = 5
    driver: CanaryDriver = field(init=False)

    def __post_init__(self) -> None:
        self.driver = CanaryDriver(self.settings)

    async def on_window(self, m: WindowRecord, now_ms: int) -> list[Command]:
        """Feed one window record; returns the ``canary`` commands to publish."""
        if m.scope != "zone":
            return []
        base = m.model.partition("@")[0]
        raw = await self.redis.get(names.canary_state(self.settings.topic_prefix, base))
        due = self.driver.due(m, None if raw is None else orjson.loads(raw))
        cmds: list[Command] = []
        for pair in due or ():
            cmds += await self._step(base, pair, m.window_end_ms, now_ms)
        return cmds

    async def _step(self, base: str, pair: Pair | None, seen_ms: int, now_ms: int) -> list[Command]:
        key = names.canary_state(self.settings.topic_prefix, base)
        for _ in range(self.max_retries):
            try:
                async with self.redis.pipeline(transaction=True) as pipe:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    if raw is None:
                        return []
                    rollout, cmds = self.driver.advance(orjson.loads(raw), pair, seen_ms, now_ms)
                    if rollout is None:
                        await pipe.unwatch()  # type: ignore[no-untyped-call]
                        return []
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.set(key, orjson.dumps(rollout))
                    await pipe.execute()
            except WatchError:
                continue
            return cmds
        log.warning("canary %s: gave up after %d conflicting writes", base, self.max_retries)
        return []
