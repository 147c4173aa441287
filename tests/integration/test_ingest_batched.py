"""Batched ingest through the real broker (issue #37, item 1): a mixed good/bad backlog loaded on the
telemetry topic before a worker starts is read in batches (``governor_ingest_batches_total`` well under
the number of messages), and the worker publishes the window records and the dead letters that the
loop gives one message at a time (tests/unit/test_ingest_batched.py): every bad row its own dead letter
with its reason and place, the late records late, the node cap's letter, the same windows."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from core.settings import Settings
from launch.embedded import free_port
from launch.processes import WORKER_READY, start_worker
from launch.topics import ensure_topics
from tests.integration.test_ingest_hostile import _read
from tests.integration.test_probes import _get
from tests.unit.test_ingest_batched import SETTINGS, backlog, by_place, one_at_a_time

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _comparable(dl: dict[str, Any]) -> dict[str, Any]:
    """A dead letter without the times of its ingest (the reason of a ``future`` one says how far ahead)."""
    out = {k: v for k, v in dl.items() if not k.endswith("_ms")}
    if out["kind"] == "future":
        out["reason"] = out["reason"].split(" is ")[0]
    return out


def _window(w: dict[str, Any]) -> bytes:
    return orjson.dumps({k: v for k, v in w.items() if k != "emitted_ms"}, option=orjson.OPT_SORT_KEYS)


def _batches(port: int) -> float:
    text = _get(port, "/metrics")[1].decode()
    return sum(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("governor_ingest_batches_total")
    )


async def _load(settings: Settings, msgs: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, linger_ms=5)
    await producer.start()
    try:
        for raw in msgs:
            await producer.send(settings.topic("telemetry"), raw, key=b"llama2-70b|az-a", partition=0)
        await producer.flush()
    finally:
        await producer.stop()


def test_a_preloaded_mixed_backlog_read_in_batches_gives_what_one_message_at_a_time_gives(
    servers: Settings, tmp_path: Path
) -> None:
    settings = servers.replace(
        topic_prefix=f"t{uuid.uuid4().hex[:10]}",
        data_dir=str(tmp_path / "state"),
        window_s=SETTINGS.window_s,
        lateness_s=SETTINGS.lateness_s,
        models=SETTINGS.models,
        zones=SETTINGS.zones,
        max_nodes_per_window=SETTINGS.max_nodes_per_window,
        partitions=1,
        clock_origin_s=time.time(),
        metrics_port=free_port(),
        metrics_addr="127.0.0.1",
    )
    now = int(time.time() * 1000)
    msgs = backlog(now - 20_000, now)
    dead, windows, _ = one_at_a_time(msgs, settings, now, settings.topic("telemetry"), 0)
    asyncio.run(ensure_topics(settings))
    asyncio.run(_load(settings, msgs))  # the whole backlog waits on the topic before the worker starts
    child = start_worker(settings, tmp_path)
    try:
        child.wait_for_log(WORKER_READY, 120)
        got_dead = asyncio.run(_read(settings, "deadletter", lambda s: len(s) >= len(dead), 60))
        got_windows = asyncio.run(_read(settings, "metrics", lambda s: len(s) >= len(windows), 60))
        batches = _batches(settings.metrics_port)
    finally:
        child.stop()
        print(f"--- {child.name}\n{child.tail(20)}")
    assert 1 <= batches < len(msgs) / 3, batches  # many messages a batch
    assert by_place([_comparable(orjson.loads(v)) for v in got_dead]) == by_place(list(map(_comparable, dead)))
    assert sorted(_window(orjson.loads(v)) for v in got_windows) == sorted(map(_window, windows))
    log = child.log_path.read_text(errors="replace") if child.log_path.exists() else ""
    assert "Traceback" not in log
