"""An agent crash is counted and seen by /readyz on the real HTTP health server (issue #31, item 1).

``governor_agent_crashes_total{agent}`` rises when an agent's body raises, and
``/readyz`` answers 503 naming the agent from the crash until Faust runs the
agent again (it calls the agent's function anew); other agents' crashes are
their own checks.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from launch.embedded import free_port
from streams.boundary import AgentWatch, unprocessable
from streams.health import Readiness
from streams.metrics_export import WorkerMetrics
from tests.integration.test_probes import _get

pytestmark = pytest.mark.timeout(30)


def _crashes(port: int, agent: str) -> float:
    for line in _get(port, "/metrics")[1].decode().splitlines():
        if line.startswith(f'governor_agent_crashes_total{{agent="{agent}"}}'):
            return float(line.split()[-1])
    raise AssertionError(f"no crash series for {agent}")


async def _call(agent: Any) -> None:
    await agent(None)


def test_an_agent_crash_fails_readyz_until_the_agent_runs_again() -> None:
    metrics, readiness = WorkerMetrics(), Readiness(("kafka", "agents", "redis"))
    for check in ("kafka", "agents", "redis"):
        readiness.ok(check)
    watch = AgentWatch(metrics, readiness, ("ingest", "control", "bridge"))
    server = metrics.serve(free_port(), "127.0.0.1", readiness)
    assert server is not None
    crash = [True]

    @watch.agent("ingest")
    async def ingest(stream: Any) -> None:  # as Faust calls an agent's function: anew at each (re)start
        if crash[0]:
            raise RuntimeError("boom")

    try:
        assert _get(server.port, "/readyz")[0] == 200
        assert [_crashes(server.port, a) for a in ("ingest", "control", "bridge")] == [0.0, 0.0, 0.0]
        with pytest.raises(RuntimeError):
            asyncio.run(_call(ingest))
        status, body = _get(server.port, "/readyz")
        assert status == 503 and orjson.loads(body)["reason"] == "agent ingest: crashed: RuntimeError: boom"
        assert _crashes(server.port, "ingest") == 1.0 and _crashes(server.port, "control") == 0.0
        crash[0] = False
        asyncio.run(_call(ingest))  # Faust restarted it: it runs again
        assert _get(server.port, "/readyz")[0] == 200
        assert _crashes(server.port, "ingest") == 1.0  # a counter: the crash stays counted
    finally:
        server.close()


def test_a_cancelled_agent_did_not_crash() -> None:
    """A stop or a rebalance cancels the agent: no crash, readiness untouched."""
    metrics, readiness = WorkerMetrics(), Readiness(())
    watch = AgentWatch(metrics, readiness, ("control",))

    @watch.agent("control")
    async def control(stream: Any) -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(_call(control))
    assert readiness.state() == (True, "")
    assert metrics.registry.get_sample_value("governor_agent_crashes_total", {"agent": "control"}) == 0.0


def test_the_dead_letter_of_a_message_that_raised_is_bounded_and_names_the_exception() -> None:
    class Hostile(Exception):
        def __str__(self) -> str:
            raise ValueError("no text")

    src = {"topic": "t", "partition": 3, "offset": 9}
    dl = unprocessable("bad envelope", Hostile(), src, b"\xff" * 100_000, 5)
    assert dl["kind"] == "bad envelope" and dl["reason"] == "bad envelope: handling raised Hostile"
    assert dl["source"] == src and len(dl["record"]) <= 4096 and len(orjson.dumps(dl)) < 16_384
    dl = unprocessable("bad command", KeyError("x" * 10_000), src, "text", 5)
    assert dl["kind"] == "bad command" and dl["reason"].startswith("bad command: handling raised KeyError: 'xxx")
