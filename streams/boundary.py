"""The agents' boundary: nothing a message holds stops an agent, and a crash is seen.

Each Faust agent (:mod:`streams.agents`) handles a message inside one ``try``:
whatever the pure work on it raises (decoding, validating, windowing,
deciding, encoding what goes out) becomes one dead letter -- the reason with
the exception, the message's topic, partition and offset, and its raw bytes
clipped (:func:`loop.deadletters.dead_letter`) -- and the agent takes the
next message.  Sends to Kafka and writes to Redis stay outside that ``try``:
a broker or Redis that is down is a temporary failure, retried, never a dead
letter.

Should an agent's body raise all the same (Faust then restarts the agent,
about 5 s later), :class:`AgentWatch` counts it in
``governor_agent_crashes_total{agent}`` and fails the readiness check
``agent <name>`` (``/readyz`` answers 503, :mod:`streams.health`) until that
agent runs again (Faust restarts it: its body is entered again).

>>> from streams.health import Readiness
>>> from streams.metrics_export import WorkerMetrics
>>> ready, metrics = Readiness(()), WorkerMetrics()
>>> watch = AgentWatch(metrics, ready, ("ingest",))
>>> try:
...     with watch.body("ingest"):
...         raise KeyError("x")
... except KeyError:
...     pass
>>> ready.state(), metrics.registry.get_sample_value("governor_agent_crashes_total", {"agent": "ingest"})
((False, "agent ingest: crashed: KeyError: 'x'"), 1.0)
>>> watch.running("ingest"); ready.state()
(True, '')
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from loop.deadletters import dead_letter
from streams.health import Readiness
from streams.metrics_export import WorkerMetrics

__all__ = ["AgentWatch", "unprocessable"]

log = logging.getLogger(__name__)

#: The most bytes of a message kept (as text) in the dead letter of one that raised.
RAW_BYTES = 4096


def unprocessable(prefix: str, exc: BaseException, source: Mapping[str, Any], raw: Any, now_ms: int) -> dict[str, Any]:
    """The dead letter of a message whose handling raised ``exc`` (never raises).

    ``prefix`` is the message's dead-letter kind (``bad envelope`` for telemetry,
    ``bad metrics record``, ``bad command``); ``raw`` is kept clipped, as text.
    """
    try:
        what = f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - an exception whose str raises: its type then
        what = type(exc).__name__
    if isinstance(raw, bytes | bytearray | memoryview):
        raw = bytes(raw[:RAW_BYTES]).decode("utf-8", "replace")
    return dead_letter(f"{prefix}: handling raised {what}", source, raw, now_ms)


class AgentWatch:
    """Crash accounting for the agents (see the module docstring); ``readiness`` None: the metric only."""

    def __init__(self, metrics: WorkerMetrics, readiness: Readiness | None, agents: Iterable[str]) -> None:
        self.metrics = metrics
        self.readiness = readiness
        self.crashed: set[str] = set()
        for agent in agents:  # each series exists from the start, at 0
            metrics.agent_crashes.labels(agent)

    def running(self, agent: str) -> None:
        """``agent`` runs (restarted, or took a message): its readiness check holds again."""
        if agent in self.crashed:
            self.crashed.discard(agent)
            if self.readiness is not None:
                self.readiness.ok(f"agent {agent}")
            log.info("agent %s runs again", agent)

    @contextmanager
    def body(self, agent: str) -> Iterator[None]:
        """Around an agent's body: an exception out of it is counted and fails readiness, then re-raised."""
        self.running(agent)
        try:
            yield
        except Exception as exc:  # not CancelledError (a BaseException): a stop or a rebalance is no crash
            self.metrics.agent_crashes.labels(agent).inc()
            self.crashed.add(agent)
            if self.readiness is not None:
                self.readiness.fail(f"agent {agent}", f"crashed: {type(exc).__name__}: {exc}")
            log.exception("agent %s crashed (Faust restarts it)", agent)
            raise

    def agent(self, name: str) -> Callable[[Callable[[Any], Awaitable[None]]], Callable[[Any], Awaitable[None]]]:
        """A decorator for an agent's function (under ``@app.agent``): its body inside :meth:`body`.

        Faust calls the function again when it restarts the agent: the agent then runs again.
        """

        def wrap(fun: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
            @functools.wraps(fun)
            async def run(stream: Any) -> None:
                with self.body(name):
                    await fun(stream)

            return run

        return wrap
