"""The worker's half of admission: a review runs in a worker thread, one at a time, never awaited by a decision.

The analysis is the loop's (:meth:`loop.control_loop.ControlLoop.observe` of
:class:`loop.effects.AdmissionEntries`, :meth:`loop.admission_driver.AdmissionDriver.review`);
this module only moves it off the event loop (see the driver's docstring, "Never in the way
of a decision").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

__all__ = ["OffLoopReview"]

T = TypeVar("T")


class OffLoopReview:
    """Runs reviews in the background, one at a time, their analysis in a worker thread."""

    def __init__(self) -> None:
        self._job: asyncio.Future[None] | None = None

    def launch(self, review_round: Callable[[], Awaitable[None]]) -> bool:
        """Start ``review_round`` in the background unless the last one is still running; never waits for it."""
        if self._job is not None and not self._job.done():
            return False
        self._job = asyncio.ensure_future(review_round())
        self._job.add_done_callback(_report)
        return True

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread (its inputs copies the event loop no longer writes)."""
        return await asyncio.to_thread(fn, *args)


def _report(job: asyncio.Future[None]) -> None:
    """A review that failed is logged (the next one starts as usual)."""
    if not job.cancelled() and job.exception() is not None:
        log.error("admission review failed", exc_info=job.exception())
