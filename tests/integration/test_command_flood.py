"""A flood of unsigned entries does not expire a real command (issue 31, item 6).

On the real Redis and the real embedded broker: 12,000 unsigned entries are
XADDed to a zone's command stream (as anyone with XADD can), then one real
signed command with the default TTL.  The executor's loop
(:meth:`ZoneExecutor.run`, a real Kafka producer) must refuse the junk in bulk
-- one summary record per batch on the results topic, every entry counted on
``governor_executor_entries_refused_total`` -- and apply the real command.
Before, it answered each junk entry with its own result and a Kafka round
trip, and the real command behind them came back ``expired``.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from core import names
from core.settings import Settings
from executors.backends import DryRunBackend
from tests.integration.harness import signed
from tests.integration.test_executor import _cmd, _executor, _results

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ZONE, MODEL = "az-a", "m"
JUNK = 12_000


async def test_a_real_command_behind_12000_unsigned_entries_is_applied(settings: Settings) -> None:
    ttl_ms = int(settings.command_ttl_s * 1000)
    assert settings.command_ttl_s == Settings().command_ttl_s  # the default TTL (60 s)
    backend = DryRunBackend()
    ex, producer, redis = await _executor(settings, backend)  # the real broker's producer, the real Redis
    ex.probe_interval_s = 0  # no timing records on the results topic
    prefix = settings.topic_prefix
    stream = names.command_stream(prefix, ZONE)
    task: asyncio.Task[None] | None = None
    try:
        # The flood: unsigned commands that look real (a scale to 16), as an attacker writes them.
        t0 = time.perf_counter()
        for start in range(0, JUNK, 1_000):
            async with redis.pipeline(transaction=False) as pipe:
                for i in range(start, start + 1_000):
                    pipe.xadd(stream, {"cmd": _cmd(16, basis_ms=i + 1, ttl_ms=ttl_ms).encode()})
                await pipe.execute()
        written_s = time.perf_counter() - t0
        real = _cmd(7, basis_ms=int(time.time() * 1000), ttl_ms=ttl_ms)
        await redis.xadd(stream, {"cmd": signed(settings, real)})
        t1 = time.perf_counter()
        task = asyncio.create_task(ex.run())
        results = await _results(settings, 10 * JUNK, timeout_s=150, until_id=real.command_id)
        cleared_s = time.perf_counter() - t1
        print(f"flood: {JUNK} junk entries written in {written_s:.2f} s, real command handled after {cleared_s:.2f} s")
        mine = [r for r in results if r.get("command_id") == real.command_id]
        assert [r["outcome"] for r in mine] == ["applied"], mine[:1] or f"no result in {len(results)}"
        assert [(c.command_id, c.target_replicas) for c in backend.applied] == [(real.command_id, 7)]
        # Refused in bulk: summaries, not one result each, and every entry counted and acknowledged.
        summaries = [r for r in results if r.get("record") == "refused_batch"]
        assert sum(r["count"] for r in summaries) == JUNK
        assert len(results) == len(summaries) + 1 <= JUNK // 100 + 5
        assert {k for r in summaries for k in r["detail"]["reasons"]} == {"unsigned command"}
        refused = ex.metrics.registry.get_sample_value(
            "governor_executor_entries_refused_total", {"zone": ZONE, "reason": "unsigned command"}
        )
        assert refused == JUNK and ex.stats.outcomes == {"refused_in_bulk": JUNK, "applied": 1}
        assert (await redis.xpending(stream, "executors"))["pending"] == 0
    finally:
        ex.stop()
        if task is not None:
            await asyncio.wait_for(task, 10)
        await producer.stop()
        await redis.aclose()
