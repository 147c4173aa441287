"""The worker's half of admission: a review runs in a worker thread, one at a time, never awaited by a decision.

The analysis is the pure :meth:`loop.admission_driver.AdmissionDriver.review`; this module only moves it
off the event loop (see the driver's docstring, "Never in the way of a decision").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from loop.admission_driver import AdmissionDriver

log = logging.getLogger(__name__)

__all__ = ["OffLoopReview"]


class OffLoopReview:
    """Runs :class:`AdmissionDriver` reviews in the background, one at a time."""

    def __init__(self, driver: AdmissionDriver) -> None:
        self.driver = driver
        self._job: asyncio.Future[None] | None = None

    def launch(self, review_round: Callable[[], Awaitable[None]]) -> bool:
        """Start ``review_round`` in the background unless the last one is still running; never waits for it."""
        if self._job is not None and not self._job.done():
            return False
        self._job = asyncio.ensure_future(review_round())
        self._job.add_done_callback(_report)
        return True

    async def review(self, entries: Mapping[Any, Any], now_ms: int) -> tuple[dict[str, bytes], list[dict[str, Any]]]:
        """The driver's review in a worker thread on copies of its inputs: the event loop goes on deciding."""
        latencies = self.driver.latencies()  # read here, on the loop that writes them (on_window)
        return await asyncio.to_thread(self.driver.review, dict(entries), now_ms, latencies)


def _report(job: asyncio.Future[None]) -> None:
    """A review that failed is logged (the next one starts as usual)."""
    if not job.cancelled() and job.exception() is not None:
        log.error("admission review failed", exc_info=job.exception())
