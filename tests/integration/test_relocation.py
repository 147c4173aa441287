"""A relocate command through ZoneExecutor + SimFleetBackend lands in the Redis
relocate list, the live fleet's drain applies it and reports the outcome, and
the executor relays the outcome to the results topic (none lost when the
broker is down or the executor dies mid-publish)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaConnectionError
from governor_telemetry.producer import TelemetryProducer

from controllers.window_record import decode_window
from core import names
from core.clock import ScaledClock
from core.settings import Settings
from executors.backends import SimFleetBackend
from executors.executor import ZoneExecutor
from launch.processes import EXECUTOR_READY, WORKER_READY, start_executor, start_worker
from launch.topics import ensure_topics
from loop.commands import Command
from loop.kv_policy_driver import KvPolicyDriver
from sim.fleet import Fleet, FleetConfig
from sim.live import LiveFleet
from sim.workloads import Workload
from tests.integration.harness import guard, signed
from tests.unit.test_fleet import BLOCK_B, PM, M, fragmented

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _relocate(node: str, gen: int, basis_ms: int = 5_000) -> Command:
    now = int(time.time() * 1000)
    return Command(
        kind="relocate",
        zone="az-a",
        model=M,
        reason="test",
        issued_at_ms=now,
        expires_at_ms=now + 60_000,
        basis_ms=basis_ms,
        controller="kv_policy",
        payload={"node": node, "max_bytes": 10**12, "expected_generation": gen, "action": "compact"},
    )


async def test_relocate_command_reaches_the_fleet_through_redis(settings: Settings) -> None:
    prefix = settings.topic_prefix
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    ex = ZoneExecutor(
        zone="az-a",
        prefix=prefix,
        redis=redis,
        backend=SimFleetBackend(redis, prefix, "az-a"),
        guard=guard(settings, M),
        clock=ScaledClock(),
        results=None,
        results_topic="x",
        block_ms=50,
        probe_interval_s=0,
    )
    fleet, g = fragmented(kv_copy_bandwidth_bytes_s=1e8)
    try:
        await ex.ensure_group()
        cmd = _relocate(g["node"], g["kv_generation"])
        other = _relocate("az-a/x/r9", 0, basis_ms=4_000)  # another node, older window: not stale
        for c in (cmd, cmd, other):
            await redis.xadd(names.command_stream(prefix, "az-a"), {"cmd": signed(settings, c)})
        assert await ex.poll_once() == 3
        assert ex.stats.outcomes == {"applied": 2, "duplicate": 1}
        queued = [orjson.loads(x) for x in await redis.lrange(names.relocate_queue(prefix, "az-a"), 0, -1)]
        assert [(q["node"], q["command_id"]) for q in queued] == [
            (g["node"], cmd.command_id),
            ("az-a/x/r9", other.command_id),
        ]
        assert queued[0]["expected_generation"] == g["kv_generation"] and queued[0]["action"] == "compact"

        live = LiveFleet(
            fleet,
            SimpleNamespace(arrival_s=[]),
            model=M,
            zones=["az-a"],
            producer=None,  # type: ignore[arg-type]
            redis=redis,
            prefix=prefix,
            now_ms=lambda: 0,
            t0_ms=0,
        )
        await live._sync_relocations(3.5)
        assert await redis.llen(names.relocate_queue(prefix, "az-a")) == 0  # drained
        outs = [orjson.loads(x) for x in await redis.lrange(names.relocated_outcomes(prefix, "az-a"), 0, -1)]
        assert outs[0]["command_id"] == cmd.command_id and outs[0]["bytes_moved"] == 2 * BLOCK_B
        assert outs[1]["refused"].startswith("unknown node")
        assert live.stats.relocations == outs
    finally:
        await redis.aclose()


def test_kv_policy_driver_command_round_trips_through_the_executor_codec() -> None:
    w = {
        "scope": "node",
        "model": M,
        "zone": "az-a",
        "node": "az-a/n0",
        "window_end_ms": 1_000,
        "replicas_ready": 1,  # absent decodes as 0: a node not serving, which never relocates
        "largest_free_block_bytes": 1,
        "kv_free_bytes": 100,
        "kv_waiting_bytes": 10,
        "fragmentation_ratio": 0.99,
        "kv_generation": 3,
    }
    (cmd,) = KvPolicyDriver().on_window(decode_window(w), 0)
    assert Command.decode(cmd.with_hlc(5 << 16).encode()).command_id == cmd.command_id


class _Results:
    """Stands in for the results producer: the first ``fail`` sends find the broker down;
    ``die`` makes the next send kill the executor (a crash between LMOVE and the ack)."""

    def __init__(self, fail: int = 0, die: bool = False) -> None:
        self.sent: list[dict[str, Any]] = []
        self.fail, self.die, self.attempts = fail, die, 0

    async def send_and_wait(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.attempts += 1
        if self.die:
            self.die = False
            raise asyncio.CancelledError  # the process goes away mid-publish
        if self.fail:
            self.fail -= 1
            raise KafkaConnectionError("broker down")
        self.sent.append(orjson.loads(value))


async def _fleet_with_outcomes(settings: Settings, redis: aioredis.Redis, prefix: str) -> tuple[list[Command], dict]:
    """Two relocate commands applied by an executor and the live fleet: one compacts, one is refused."""
    fleet, g = fragmented(kv_copy_bandwidth_bytes_s=1e8)
    ex = ZoneExecutor(
        zone="az-a",
        prefix=prefix,
        redis=redis,
        backend=SimFleetBackend(redis, prefix, "az-a"),
        guard=guard(settings, M),
        clock=ScaledClock(),
        results=None,
        results_topic="x",
        block_ms=50,
        probe_interval_s=0,
    )
    await ex.ensure_group()
    cmds = [_relocate(g["node"], g["kv_generation"]), _relocate("az-a/x/r9", 0, basis_ms=4_000)]
    for c in cmds:
        await redis.xadd(names.command_stream(prefix, "az-a"), {"cmd": signed(settings, c)})
    assert await ex.poll_once() == 2
    live = LiveFleet(
        fleet,
        SimpleNamespace(arrival_s=[]),
        model=M,
        zones=["az-a"],
        producer=None,  # type: ignore[arg-type]
        redis=redis,
        prefix=prefix,
        now_ms=lambda: 0,
        t0_ms=0,
    )
    await live._sync_relocations(3.5)
    return cmds, g


def _relaying_executor(settings: Settings, redis: aioredis.Redis, prefix: str, results: _Results) -> ZoneExecutor:
    return ZoneExecutor(
        zone="az-a",
        prefix=prefix,
        redis=redis,
        backend=SimFleetBackend(redis, prefix, "az-a"),
        guard=guard(settings, M),
        clock=ScaledClock(),
        results=results,
        results_topic="r",  # type: ignore[arg-type]
        block_ms=50,
        probe_interval_s=0,
    )


async def test_outcomes_reach_the_results_topic_through_a_broker_outage(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = settings.topic_prefix
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def fake_sleep(s: float) -> None:  # the backoff, without the wall time
        waits.append(s)
        await real_sleep(0)

    monkeypatch.setattr("executors.executor.asyncio.sleep", fake_sleep)
    try:
        (cmd, other), g = await _fleet_with_outcomes(settings, redis, prefix)
        results = _Results(fail=3)
        ex = _relaying_executor(settings, redis, prefix, results)
        assert ex.relay is not None and await ex.relay.pump() == 2
        assert waits == [0.1, 0.2, 0.4] and results.attempts == 5  # backed off, nothing dropped
        done, refused = results.sent
        assert done["record"] == done["kind"] == "relocation_outcome"
        assert (done["command_id"], done["node"], done["zone"], done["action"]) == (
            cmd.command_id,
            g["node"],
            "az-a",
            "compact",
        )
        assert done["outcome"] == "relocation_applied" and done["applied"] and done["reason"] == ""
        assert done["bytes_moved"] == 2 * BLOCK_B and done["pause_steps"] >= 1 and done["t_s"] == 3.5
        assert done["fragmentation_before"] == pytest.approx(g["fragmentation_ratio"])
        assert done["fragmentation_after"] == 0.0 < done["fragmentation_before"]
        assert refused["command_id"] == other.command_id and not refused["applied"]
        assert refused["outcome"] == "relocation_refused" and refused["reason"].startswith("unknown node")
        assert refused["bytes_moved"] is None
        assert await redis.llen(names.relocated_outcomes(prefix, "az-a")) == 0
        assert await redis.llen(names.relocation_inflight(prefix, "az-a")) == 0
        assert await ex.relay.pump() == 0  # nothing twice
    finally:
        await redis.aclose()


async def test_an_outcome_in_flight_when_the_executor_dies_is_published_by_the_next(settings: Settings) -> None:
    prefix = settings.topic_prefix
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    try:
        (cmd, other), _ = await _fleet_with_outcomes(settings, redis, prefix)
        dying = _relaying_executor(settings, redis, prefix, _Results(die=True))
        assert dying.relay is not None
        with pytest.raises(asyncio.CancelledError):
            await dying.relay.pump()
        assert await redis.llen(names.relocation_inflight(prefix, "az-a")) == 1  # moved, never acknowledged
        assert await redis.llen(names.relocated_outcomes(prefix, "az-a")) == 1
        results = _Results()
        nxt = _relaying_executor(settings, redis, prefix, results)
        assert nxt.relay is not None and await nxt.relay.pump() == 2
        assert [r["command_id"] for r in results.sent] == [cmd.command_id, other.command_id]
        assert await redis.llen(names.relocation_inflight(prefix, "az-a")) == 0
        # An executor without a results producer (a test, a dry run) leaves the list alone.
        assert _relaying_executor(settings, redis, prefix, None).relay is None  # type: ignore[arg-type]
    finally:
        await redis.aclose()


# -- end to end: fragmented fleet -> telemetry -> worker -> relocate -> executor -> fleet -> results --


def _fragmenting_workload() -> Workload:
    """On one replica with 20 KV blocks: ten 2-block requests placed in order, the odd ones short.

    They end at ~0.75 s and leave five 2-block holes between long decodes (~32 s); a
    4-block request waits behind them (free 10 blocks, largest 2: fragmentation 0.8),
    which only compaction can place before the long ones end.
    """
    placed = [(0.02 * i, 24, 1000) if i % 2 == 0 else (0.02 * i, 1014, 10) for i in range(10)]
    rows = np.array([*placed, (0.5, 1024, 1024)])  # (arrival_s, prompt, output); the last one waits
    return Workload(
        arrival_s=rows[:, 0],
        prompt_tokens=rows[:, 1].astype(int),
        output_tokens=rows[:, 2].astype(int),
        hash_ids=None,
        name="fragmenting",
    )


class _Seen(Exception):
    """Stops the live fleet once the outcome is on the results topic."""


async def _watch(settings: Settings, found: asyncio.Event, seen: dict[str, list[dict[str, Any]]]) -> None:
    consumer = AIOKafkaConsumer(
        settings.topic("commands"),
        settings.topic("results"),
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
    )
    await consumer.start()
    try:
        while not found.is_set():
            for tp, msgs in (await consumer.getmany(timeout_ms=200)).items():
                seen[tp.topic.rsplit(".", 1)[1]] += [orjson.loads(m.value) for m in msgs]
            if any(
                r.get("record") == "relocation_outcome" and r["applied"] and r["bytes_moved"] for r in seen["results"]
            ):
                found.set()
    finally:
        await consumer.stop()


@pytest.mark.timeout(120)
async def test_fragmented_fleet_is_compacted_through_the_loop_and_the_outcome_is_published(
    servers: Settings, tmp_path: Path
) -> None:
    settings = servers.replace(
        topic_prefix=f"t{uuid.uuid4().hex[:10]}",
        data_dir=str(tmp_path / "state"),
        window_s=1.0,
        lateness_s=0.5,
        partitions=1,
        clock_origin_s=time.time(),
        zones=("az-a",),
        command_ttl_s=30.0,
    )
    await ensure_topics(settings)
    children = [start_worker(settings, tmp_path), start_executor(settings, "az-a", tmp_path)]
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    seen: dict[str, list[dict[str, Any]]] = {"commands": [], "results": []}
    found = asyncio.Event()
    try:
        children[0].wait_for_log(WORKER_READY, 60)
        children[1].wait_for_log(EXECUTOR_READY, 30)
        clock = ScaledClock(settings.clock_speed, settings.clock_origin_s)
        t0 = clock.now_ms()
        fleet = Fleet(
            FleetConfig(
                models={M: PM},
                initial_replicas=1,
                jitter=False,
                context_aware_decode=False,
                kv_allocator="contiguous",
                kv_capacity_tokens=20 * 512,
            ),
            epoch_ms0=t0,
        )
        watcher = asyncio.create_task(_watch(settings, found, seen))

        async def stop_when_seen(t: float) -> None:
            if found.is_set() or watcher.done():
                raise _Seen

        async with TelemetryProducer(
            settings.kafka_bootstrap, settings.topic("telemetry"), source="test", linger_ms=20
        ) as producer:
            live = LiveFleet(
                fleet,
                _fragmenting_workload(),
                model=M,
                zones=["az-a"],
                producer=producer,
                redis=redis,
                prefix=settings.topic_prefix,
                now_ms=clock.now_ms,
                t0_ms=t0,
            )
            with pytest.raises(_Seen):
                await live.run(30.0, on_tick=stop_when_seen)  # the long requests end at ~32 s
        await watcher  # re-raises a consumer failure
    finally:
        found.set()
        await redis.aclose()
        for c in children:
            c.stop()
        for c in children:
            print(f"--- {c.name}\n{c.tail(15)}")
    node = f"az-a/{M}/r0"
    outcome = next(r for r in seen["results"] if r.get("record") == "relocation_outcome" and r["bytes_moved"])
    relocates = {c["command_id"]: c for c in seen["commands"] if c["kind"] == "relocate"}
    cmd = relocates[outcome["command_id"]]  # the worker's decision, through the bridge and the executor
    assert cmd["payload"]["node"] == node and cmd["payload"]["action"] == "compact"
    queued = [r for r in seen["results"] if r.get("command_id") == cmd["command_id"] and "record" not in r]
    assert [(r["outcome"], r["detail"]["queued"]) for r in queued] == [("applied", True)]
    assert outcome["applied"] and outcome["node"] == node and outcome["zone"] == "az-a"
    assert outcome["fragmentation_before"] == pytest.approx(0.8) and outcome["fragmentation_after"] < 0.08
    assert outcome["bytes_moved"] % BLOCK_B == 0 and outcome["pause_steps"] >= 1
    relayed = [r["command_id"] for r in seen["results"] if r.get("record") == "relocation_outcome"]
    assert len(relayed) == len(set(relayed))  # no outage here: each outcome published once
    applied = [r for r in live.stats.relocations if r.get("command_id") == cmd["command_id"]]
    assert applied and applied[0]["bytes_moved"] == outcome["bytes_moved"]
    # The waiting 4-block request was placed long before the long decodes ended; nothing lost.
    fleet.advance_to(fleet.now + 1.0)
    assert fleet.queued("az-a", M) == 0 and fleet.now < 30.0 and fleet.stats()["conserved"]
