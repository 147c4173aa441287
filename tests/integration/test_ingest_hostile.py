"""Hostile telemetry on the real broker, against a running worker (issue #13, items 2 and 6c).

A record dated ten years ahead, then good records: the good ones still close
windows (the far-future record is dead-lettered as ``future`` and never moved
the watermark).  A deeply nested record and a 2 MB record are dead-lettered
-- each dead letter readable from the deadletter topic and at most the cap --
and ingest keeps going.  The worker's log has no traceback.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from governor_telemetry.records import encode_envelope

from core.settings import Settings
from launch.processes import WORKER_READY, start_worker
from launch.topics import ensure_topics
from loop.deadletters import MAX_DEAD_LETTER_BYTES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MODEL = "llama2-70b"
ZONE = "az-a"
YEAR_MS = 365 * 86_400_000


@pytest.fixture(scope="module")
def worker(servers: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, Path]]:
    yield from run_worker(servers, tmp_path_factory.mktemp("ingest-hostile"))


def run_worker(servers: Settings, run: Path, **extra: Any) -> Iterator[tuple[Settings, Path]]:
    """A worker on fresh topics, 1 s windows, one partition and zone (``extra``: more settings)."""
    settings = servers.replace(
        topic_prefix=f"t{uuid.uuid4().hex[:10]}",
        data_dir=str(run / "state"),
        window_s=1.0,
        lateness_s=0.5,
        partitions=1,
        clock_origin_s=time.time(),
        zones=(ZONE,),
        **extra,
    )
    asyncio.run(ensure_topics(settings))
    child = start_worker(settings, run)
    try:
        child.wait_for_log(WORKER_READY, 120)
        yield settings, run
    finally:
        child.stop()
        print(f"--- {child.name}\n{child.tail(20)}")


def _req(i: int, ts: int, **kw: object) -> dict[str, object]:
    rec = {
        "kind": "request",
        "request_id": f"r{i}",
        "ts_ms": ts,
        "model": MODEL,
        "zone": ZONE,
        "node": "n1",
        "ttft_ms": 100.0,
        "e2e_ms": 400.0,
        "status": "ok",
    }
    rec.update(kw)
    return rec


async def _read(settings: Settings, topic: str, done: object, timeout_s: float) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        settings.topic(topic),
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
    await consumer.start()
    seen: list[bytes] = []
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not done(seen):  # type: ignore[operator]
            for msgs in (await consumer.getmany(timeout_ms=200)).values():
                seen += [m.value for m in msgs]
    finally:
        await consumer.stop()
    return seen


async def test_hostile_records_are_dead_lettered_and_good_ones_still_close_windows(
    worker: tuple[Settings, Path],
) -> None:
    settings, run = worker
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, max_request_size=8 * 1024 * 1024)
    await producer.start()
    topic = settings.topic("telemetry")
    key = f"{MODEL}|{ZONE}".encode()
    try:
        now = int(time.time() * 1000)
        await producer.send_and_wait(topic, encode_envelope([_req(0, now + 10 * YEAR_MS)], "evil", now), key=key)
        deep = b"[" * 1000 + b"1" + b"]" * 1000
        nested = b'{"schema_version":1,"kind":"batch","records":[{"kind":"request","model":' + deep + b"}]}"
        await producer.send_and_wait(topic, nested, key=key)
        big = encode_envelope([_req(1, now, model="x" * 2_000_000)], "big", now)
        await producer.send_and_wait(topic, big, key=key)
        for k in range(8):  # good records over several windows
            t = int(time.time() * 1000)
            await producer.send_and_wait(topic, encode_envelope([_req(10 + k, t)], "good", t), key=key)
            await asyncio.sleep(0.4)
    finally:
        await producer.stop()

    raw_dls = await _read(settings, "deadletter", lambda s: len(s) >= 3, 30)
    dls = [orjson.loads(v) for v in raw_dls]
    assert sorted(d["kind"] for d in dls) == ["future", "invalid record", "unknown model"], [d["reason"] for d in dls]
    assert all(len(v) <= MAX_DEAD_LETTER_BYTES for v in raw_dls), [len(v) for v in raw_dls]
    by_kind = {d["kind"]: d for d in dls}
    assert by_kind["unknown model"]["truncated"] and by_kind["unknown model"]["record_bytes"] > 2_000_000
    assert by_kind["invalid record"]["truncated"]  # the 1000-level model, clipped

    windows = [orjson.loads(v) for v in await _read(settings, "metrics", lambda s: len(s) >= 6, 30)]
    zone = [w for w in windows if w["scope"] == "zone" and w["zone"] == ZONE]
    assert len(zone) >= 2 and all(w["window_end_ms"] < now + YEAR_MS for w in zone)
    assert sum(w["count"] for w in zone) >= 2

    log = "\n".join(p.read_text(errors="replace") for p in run.glob("*.log"))
    assert "Traceback" not in log
