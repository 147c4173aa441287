"""A poison flood on the real broker against a running worker (issue #31, item 1).

300 poison messages -- records nested 240 to 260 levels deep (the dead letter
of one at 253 was one level past what orjson writes, and the ingest agent
crashed on it and was restarted ~5 s later) and valid-looking records with
``prompt_tokens = 2^63 - 1`` (which overflowed their window's sums, so the
window was refused) -- then good telemetry.  Each poison message gives one
dead letter; the window holding the first good record is decided (the
status the control agent writes after deciding it), every good record is
counted, no agent crashed (``governor_agent_crashes_total`` stays 0 and
``/readyz`` 200) and no metrics record was refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from aiokafka import AIOKafkaProducer
from governor_telemetry.records import encode_envelope

from core import names
from core.settings import Settings
from launch.embedded import free_port
from tests.integration.test_ingest_hostile import _read, _req, run_worker
from tests.integration.test_probes import _get

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MODEL = "llama2-70b"
ZONE = "az-a"
POISON = 300


@pytest.fixture(scope="module")
def worker(servers: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, Path]]:
    run = tmp_path_factory.mktemp("ingest-poison")
    yield from run_worker(servers, run, metrics_port=free_port(), metrics_addr="127.0.0.1")


def _poison(i: int, now: int) -> bytes:
    if i % 2:  # 2^63 - 1 tokens: valid but for the realistic bound
        return bytes(encode_envelope([_req(1000 + i, now, prompt_tokens=2**63 - 1)], "evil", now))
    depth = 240 + (i // 2) % 21  # 240..260, 253 among them
    return b'{"kind":"request","ttft_ms":' + b"[" * depth + b"]" * depth + b',"ts_ms":' + str(now).encode() + b"}"


def _scrape(settings: Settings) -> tuple[int, dict[str, float]]:
    """/readyz's status and the agents' crash counters, from the worker's health server."""
    ready, _ = _get(settings.metrics_port, "/readyz")
    text = _get(settings.metrics_port, "/metrics")[1].decode()
    crashes = {
        line.split('"')[1]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("governor_agent_crashes_total{")
    }
    return ready, crashes


async def test_a_poison_flood_then_good_telemetry_is_decided_and_no_agent_crashed(
    worker: tuple[Settings, Path],
) -> None:
    settings, run = worker
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, linger_ms=5)
    await producer.start()
    topic, key = settings.topic("telemetry"), f"{MODEL}|{ZONE}".encode()
    good: list[int] = []
    try:
        now = int(time.time() * 1000)
        sent = [await producer.send(topic, _poison(i, now), key=key) for i in range(POISON)]
        await asyncio.gather(*sent)
        for k in range(8):  # good records over several windows
            t = int(time.time() * 1000)
            good.append(t)
            await producer.send_and_wait(topic, encode_envelope([_req(10 + k, t)], "good", t), key=key)
            await asyncio.sleep(0.4)
    finally:
        await producer.stop()

    dls = [orjson.loads(v) for v in await _read(settings, "deadletter", lambda s: len(s) >= POISON, 60)]
    assert len(dls) == POISON and {d["kind"] for d in dls} == {"invalid record"}, {d["reason"] for d in dls}
    assert sum("prompt_tokens" in d["reason"] for d in dls) == POISON // 2
    assert {d["source"]["offset"] for d in dls} == set(range(POISON))

    def zone_windows(seen: list[bytes]) -> list[dict[str, Any]]:
        return [w for w in map(orjson.loads, seen) if w["scope"] == "zone" and w["zone"] == ZONE]

    counted = await _read(settings, "metrics", lambda s: sum(w["count"] for w in zone_windows(s)) >= len(good), 30)
    zone = zone_windows(counted)
    assert sum(w["count"] for w in zone) == len(good)  # every good record counted, none refused
    first = next(w for w in zone if w["window_start_ms"] <= good[0] < w["window_end_ms"])
    assert first["count"] >= 1 and first["prompt_tokens"] == 0  # no poison record reached a window
    r = redis.Redis.from_url(str(settings.redis_url))
    raw = r.hget(names.status(settings.topic_prefix), f"{MODEL}|{ZONE}")
    assert raw is not None and orjson.loads(raw)["window_end_ms"] >= first["window_end_ms"]  # decided
    ready, crashes = _scrape(settings)
    assert ready == 200 and crashes == {"ingest": 0.0, "control": 0.0, "bridge": 0.0}
    log = "\n".join(p.read_text(errors="replace") for p in run.glob("*.log"))
    assert "Traceback" not in log and "bad metrics record" not in log
