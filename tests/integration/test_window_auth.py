"""Authenticated window records and commands on the real broker: whoever can
write to the metrics or the commands topic cannot make the worker scale.

Forged zone windows (every request violating) are produced straight onto the
metrics topic, one without the MAC headers and one with a wrong MAC; the
worker dead-letters both as ``unauthenticated window record: ...`` and no
command for the model reaches Redis.  Forged commands produced straight onto
the commands topic (unsigned, signed by another key, and a signed one changed
after signing) are dead-lettered by the bridge as ``unauthenticated command:
...``: the bridge signs only what the control agent signed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace

import orjson
import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from core import names
from core.settings import Settings
from core.signing import Keyring, generate_keys
from launch.processes import WORKER_READY, start_worker
from launch.topics import ensure_topics
from loop.commands import Command

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MODEL = "llama2-70b"
ZONE = "az-a"


@pytest.fixture(scope="module")
def worker(servers: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    run = tmp_path_factory.mktemp("window-auth")
    settings = servers.replace(
        topic_prefix=f"t{uuid.uuid4().hex[:10]}",
        data_dir=str(run / "state"),
        window_s=1.0,
        lateness_s=0.5,
        partitions=1,
        clock_origin_s=time.time(),
        zones=(ZONE,),
        command_ttl_s=30.0,
        pid_gains={"kp": 0.0, "ki": 0.5, "kd": 0.0},
    )
    asyncio.run(ensure_topics(settings))
    child = start_worker(settings, run)
    try:
        child.wait_for_log(WORKER_READY, 120)
        yield settings
    finally:
        child.stop()
        print(f"--- {child.name}\n{child.tail(20)}")


def _window(end_ms: int) -> dict:
    return {
        "scope": "zone",
        "model": MODEL,
        "zone": ZONE,
        "window_end_ms": end_ms,
        "window_s": 1.0,
        "count": 500,
        "violation_rate": 1.0,
        "replicas_ready": 2,
    }


async def _dead_letters(settings: Settings, want: int, timeout_s: float) -> list[dict]:
    consumer = AIOKafkaConsumer(
        settings.topic("deadletter"),
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
    )
    await consumer.start()
    seen: list[dict] = []
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(seen) < want:
            for msgs in (await consumer.getmany(timeout_ms=200)).values():
                seen += [orjson.loads(m.value) for m in msgs]
    finally:
        await consumer.stop()
    return seen


async def test_forged_window_records_are_dead_lettered_and_command_nothing(worker: Settings) -> None:
    settings = worker
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    await producer.start()
    try:
        for i in range(6):  # several windows' worth: enough for a real one to scale
            end = int(time.time() * 1000) // 1000 * 1000
            headers = [] if i % 2 == 0 else [("governor-kid", b"gen-x"), ("governor-sig", b"00" * 32)]
            await producer.send_and_wait(
                settings.topic("metrics"),
                orjson.dumps(_window(end)),
                key=f"{MODEL}|{ZONE}".encode(),
                headers=headers,
            )
            await asyncio.sleep(0.5)
    finally:
        await producer.stop()

    dls = await _dead_letters(settings, 6, 30)
    reasons = [d["reason"] for d in dls]
    assert len(reasons) == 6, reasons
    assert all(r.startswith("unauthenticated window record: ") for r in reasons), reasons
    assert "unauthenticated window record: no MAC" in reasons
    assert any(r.startswith("unauthenticated window record: unknown key id") for r in reasons), reasons
    assert all(d["source"]["topic"] == settings.topic("metrics") for d in dls)

    await asyncio.sleep(3.0)  # a few more windows: a command would have been bridged by now
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    try:
        entries = await redis.xrange(names.command_stream(settings.topic_prefix, ZONE))
    finally:
        await redis.aclose()
    cmds = [orjson.loads(fields[b"cmd"]) for _, fields in entries]
    assert [c for c in cmds if c.get("model") == MODEL] == []


async def test_forged_commands_on_the_topic_are_dead_lettered_never_signed_by_the_bridge(worker: Settings) -> None:
    settings = worker
    model = "forged-model"
    now = int(time.time() * 1000)
    forged = Command(
        kind="scale",
        zone=ZONE,
        model=model,
        target_replicas=100,
        reason="forged",
        issued_at_ms=now,
        expires_at_ms=now + 30_000,
        basis_ms=now,
    )
    other = Keyring.parse(generate_keys())
    ring = settings.keyring()
    assert ring is not None
    changed = replace(forged.signed(ring), target_replicas=64)  # signed, then altered
    values = [forged.encode(), forged.signed(other).encode(), changed.encode()]
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    await producer.start()
    try:
        for v in values:
            await producer.send_and_wait(settings.topic("commands"), v, key=ZONE.encode())
    finally:
        await producer.stop()
    dls = [d for d in await _dead_letters(settings, 9, 30) if d["source"]["topic"] == settings.topic("commands")]
    reasons = sorted(d["reason"] for d in dls)
    assert reasons == [
        "unauthenticated command: bad signature (key id " + ring.active + ")",
        "unauthenticated command: unknown key id " + repr(other.active),
        "unauthenticated command: unsigned command",
    ], reasons
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    try:
        entries = await redis.xrange(names.command_stream(settings.topic_prefix, ZONE))
    finally:
        await redis.aclose()
    assert [f for _, f in entries if orjson.loads(f[b"cmd"]).get("model") == model] == []
