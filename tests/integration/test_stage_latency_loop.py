"""Stage latencies through the real worker (issue 36, item 6): the embedded broker, Redis and a
sim-backend executor.  Requests whose TTFT misses its SLO because of a slow network stage, with
no wait, make windows that carry the stage latencies and the share they explain
(``stage_unfixable_rate``); the scaler publishes a ``slow_stage`` event and adds no replicas."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from governor_telemetry.producer import TelemetryProducer

from core import names
from core.settings import Settings
from tests.integration.harness import consume, worker_and_executors
from tests.integration.test_loop import _gpu as gpu
from tests.integration.test_loop import _req as req

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MODEL = "llama2-70b"  # default ModelSpec: TTFT SLO 1000 ms
NODES = ("az-a/n1", "az-a/n2")


def _req(i: int, now: int, node: str) -> dict[str, Any]:
    """TTFT 1800 ms = a 1500 ms network stage + 2 ms preprocess + no wait + ~300 ms prefill."""
    stages = {"network_ms": 1500.0, "preprocess_ms": 2.0, "queue_ms": 0.0, "decode_ms": 3000.0}
    return {**req(i, now, node, 1800.0), **stages}


async def test_a_slow_network_stage_is_kept_in_windows_and_adds_no_replicas(settings: Settings, tmp_path: Path) -> None:
    settings = settings.replace(zones=("az-a",), pid_gains={"kp": 0.0, "ki": 0.5, "kd": 0.0})
    async with worker_and_executors(settings, tmp_path) as (_worker, redis, _executors):
        await redis.hset(names.desired_replicas(settings.topic_prefix, "az-a"), MODEL, 2)
        i = 0
        async with TelemetryProducer(
            settings.kafka_bootstrap, settings.topic("telemetry"), source="test", linger_ms=50
        ) as producer:
            for _ in range(40):  # 8 s of traffic, every request over its TTFT SLO
                now = int(time.time() * 1000)
                for node in NODES:
                    await producer.send({**gpu(now, node), "queue_len": 0})  # no queueing
                    for _ in range(4):
                        await producer.send(_req(i, now, node))
                        i += 1
                await asyncio.sleep(0.2)
        topics = ["metrics", "events", "commands"]
        seen = await consume(settings, topics, lambda s: sum(w["scope"] == "zone" for w in s["metrics"]) >= 6, 60)
        seen = await consume(settings, topics, lambda s: False, 3)  # all of it: the commands and events too
    zone = [w for w in seen["metrics"] if w["scope"] == "zone" and w["count"]]
    assert len(zone) >= 6, seen["metrics"]
    for w in zone:
        assert w["violation_rate"] == 1.0 and w["unfixable_rate"] == 1.0, w
        assert w["stage_unfixable_rate"] == 1.0, w  # the network explains every miss
        assert w["network_p95_ms"] == pytest.approx(1500.0, rel=0.02), w
        assert w["preprocess_p50_ms"] == pytest.approx(2.0, rel=0.02), w
        assert w["decode_p95_ms"] == pytest.approx(3000.0, rel=0.02), w
        assert w["queue_ms_mean"] == 0.0, w
    ups = [c for c in seen["commands"] if c["kind"] == "scale" and c["target_replicas"] > 2]
    assert not ups, ups  # no replicas for violations a replica cannot fix
    slow = [e for e in seen["events"] if e.get("kind") == "slow_stage"]
    assert slow, seen["events"]
    assert "not queueing" in slow[0]["reason"] and slow[0]["network_p95_ms"] == pytest.approx(1500.0, rel=0.02)
