"""The producer library's columnar encoding through the real broker: the messages a node's
``TelemetryProducer(encoding="columns")`` puts on the telemetry topic give the worker's
processor the windows the row encoding gives, and a bad record among them is dead-lettered
alone, with its reason and its row index."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiokafka import AIOKafkaConsumer
from governor_telemetry.producer import TelemetryProducer
from governor_telemetry.records import validate_record

from core.settings import Settings
from core.transport import kafka_options
from launch.topics import ensure_topics
from loop.pipeline import TelemetryProcessor


def _records(now: int, zone: str) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = []
    for i in range(120):
        node = f"{zone}/n{i % 3}"
        recs.append(
            {
                "kind": "request",
                "request_id": f"r{i}",
                "ts_ms": now + 5 * i,
                "model": "llama2-70b",
                "zone": zone,
                "node": node,
                "ttft_ms": 100.0 + i,
                "e2e_ms": 900.0 + i,
                "itl_ms": 30.0,
                "prompt_tokens": 10 * i,
                "status": "ok" if i % 9 else "error",
            }
        )
        if i % 40 == 0:
            recs.append(
                {
                    "kind": "gpu",
                    "ts_ms": now + 5 * i,
                    "model": "llama2-70b",
                    "zone": zone,
                    "node": node,
                    "state": "ready",
                    "gpu_util": 0.5,
                    "mem_used_bytes": 10,
                    "mem_total_bytes": 20,
                }
            )
    return recs


async def _produce_and_read(settings: Settings, topic: str, encoding: str, recs: list[dict[str, Any]]) -> list[bytes]:
    async with TelemetryProducer(
        settings.kafka_bootstrap,
        topic,
        source="node-1",
        encoding=encoding,
        max_batch=100,
        validate=False,  # the bad record goes on the wire: the worker must dead-letter it
        kafka_options=kafka_options(settings),
    ) as producer:
        for rec in recs:
            await producer.send(rec)
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
        **kafka_options(settings),
    )
    await consumer.start()
    values: list[bytes] = []
    try:
        deadline = time.monotonic() + 20
        while len(values) < producer.sent_messages and time.monotonic() < deadline:
            for msgs in (await consumer.getmany(timeout_ms=500)).values():
                values += [m.value for m in msgs if m.value is not None]
    finally:
        await consumer.stop()
    assert len(values) == producer.sent_messages == 2  # 123 records, 100 a batch
    return values


def test_columns_from_the_producer_give_the_windows_rows_give(settings: Settings) -> None:
    now = int(time.time() * 1000)
    recs = _records(now, "az-a")
    bad = {**recs[7], "ttft_ms": -3.0}  # record 7 of the first batch, row 6 of its request section
    recs[7] = bad
    asyncio.run(ensure_topics(settings))
    out = {}
    for encoding in ("rows", "columns"):
        topic = settings.topic(f"telemetry-{encoding}")
        values = asyncio.run(_produce_and_read(settings, topic, encoding, recs))
        p = TelemetryProcessor(settings)
        dead, valid = [], 0
        for k, raw in enumerate(values):
            res = p.process(raw, {"topic": topic, "partition": 0, "offset": k}, now)
            dead += res.dead_letters
            valid += res.valid
        out[encoding] = (valid, dead, p.close_due(now + 60_000, now))
    (rows_valid, rows_dead, rows_win), (cols_valid, cols_dead, cols_win) = out["rows"], out["columns"]
    assert rows_valid == cols_valid == len(recs) - 1
    assert [d["reason"] for d in cols_dead] == [d["reason"] for d in rows_dead] == [validate_record(bad)]
    assert rows_dead[0]["source"]["index"] == 7
    assert (cols_dead[0]["source"]["section"], cols_dead[0]["source"]["index"]) == ("request", 6)
    assert cols_dead[0]["record"] == rows_dead[0]["record"]
    assert cols_win == rows_win and sum(w["count"] for w in cols_win if w["scope"] == "zone") == 119
