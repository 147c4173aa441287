"""The scrape adapter against a live HTTP ``/metrics`` endpoint and the real embedded broker.

A local HTTP server serves the vLLM fixture scrapes in turn (baseline, +10 requests, then
an engine restart with 3 requests); a second endpoint refuses connections (a replica that
is down).  Three scrapes later the telemetry topic holds envelopes whose records decode
and validate with ``governor_telemetry.records`` and add up to the histogram deltas.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from governor_telemetry.producer import TelemetryProducer
from governor_telemetry.records import decode_envelope, validate_record

from adapters.scrape.runner import Endpoint, Scraper, parse_exposition, scrape_loop
from core.settings import ModelSpec, Settings
from launch.topics import ensure_topics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
SCRAPES = ["vllm_1.txt", "vllm_2.txt", "vllm_3_restart.txt"]
SERVED = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
def engine_endpoint() -> Iterator[tuple[str, list[int]]]:
    texts = [(FIX / name).read_bytes() for name in SCRAPES]
    served: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = texts[min(len(served), len(texts) - 1)]
            served.append(len(body))
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", served
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _read_all(settings: Settings, want: int, timeout_s: float) -> list[dict[str, Any]]:
    consumer = AIOKafkaConsumer(
        settings.topic("telemetry"),
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
    )
    await consumer.start()
    records: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(records) < want and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for msgs in batch.values():
                for m in msgs:
                    records.extend(decode_envelope(m.value))
    finally:
        await consumer.stop()
    return records


def test_scrapes_of_a_live_endpoint_reach_the_topic_and_add_up(
    settings: Settings, engine_endpoint: tuple[str, list[int]]
) -> None:
    url, served = engine_endpoint
    settings = settings.replace(models=(ModelSpec("llama", ttft_slo_ms=1000.0, itl_slo_ms=150.0),))
    up = Endpoint(url, settings.zones[0])
    down = Endpoint(f"http://127.0.0.1:{_closed_port()}/metrics", settings.zones[-1])
    scraper = Scraper(settings, [up, down], "vllm", {SERVED: "llama"})

    async def run() -> tuple[int, list[dict[str, Any]]]:
        await ensure_topics(settings)
        async with TelemetryProducer(
            settings.kafka_bootstrap, settings.topic("telemetry"), source="scrape-test", linger_ms=20
        ) as producer:
            sent = await scrape_loop(scraper, producer, interval_s=0.3, scrapes=3)
        return sent, await _read_all(settings, sent, 30.0)

    t0 = time.monotonic()
    sent, records = asyncio.run(run())
    print(f"3 scrapes + produce + read back: {time.monotonic() - t0:.2f} s")
    assert len(served) == 3
    # 1 -> 2: 10 requests + 1 GPU record; 2 -> 3 (restart): 3 requests + 1 GPU record
    assert sent == 15 and len(records) == 15
    assert all(validate_record(r) is None for r in records)
    assert {(r["model"], r["zone"], r["node"]) for r in records} == {("llama", up.zone, up.node)}
    reqs = [r for r in records if r["kind"] == "request"]
    gpus = [r for r in records if r["kind"] == "gpu"]
    assert len(reqs) == 13 and len(gpus) == 2 and [g["running"] for g in gpus] == [4, 1]

    # The records add up to the histogram deltas, bucket by bucket.
    snaps = [parse_exposition((FIX / n).read_text(), "vllm")[SERVED] for n in SCRAPES]
    for prev, cur, scrape in ((snaps[0], snaps[1], 0), (snaps[1], snaps[2], 1)):
        ts = sorted({g["ts_ms"] for g in gpus})[scrape]
        mine = [r for r in reqs if r["request_id"].split("/")[1] == str(ts)]
        assert cur.ttft is not None and prev.ttft is not None
        restarted = cur.ttft.count < prev.ttft.count
        for i, edge in enumerate(cur.ttft.edges):
            want = cur.ttft.cumulative[i] - (0 if restarted else prev.ttft.cumulative[i])
            assert sum(1 for r in mine if r["ttft_ms"] <= edge * 1000.0) == want, (scrape, edge)
        failed = cur.failed - (0 if restarted else prev.failed)
        assert sum(1 for r in mine if r["status"] != "ok") == failed
        prompt = cur.prompt_tokens - (0 if restarted else prev.prompt_tokens)
        assert sum(r["prompt_tokens"] for r in mine) == prompt
    assert scraper.summaries[0][2].bounds == (2, 5)
