"""The resilient poll loop of a zone executor: nothing but ``stop`` ends it.

:func:`run_until_stopped` calls one step (poll the stream, relay outcomes)
again and again until ``stopping`` is set.  Any error is logged, one line
per attempt, and retried after a capped backoff (0.1 s doubling to 5 s,
back to 0.1 s after a step that worked): Redis connection loss, a restart
with or without its data, a ``LOADING`` Redis, a refused command.
``NOGROUP`` (the stream or its consumer group gone: a Redis restart without
data, a ``FLUSHALL``, a ``DEL`` of the stream) calls ``recreate`` (the
executor's ``XGROUP CREATE ... MKSTREAM``) and goes on at once.
:func:`retry_until_ok` does the same for a start-up step (creating the
group while Redis is not up yet).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)

#: Redis trouble that is retried without a traceback.
TRANSPORT = (RedisConnectionError, RedisTimeoutError, OSError)
MIN_DELAY_S, MAX_DELAY_S = 0.1, 5.0


def is_nogroup(exc: BaseException) -> bool:
    """Whether ``exc`` says the stream or its consumer group does not exist."""
    return isinstance(exc, ResponseError) and "NOGROUP" in str(exc)


async def sleep_or_stop(stopping: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less if ``stopping`` is set meanwhile."""
    try:
        await asyncio.wait_for(stopping.wait(), timeout=seconds)
    except TimeoutError:
        pass


def _describe(exc: BaseException) -> str:
    return "redis unavailable" if isinstance(exc, TRANSPORT) else f"{type(exc).__name__}"


async def retry_until_ok(step: Callable[[], Awaitable[None]], what: str, stopping: asyncio.Event) -> bool:
    """Run ``step`` until it works (True) or ``stopping`` is set (False), backing off in between."""
    delay = MIN_DELAY_S
    while not stopping.is_set():
        try:
            await step()
            return True
        except Exception as exc:  # noqa: BLE001 - wait for the server
            log.warning("%s failed (%s: %s); retry in %.1f s", what, _describe(exc), exc, delay)
            await sleep_or_stop(stopping, delay)
            delay = min(MAX_DELAY_S, delay * 2)
    return False


async def run_until_stopped(
    step: Callable[[], Awaitable[object]],
    what: str,
    stopping: asyncio.Event,
    recreate: Callable[[], Awaitable[None]],
) -> None:
    """``step`` until ``stopping`` is set; errors backed off, NOGROUP re-created (module docstring)."""
    delay = MIN_DELAY_S
    while not stopping.is_set():
        try:
            await step()
            delay = MIN_DELAY_S
            continue
        except Exception as exc:  # noqa: BLE001 - nothing ends the loop but stop
            if is_nogroup(exc):
                log.warning("%s: consumer group gone (%s); re-creating it", what, exc)
                try:
                    await recreate()
                    continue
                except Exception as again:  # noqa: BLE001 - backed off below
                    exc = again  # noqa: PLW2901
            if isinstance(exc, (*TRANSPORT, ResponseError)):
                log.warning("%s: %s (%s); retry in %.1f s", what, _describe(exc), exc, delay)
            else:
                log.exception("%s: step failed (%s); retry in %.1f s", what, exc, delay)
        await sleep_or_stop(stopping, delay)
        delay = min(MAX_DELAY_S, delay * 2)
