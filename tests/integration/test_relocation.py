"""A relocate command through ZoneExecutor + SimFleetBackend lands in the Redis
relocate list, and the live fleet's drain applies it and reports the outcome."""
from __future__ import annotations

import time
from types import SimpleNamespace

import orjson
import pytest
import redis.asyncio as aioredis

from executors.backends import SimFleetBackend, relocate_key
from executors.executor import ZoneExecutor
from governor.clock import ScaledClock
from governor.settings import Settings
from sim.live import LiveFleet, relocated_key
from streams.commands import Command, stream_key
from streams.memory import KvRelocator
from tests.unit.test_fleet import BLOCK_B, M, fragmented

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _relocate(node: str, gen: int, basis_ms: int = 5_000) -> Command:
    now = int(time.time() * 1000)
    return Command(kind="relocate", zone="az-a", model=M, target_replicas=0, reason="test",
                   issued_at_ms=now, expires_at_ms=now + 60_000, basis_ms=basis_ms, controller="kv_policy",
                   payload={"node": node, "max_bytes": 10**12, "expected_generation": gen, "action": "compact"})


async def test_relocate_command_reaches_the_fleet_through_redis(settings: Settings) -> None:
    prefix = settings.topic_prefix
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    ex = ZoneExecutor(zone="az-a", prefix=prefix, redis=redis, backend=SimFleetBackend(redis, prefix, "az-a"),
                      clock=ScaledClock(), results=None, results_topic="x", block_ms=50, probe_interval_s=0)
    fleet, g = fragmented(kv_copy_bandwidth_bytes_s=1e8)
    try:
        await ex.ensure_group()
        cmd = _relocate(g["node"], g["kv_generation"])
        other = _relocate("az-a/x/r9", 0, basis_ms=4_000)  # another node, older window: not stale
        for c in (cmd, cmd, other):
            await redis.xadd(stream_key(prefix, "az-a"), {"cmd": c.encode()})
        assert await ex.poll_once() == 3
        assert ex.stats.outcomes == {"applied": 2, "duplicate": 1}
        queued = [orjson.loads(x) for x in await redis.lrange(relocate_key(prefix, "az-a"), 0, -1)]
        assert [(q["node"], q["command_id"]) for q in queued] == [(g["node"], cmd.command_id),
                                                                  ("az-a/x/r9", other.command_id)]
        assert queued[0]["expected_generation"] == g["kv_generation"] and queued[0]["action"] == "compact"

        live = LiveFleet(fleet, SimpleNamespace(arrival_s=[]), model=M, zones=["az-a"], producer=None,  # type: ignore[arg-type]
                         redis=redis, prefix=prefix, now_ms=lambda: 0, t0_ms=0)
        await live._sync_relocations(3.5)
        assert await redis.llen(relocate_key(prefix, "az-a")) == 0  # drained
        outs = [orjson.loads(x) for x in await redis.lrange(relocated_key(prefix, "az-a"), 0, -1)]
        assert outs[0]["command_id"] == cmd.command_id and outs[0]["bytes_moved"] == 2 * BLOCK_B
        assert outs[1]["refused"].startswith("unknown node")
        assert live.stats.relocations == outs
    finally:
        await redis.aclose()


def test_relocator_command_round_trips_through_the_executor_codec() -> None:
    w = {"scope": "node", "model": M, "zone": "az-a", "node": "az-a/n0", "window_end_ms": 1_000,
         "largest_free_block_bytes": 1, "kv_free_bytes": 100, "kv_waiting_bytes": 10,
         "fragmentation_ratio": 0.99, "kv_generation": 3}
    cmd = KvRelocator().on_node_window(w, 0)
    assert cmd is not None and Command.decode(cmd.with_hlc(5 << 16).encode()).command_id == cmd.command_id
