"""The circuit breaker on the real path: request telemetry with 6 % errors ->
the worker (a real process) trips the target's breaker -> one breaker command
per zone -> the zone executors -> ``<prefix>:breaker:<zone>`` says "open";
the breaker's state is in the worker's snapshot."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path

import pytest
from governor_telemetry.producer import TelemetryProducer

from core import names
from core.settings import Settings
from launch.embedded import free_port
from loop.breaker_driver import BreakerDriver
from tests.integration.harness import field_in_every_zone, read_snapshot, worker_and_executors

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

MODEL = "llama2-70b"
TARGET = f"{MODEL}|az-a"


def _req(i: int, now: int, error: bool) -> dict:
    return {
        "kind": "request",
        "request_id": f"r{i}",
        "ts_ms": now,
        "model": MODEL,
        "zone": "az-a",
        "node": "az-a/n1",
        "ttft_ms": 200.0,
        "itl_ms": 30.0,
        "e2e_ms": 3200.0,
        "prompt_tokens": 1000,
        "output_tokens": 100,
        "status": "error" if error else "ok",
    }


async def test_errors_above_the_threshold_open_the_breaker_in_every_zones_hash(
    settings: Settings, tmp_path: Path
) -> None:
    settings = settings.replace(
        zones=("az-a", "az-b"), breaker_min_requests=200, command_ttl_s=60.0, metrics_port=free_port()
    )
    async with worker_and_executors(settings, tmp_path) as (worker, redis, executors):
        # 4 s at 150 requests/s, every 16th fails (6.25 % >> the 0.5 % threshold).
        i = 0
        async with TelemetryProducer(
            settings.kafka_bootstrap, settings.topic("telemetry"), source="test", linger_ms=20
        ) as producer:
            for _ in range(20):
                now = int(time.time() * 1000)
                for _ in range(30):
                    await producer.send(_req(i, now, i % 16 == 0))
                    i += 1
                await asyncio.sleep(0.2)
        states = await field_in_every_zone(
            redis, executors, lambda z: names.breaker_hash(settings.topic_prefix, z), TARGET
        )
        assert set(states) == {"az-a", "az-b"}, (states, worker.tail())
        for zone, st in states.items():
            assert st["state"] == "open", (zone, st)
            assert st["target"] == TARGET and st["probe_budget"] == 0
            assert st["error_ratio"] > st["threshold"] >= 0.005
            assert st["basis_ms"] > 0
        assert all(ex.stats.outcomes.get("applied", 0) >= 1 for ex in executors)
        assert "breaker" in worker.log_text() and "Traceback" not in worker.log_text()
        # The control agent saved the breaker with the other snapshots (every >= 2 s).
        restored = BreakerDriver.from_settings(settings)
        for _ in range(50):
            parts = await read_snapshot(redis, settings, MODEL)
            if parts and restored.restore(parts["breaker"]) and restored.state_of(TARGET) == "open":
                break
            await asyncio.sleep(0.1)
        assert restored.state_of(TARGET) == "open"
        assert parts is not None and set(parts) == {"scaler", "breaker", "kv", "agents"}  # the model's one key
        url = f"http://127.0.0.1:{settings.metrics_port}/metrics"
        text = (await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())).decode()
        assert f'governor_breaker_state{{model="{MODEL}",zone="az-a"}} 2.0' in text
        assert f'governor_breaker_transitions_total{{model="{MODEL}",state="open",zone="az-a"}} 1.0' in text
