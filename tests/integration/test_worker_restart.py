"""A worker killed mid-window loses no telemetry (issue 13, item 5), on the real broker.

The worker acknowledges a telemetry message -- Faust commits its offset --
only once every window it fed has closed (``ControlLoop.committable``).  So
records that sat in an open window when the worker died with SIGKILL are read
again by the next worker and counted: the zone window that closes has every
request, not the ones that happened to arrive after the restart.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from governor_telemetry.producer import TelemetryProducer

from core.settings import Settings
from launch.processes import WORKER_READY, start_worker
from launch.topics import ensure_topics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MODEL = "llama2-70b"
N = 200


def _records(now: int, i: int) -> list[dict]:
    req = {
        "kind": "request",
        "request_id": f"r{i}",
        "ts_ms": now,
        "model": MODEL,
        "zone": "az-a",
        "node": "az-a/n1",
        "ttft_ms": 200.0,
        "itl_ms": 30.0,
        "e2e_ms": 3200.0,
        "prompt_tokens": 100,
        "output_tokens": 10,
        "status": "ok",
    }
    gpu = {"kind": "gpu", "ts_ms": now, "model": MODEL, "zone": "az-a", "node": "az-a/n1", "state": "ready"}
    gpu.update(gpu_util=0.5, mem_used_bytes=60, mem_total_bytes=80, queue_len=0, running=2)
    return [req] if i % 20 else [req, gpu]


async def _zone_windows(settings: Settings, timeout_s: float, want_end: int) -> list[dict]:
    consumer = AIOKafkaConsumer(
        settings.topic("metrics"),
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    seen: list[dict] = []
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not any(w["window_end_ms"] == want_end for w in seen):
            for msgs in (await consumer.getmany(timeout_ms=500)).values():
                for m in msgs:
                    w = orjson.loads(m.value)
                    if w.get("scope") == "zone" and w.get("zone") == "az-a":
                        seen.append(w)
    finally:
        await consumer.stop()
    return seen


async def test_records_of_an_open_window_survive_a_sigkill_of_the_worker(servers: Settings, tmp_path: Path) -> None:
    settings = servers.replace(
        topic_prefix=f"t{uuid.uuid4().hex[:10]}",
        data_dir=str(tmp_path / "state"),
        window_s=8.0,
        lateness_s=1.0,
        partitions=1,
        clock_origin_s=time.time(),
        zones=("az-a",),
    )
    await ensure_topics(settings)
    first = start_worker(settings, tmp_path)
    second = None
    try:
        await asyncio.to_thread(first.wait_for_log, WORKER_READY, 90)
        size = int(settings.window_s * 1000)
        while (int(time.time() * 1000) % size) > 1_000:  # start early in a window: it stays open long enough
            await asyncio.sleep(0.05)
        now = int(time.time() * 1000)
        end = now - now % size + size
        async with TelemetryProducer(
            settings.kafka_bootstrap, settings.topic("telemetry"), source="t", linger_ms=20
        ) as producer:
            for i in range(N):
                for rec in _records(now + i, i):
                    await producer.send(rec)
        await asyncio.sleep(3.0)  # ingested, its offsets would have been committed (every 1 s) ...
        assert int(time.time() * 1000) < end, "the window closed before the kill: the test proves nothing"
        first.proc.send_signal(signal.SIGKILL)  # ... but the window is still open
        await asyncio.to_thread(first.proc.wait)
        second = start_worker(settings, tmp_path)
        await asyncio.to_thread(second.wait_for_log, WORKER_READY, 120)
        windows = await _zone_windows(settings, 60, end)
        mine = [w for w in windows if w["window_end_ms"] == end]
        assert mine, (windows, second.tail())
        assert max(w["count"] for w in mine) == N, (mine, second.tail())
        assert "Traceback" not in second.log_text()
    finally:
        first.stop()
        if second is not None:
            second.stop()
