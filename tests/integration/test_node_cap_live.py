"""1,024 junk node ids a window, live: the fleet's nodes stay, the window is held and counted (issue 31, item 5).

A running worker on the embedded broker gets a fleet of 8 GPU nodes on its SLO,
then, each window, 1,024 fresh node ids claiming a saturated fleet sent just
ahead of the 8.  Read back from the topics: every window keeps the 8 real nodes,
each attacked window says how much the cap dropped (over 10 %), the
dead-letter topic has one ``too many nodes`` letter per window (not one per
record) with that count, and no scale command goes above the 8 (before: the junk
took every slot and drove the target to 64).
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
from aiokafka import AIOKafkaProducer
from governor_telemetry.records import encode_envelope

from core.settings import Settings
from launch.processes import WORKER_READY, start_worker
from launch.topics import ensure_topics
from loop.commands import Command
from tests.integration.test_ingest_hostile import _read

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MODEL, ZONE = "llama2-70b", "az-a"
REAL = tuple(f"{ZONE}/gpu-{i}" for i in range(8))
WARM, ATTACKS = 4, 4


@pytest.fixture
def worker(servers: Settings, tmp_path: Path) -> Iterator[tuple[Settings, Path]]:
    settings = servers.replace(
        topic_prefix=f"t{uuid.uuid4().hex[:10]}",
        data_dir=str(tmp_path / "state"),
        window_s=1.0,
        lateness_s=0.5,
        partitions=1,
        clock_origin_s=time.time(),
        zones=(ZONE,),
    )
    asyncio.run(ensure_topics(settings))
    child = start_worker(settings, tmp_path)
    try:
        child.wait_for_log(WORKER_READY, 120)
        yield settings, tmp_path
    finally:
        child.stop()
        print(f"--- {child.name}\n{child.tail(20)}")


def _gpu(node: str, ts: int, running: float, queue: float) -> dict[str, Any]:
    return {
        "kind": "gpu",
        "ts_ms": ts,
        "model": MODEL,
        "zone": ZONE,
        "node": node,
        "state": "ready",
        "gpu_util": 0.6,
        "mem_used_bytes": 10,
        "mem_total_bytes": 20,
        "running": running,
        "queue_len": queue,
    }


def _req(node: str, i: int, ts: int, ttft_ms: float) -> dict[str, Any]:
    return {
        "kind": "request",
        "request_id": f"{node}-{ts}-{i}",
        "ts_ms": ts,
        "model": MODEL,
        "zone": ZONE,
        "node": node,
        "ttft_ms": ttft_ms,
        "e2e_ms": ttft_ms + 400.0,
        "status": "ok",
    }


def _real(ts: int) -> list[dict[str, Any]]:
    out = []
    for node in REAL:
        out += [_gpu(node, ts, 2.0, 0.0), *(_req(node, i, ts, 200.0) for i in range(5))]
    return out


def _junk(k: int, ts: int) -> list[dict[str, Any]]:
    out = []
    for i in range(1024):
        node = f"junk-{k}-{i}"
        out += [_gpu(node, ts, 30.0, 20.0), _req(node, 0, ts, 30_000.0)]
    return out


async def test_junk_node_ids_leave_the_fleet_its_slots_and_hold_the_window(worker: tuple[Settings, Path]) -> None:
    settings, run = worker
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, max_request_size=8 * 1024 * 1024)
    await producer.start()
    topic, key = settings.topic("telemetry"), f"{MODEL}|{ZONE}".encode()
    attacked: set[int] = set()  # window starts of the rounds with junk
    try:
        for k in range(WARM + ATTACKS):
            t = int(time.time() * 1000)
            ts = t - t % 1000 + 200  # every record of a round in one 1 s window
            junk = _junk(k, ts) if k >= WARM else []
            if junk:
                attacked.add(ts - ts % 1000)
            for first in range(0, len(junk), 512):  # the junk first, then the fleet
                await producer.send_and_wait(topic, encode_envelope(junk[first : first + 512], "evil", t), key=key)
            await producer.send_and_wait(topic, encode_envelope(_real(ts), "fleet", t), key=key)
            await asyncio.sleep(1.0 - (time.time() % 1.0) + 0.05)  # the next window
    finally:
        await producer.stop()

    def zone_windows(seen: list[bytes]) -> list[dict[str, Any]]:
        ws = [orjson.loads(v) for v in seen]
        return [w for w in ws if w["scope"] == "zone" and w["window_start_ms"] in attacked]

    raw = await _read(settings, "metrics", lambda s: len(zone_windows(s)) >= ATTACKS, 60)
    windows = [orjson.loads(v) for v in raw]
    for start in attacked:
        nodes = {w["node"] for w in windows if w["scope"] == "node" and w["window_start_ms"] == start}
        assert set(REAL) <= nodes, f"window {start}: real nodes evicted"
        (zone,) = [w for w in windows if w["scope"] == "zone" and w["window_start_ms"] == start]
        assert zone["node_cap_dropped_rate"] > 0.1, zone  # held by the control agent

    letters = [orjson.loads(v) for v in await _read(settings, "deadletter", lambda s: len(s) >= ATTACKS, 30)]
    capped = {d["record"]["window_start_ms"]: d["record"]["dropped_records"] for d in letters}
    assert [d["kind"] for d in letters] == ["too many nodes"] * ATTACKS and set(capped) == attacked
    assert {w["window_start_ms"]: w["node_cap_dropped"] for w in zone_windows(raw)} == capped

    time.sleep(2.0)  # the control agent decided the last windows
    commands = [Command.decode(v) for v in await _read(settings, "commands", lambda s: False, 3)]
    targets = [c.target_replicas for c in commands if c.kind == "scale" and c.zone == ZONE]
    assert all(t is not None and t <= len(REAL) for t in targets), targets  # before: up to 64
    log = "\n".join(p.read_text(errors="replace") for p in run.glob("*.log"))
    assert "Traceback" not in log and "telemetry_stale (node_cap)" in log
