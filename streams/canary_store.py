"""The canary rollouts in Redis: read for the loop, written back by compare-and-set.

A rollout is the key ``<prefix>:canary:<model>`` (``governor canary start``
writes it).  Before each zone window the shell reads the family's rollout
(:meth:`CanaryStore.read`) and the loop observes it
(:class:`loop.effects.Rollout`); the loop's canary driver returns its step as
a :class:`loop.effects.SwapWrite`, applied here as an optimistic transaction
(:meth:`CanaryStore.swap`): an operator's ``abort`` between read and write
wins, and the next window starts from it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import WatchError

from core import names
from core.settings import Settings
from loop.effects import SwapWrite

log = logging.getLogger(__name__)

__all__ = ["CanaryStore"]


@dataclass
class CanaryStore:
    """Reads and swaps the rollouts stored in Redis."""

    settings: Settings
    redis: aioredis.Redis

    async def read(self, model: str) -> bytes | None:
        """The rollout of ``model``'s family (a canary version's too), or None."""
        raw = await self.redis.get(names.canary_state(self.settings.topic_prefix, model.partition("@")[0]))
        return raw.encode() if isinstance(raw, str) else raw

    async def swap(self, write: SwapWrite) -> bool:
        """Set the key if it still holds what the step was computed from; whether it did."""
        async with self.redis.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(write.key)
                if await pipe.get(write.key) != write.expect:
                    await pipe.unwatch()  # type: ignore[no-untyped-call]
                    log.info("canary %s changed since it was read: its step is dropped", write.key)
                    return False
                pipe.multi()  # type: ignore[no-untyped-call]
                pipe.set(write.key, write.value)
                await pipe.execute()
            except WatchError:
                log.info("canary %s changed while it was written: its step is dropped", write.key)
                return False
        return True
