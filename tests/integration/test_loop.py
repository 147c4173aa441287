"""The stream worker and a zone executor as real processes on the real broker
and Redis: telemetry in, windows, a scale-up command applied once, dead
letters with reasons."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from governor_telemetry.producer import TelemetryProducer

from core import names
from core.settings import Settings
from launch.processes import EXECUTOR_READY, WORKER_READY, start_executor, start_worker
from launch.topics import ensure_topics
from tests.integration.harness import consume as _consume
from tests.integration.harness import read_snapshot

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MODEL = "llama2-70b"  # default ModelSpec: TTFT SLO 1000 ms, ITL SLO 80 ms


@pytest.fixture(scope="module")
def loop(servers: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    run = tmp_path_factory.mktemp("loop")
    settings = servers.replace(
        topic_prefix=f"t{uuid.uuid4().hex[:10]}",
        data_dir=str(run / "state"),
        window_s=1.0,
        lateness_s=0.5,
        partitions=2,
        clock_origin_s=time.time(),
        zones=("az-a",),
        command_ttl_s=30.0,
        # 1 s windows: a gain that acts within a few windows.
        pid_gains={"kp": 0.0, "ki": 0.5, "kd": 0.0},
    )
    asyncio.run(ensure_topics(settings))
    children = [start_worker(settings, run), start_executor(settings, "az-a", run)]
    try:
        children[0].wait_for_log(WORKER_READY, 120)
        children[1].wait_for_log(EXECUTOR_READY, 30)
        yield settings
    finally:
        for c in children:
            c.stop()
        for c in children:
            print(f"--- {c.name}\n{c.tail(20)}")


def _req(i: int, now: int, node: str, ttft_ms: float) -> dict:
    return {
        "kind": "request",
        "request_id": f"r{i}",
        "ts_ms": now,
        "model": MODEL,
        "zone": "az-a",
        "node": node,
        "ttft_ms": ttft_ms,
        "itl_ms": 30.0,
        "e2e_ms": ttft_ms + 3000.0,
        "prompt_tokens": 1000,
        "output_tokens": 100,
        "status": "ok",
    }


def _gpu(now: int, node: str) -> dict:
    return {
        "kind": "gpu",
        "ts_ms": now,
        "model": MODEL,
        "zone": "az-a",
        "node": node,
        "state": "ready",
        "gpu_util": 0.7,
        "mem_used_bytes": 60,
        "mem_total_bytes": 80,
        "queue_len": 3,
        "running": 8,
    }


async def test_load_step_raises_violations_and_scale_up_is_applied_once(loop: Settings) -> None:
    settings = loop
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    await redis.hset(names.desired_replicas(settings.topic_prefix, "az-a"), MODEL, 2)
    nodes = ("az-a/n1", "az-a/n2")
    i = 0
    async with TelemetryProducer(
        settings.kafka_bootstrap, settings.topic("telemetry"), source="test", linger_ms=50
    ) as producer:
        # 4 s healthy (TTFT 200 ms), then a load step: TTFT 3 s, every request violates.
        for second in range(10):
            ttft = 200.0 if second < 4 else 3000.0
            for _ in range(5):
                now = int(time.time() * 1000)
                for node in nodes:
                    await producer.send(_gpu(now, node))
                    for _ in range(4):
                        await producer.send(_req(i, now, node, ttft))
                        i += 1
                await asyncio.sleep(0.2)

    def done(seen: dict[str, list]) -> bool:
        return any(
            r["outcome"] == "applied" and r["kind"] == "scale" and r["target_replicas"] > 2 for r in seen["results"]
        )

    seen = await _consume(settings, ["metrics", "commands", "results"], done, 60)
    zone = [w for w in seen["metrics"] if w["scope"] == "zone"]
    rates = [w["violation_rate"] for w in zone]
    assert rates and min(rates) < 0.02 and max(rates) > 0.9, rates  # the step shows in the windows
    assert all(w["replicas_ready"] == 2 for w in zone if w["count"])
    ups = [c for c in seen["commands"] if c["kind"] == "scale" and c["target_replicas"] > 2]
    assert ups, seen["commands"]
    assert ups[0]["reason"] == "scale_up"
    # The fake fleet never grows, so after a few windows the target is re-issued.
    assert all(c["reason"] == "scale_up" or c["reason"].startswith("reconcile") for c in ups)
    applied = [r for r in seen["results"] if r["outcome"] == "applied"]
    ids = [r["command_id"] for r in applied]
    assert len(ids) == len(set(ids)), "a command was applied twice"
    assert ups[0]["command_id"] in ids
    desired = int(await redis.hget(names.desired_replicas(settings.topic_prefix, "az-a"), MODEL))
    assert desired == [r for r in applied if r["kind"] == "scale"][-1]["target_replicas"] > 2
    # Every request that was sent is counted in exactly one zone window: nothing dropped.
    seen_all = await _consume(
        settings, ["metrics"], lambda s: sum(w["count"] for w in s["metrics"] if w["scope"] == "zone") >= i, 15
    )
    assert sum(w["count"] for w in seen_all["metrics"] if w["scope"] == "zone") == i
    await redis.aclose()


async def test_malformed_records_land_in_dead_letter_topic_with_reason(loop: Settings) -> None:
    settings = loop
    now = int(time.time() * 1000)
    good = _req(10_000, now, "az-a/n1", 100.0)
    bad_latency = {**good, "request_id": "neg", "ttft_ms": -1.0}
    missing_zone = {k: v for k, v in good.items() if k != "zone"}
    unknown_model = {**good, "request_id": "um", "model": "no-such-model"}
    async with TelemetryProducer(
        settings.kafka_bootstrap, settings.topic("telemetry"), source="test", linger_ms=20, validate=False
    ) as producer:
        for rec in (good, bad_latency, missing_zone, unknown_model):
            await producer.send(rec)
    # A message that is not even JSON: a dead letter too, not a crashed agent.
    from aiokafka import AIOKafkaProducer

    raw = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    await raw.start()
    meta = await raw.send_and_wait(settings.topic("telemetry"), b"\x00not json", key=b"x")
    await raw.stop()

    seen = await _consume(settings, ["deadletter"], lambda s: len(s["deadletter"]) >= 4, 30)
    reasons = [d["reason"] for d in seen["deadletter"]]
    assert any("'ttft_ms'=-1.0 is below 0" in r for r in reasons), reasons
    assert any("missing field 'zone'" in r for r in reasons), reasons
    assert any("no SLO configured for model 'no-such-model'" in r for r in reasons), reasons
    envelope = [d for d in seen["deadletter"] if d["reason"].startswith("bad envelope")]
    assert envelope and envelope[0]["source"]["offset"] == meta.offset
    assert envelope[0]["source"]["partition"] == meta.partition
    for d in seen["deadletter"]:
        assert {"topic", "partition", "offset"} <= set(d["source"])
    # The pipeline goes on: a later valid record is still windowed.
    later = _req(20_000, int(time.time() * 1000), "az-a/n1", 100.0)
    async with TelemetryProducer(
        settings.kafka_bootstrap, settings.topic("telemetry"), source="test", linger_ms=20
    ) as producer:
        await producer.send(later)
    seen = await _consume(
        settings,
        ["metrics"],
        lambda s: any(w["scope"] == "zone" and w["window_end_ms"] > later["ts_ms"] for w in s["metrics"]),
        20,
    )
    assert any(w["window_end_ms"] > later["ts_ms"] for w in seen["metrics"] if w["scope"] == "zone")


async def test_worker_snapshots_the_controllers_learned_state_to_redis(loop: Settings) -> None:
    """What a restarted worker restores: the control agent saves the Scaler's state."""
    from loop.scaler_driver import Scaler

    redis = aioredis.Redis.from_url(str(loop.redis_url))
    try:
        parts = await read_snapshot(redis, loop, MODEL)  # sealed with the command keys, one key per model
    finally:
        await redis.aclose()
    assert parts, "no snapshot saved"
    restored = Scaler(loop)
    assert restored.restore(parts["scaler"]) >= 1
    assert (MODEL, "az-a") in restored.states
    assert restored.states[(MODEL, "az-a")].ctrl.last_target is not None


def test_worker_log_has_no_tracebacks(loop: Settings, tmp_path: Path) -> None:
    # Runs last in this module: bad input above must not have crashed an agent.
    log_dir = Path(loop.data_dir).parent
    text = (log_dir / "worker.log").read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
