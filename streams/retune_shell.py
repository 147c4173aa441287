"""The worker's half of online retuning: the search in a separate process, never awaited by a decision.

The loop keeps the rings and says which model is due (:class:`loop.retune_driver.RetuneDriver`); this
shell reads the kill switch (``<prefix>:retune:paused``, set by ``governor pause --retune``), hands a
due job to ``search`` in a one-process pool (the simulation is CPU-bound Python: in a thread it would
hold the GIL against the event loop), performs the driver's decision on the result and writes the
status record to ``<prefix>:retune`` for ``governor status``.  ``search`` is injected by the process
that builds the worker (:mod:`governor.worker`: :func:`sim.retune.propose`; the worker shell may not
import the simulator); without one, retuning is off.  One job at a time.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any

import orjson
import redis.asyncio as aioredis

from controllers.retune import RetuneJob
from core import names
from core.clock import ScaledClock
from loop.retune_driver import RetuneDriver
from streams.side_redis import SideChannel

log = logging.getLogger(__name__)

__all__ = ["OffLoopRetune", "Search"]

Search = Callable[[RetuneJob], dict[str, Any]]


class OffLoopRetune:
    """Launches due retunes in the background (module docstring); :meth:`tick` never waits for one."""

    def __init__(
        self,
        driver: RetuneDriver,
        search: Search | None,
        redis: aioredis.Redis,
        prefix: str,
        clock: ScaledClock,
        side: SideChannel,
        executor: Executor | None = None,
    ) -> None:
        self.driver, self.search, self.redis, self.clock, self.side = driver, search, redis, clock, side
        self.paused_key, self.status_key = names.retune_paused(prefix), names.retune(prefix)
        self._executor = executor
        self._job: asyncio.Future[None] | None = None

    @property
    def enabled(self) -> bool:
        return self.driver.mode != "off" and self.search is not None

    def executor(self) -> Executor:
        if self._executor is None:  # spawned, not forked: the worker's threads and sockets stay behind
            self._executor = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return self._executor

    async def killed(self) -> bool | None:
        """The kill switch: None while Redis cannot say (then nothing is applied and nothing reverted: hold)."""
        raw = await self.side.call("retune", functools.partial(self.redis.exists, self.paused_key))
        return None if raw is None else bool(raw)

    async def tick(self) -> None:
        """The kill switch acted on at once; a due model's search launched unless one is running."""
        if not self.enabled:
            return
        now, killed = self.clock.now_ms(), await self.killed()
        for rec in [] if killed is None else self.driver.on_kill_switch(killed, now):
            await self.write(rec)
        if self._job is not None and not self._job.done():
            return
        jobs = self.driver.due(now)
        if jobs:
            for later in jobs[1:]:  # one at a time: the others wait for their next period
                self.driver.running.discard(later.model)
            self._job = asyncio.ensure_future(self.run(jobs[0]))

    async def run(self, job: RetuneJob) -> None:
        assert self.search is not None
        try:
            result = await asyncio.get_running_loop().run_in_executor(self.executor(), self.search, job)
        except Exception as exc:  # noqa: BLE001 - a failed search changes no gain
            log.error("retune of %s failed: %s", job.model, exc, exc_info=exc)
            await self.write(self.driver.on_error(job.model, f"{type(exc).__name__}: {exc}", self.clock.now_ms()))
            return
        rec = self.driver.on_result(result, await self.killed(), self.clock.now_ms())
        log.info("retune %s: %s (%s)", job.model, rec["action"], rec["reason"], extra={"model": job.model})
        await self.write(rec)

    async def write(self, rec: dict[str, Any]) -> None:
        value = orjson.dumps(rec)
        await self.side.call("retune", functools.partial(self.redis.hset, self.status_key, rec["model"], value))

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
