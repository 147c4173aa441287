"""Zone-aware routing on the real path: both zones report, then az-b goes dark ->
the worker (a real process) marks az-b lost -> a ``route`` command per zone ->
the zone executors write ``<prefix>:routing:<zone>`` with no weight on az-b, both at the
``apply_at_ms`` the worker planned from az-a's measured lead;
the ``zone_lost`` event is on the events topic."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from governor_telemetry.producer import TelemetryProducer

from core import names
from core.settings import Settings
from tests.integration.harness import field_in_every_zone, worker_and_executors

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "llama2-70b"


def _records(i: int, now: int, zone: str) -> list[dict]:
    req = {
        "kind": "request",
        "request_id": f"{zone}-{i}",
        "ts_ms": now,
        "model": MODEL,
        "zone": zone,
        "node": f"{zone}/n1",
        "ttft_ms": 200.0,
        "itl_ms": 30.0,
        "e2e_ms": 3200.0,
        "prompt_tokens": 1000,
        "output_tokens": 100,
        "status": "ok",
    }
    gpu = {
        "kind": "gpu",
        "ts_ms": now,
        "model": MODEL,
        "zone": zone,
        "node": f"{zone}/n1",
        "state": "ready",
        "gpu_util": 0.5,
        "mem_used_bytes": 60,
        "mem_total_bytes": 80,
        "queue_len": 0,
        "running": 4,
    }
    return [req, gpu]


async def _zone_events(settings: Settings, timeout_s: float) -> list[dict]:
    consumer = AIOKafkaConsumer(
        settings.topic("events"),
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    out: list[dict] = []
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not any(e.get("kind") == "zone_lost" for e in out):
            batch = await consumer.getmany(timeout_ms=500)
            out += [orjson.loads(m.value) for msgs in batch.values() for m in msgs]
    finally:
        await consumer.stop()
    return out


async def test_a_dark_zone_is_routed_around_by_every_zones_gateway(settings: Settings, tmp_path: Path) -> None:
    settings = settings.replace(zones=("az-a", "az-b"), command_ttl_s=60.0)
    async with worker_and_executors(settings, tmp_path) as (worker, redis, executors):
        # az-a's executor beats with its measured lead (executors/timing.py); az-b's never does (lost).
        timing = {"lead_ms": 123.0, "offset_error_ms": 0.5, "age_ms": 10.0}
        beat = {"ts_ms": int(time.time() * 1000), "executor": "test", "timing": timing}
        await redis.set(names.executor_heartbeat(settings.topic_prefix, "az-a"), orjson.dumps(beat), ex=60)
        async with TelemetryProducer(
            settings.kafka_bootstrap, settings.topic("telemetry"), source="test", linger_ms=20
        ) as producer:
            # 5 s with demand in both zones (4 requests/s each), then az-b goes dark for 6 s.
            for step in range(55):
                now = int(time.time() * 1000)
                for zone in ("az-a", "az-b") if step < 25 else ("az-a",):
                    for rec in _records(step, now, zone):
                        await producer.send(rec)
                await asyncio.sleep(0.2)
        found = await field_in_every_zone(redis, executors, lambda z: names.routing_hash(settings.topic_prefix, z), "*")
        weights = {zone: v["weights"] for zone, v in found.items()}
        assert set(weights) == {"az-a", "az-b"}, (weights, worker.tail())
        for zone, ws in weights.items():
            assert ws.get(f"{MODEL}|az-a") == pytest.approx(1.0), (zone, ws)
            assert ws.get(f"{MODEL}|az-b", 0.0) == 0.0, (zone, ws)
        events = await _zone_events(settings, 20)
        lost = [e for e in events if e.get("kind") == "zone_lost"]
        assert lost and lost[0]["zone"] == "az-b" and lost[0]["model"] == MODEL, events
        # The reroute went to both zones at one time: apply_at_ms from az-a's measured lead + the 50 ms margin
        # (az-b's executor is gone: left out), on Redis's clock as the worker measured it against Redis TIME.
        for zone in ("az-a", "az-b"):
            entries = await redis.xrange(names.command_stream(settings.topic_prefix, zone))
            routes = [c for c in (orjson.loads(f[b"cmd"]) for _, f in entries) if c["kind"] == "route"]
            assert routes, zone
            for c in routes:
                assert c["detail"]["apply_basis"] == "measured" and c["detail"]["apply_lead_ms"] == 173.0, c
                assert 0 < c["detail"]["apply_at_ms"] - c["issued_at_ms"] <= 173.0 + 50, c
        assert "Traceback" not in worker.log_text()


async def test_a_silent_zone_whose_executor_still_beats_is_held_not_lost(settings: Settings, tmp_path: Path) -> None:
    """az-b's telemetry stops but its executor's heartbeat stays: no zone_lost, a telemetry_stale
    event instead; once the heartbeat goes too, az-b is lost."""
    settings = settings.replace(zones=("az-a", "az-b"), command_ttl_s=60.0)
    beat = names.executor_heartbeat(settings.topic_prefix, "az-b")
    async with worker_and_executors(settings, tmp_path) as (worker, redis, _executors):
        await redis.set(beat, orjson.dumps({"ts_ms": int(time.time() * 1000), "executor": "test"}), ex=30)
        async with TelemetryProducer(
            settings.kafka_bootstrap, settings.topic("telemetry"), source="test", linger_ms=20
        ) as producer:
            for step in range(60):  # 5 s in both zones, then az-b silent for 7 s (7 windows of 1 s)
                now = int(time.time() * 1000)
                for zone in ("az-a", "az-b") if step < 25 else ("az-a",):
                    for rec in _records(step, now, zone):
                        await producer.send(rec)
                await asyncio.sleep(0.2)
            events = await _zone_events(settings, 3)
            assert not [e for e in events if e.get("kind") == "zone_lost"], events
            stale = [e for e in events if e.get("kind") == "telemetry_stale"]
            assert stale and stale[0]["zone"] == "az-b" and stale[0]["reason"] == "no_window", events
            await redis.delete(beat)  # the executor is gone as well: now the zone is lost
            for step in range(60, 90):
                now = int(time.time() * 1000)
                for rec in _records(step, now, "az-a"):
                    await producer.send(rec)
                await asyncio.sleep(0.2)
        events = await _zone_events(settings, 20)
        lost = [e for e in events if e.get("kind") == "zone_lost"]
        assert lost and lost[0]["zone"] == "az-b", events
        assert "Traceback" not in worker.log_text()
