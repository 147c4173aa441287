"""``governor ingest scrape --once --print`` as a newcomer runs it: the CLI against an engine page
served over HTTP on loopback, no Kafka (KAFKA_BOOTSTRAP names a closed port).

The page is SGLang's real multiprocess rendering (tests/fixtures/engines/sglang_mp_2.txt: 28
requests, one aborted, every token 180 ms apart).  The right setup prints its 28 request records
and one GPU record; a wrong ``--engine`` and an unmapped served model each print a warning that
says what to change, and the summary line counts them.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from governor_telemetry.records import validate_record

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "tests" / "fixtures" / "engines" / "sglang_mp_2.txt").read_text()
TINY = '[{"name": "tiny", "ttft_slo_ms": 1000, "itl_slo_ms": 150}]'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def metrics_url() -> Iterator[str]:
    """An aiohttp server on loopback serving the page at /metrics (its own loop, in a thread)."""
    loop = asyncio.new_event_loop()
    port = _free_port()
    hits: list[int] = []

    async def metrics(_req: web.Request) -> web.Response:
        hits.append(1)
        return web.Response(text=PAGE, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        assert hits, "the CLI never scraped the page"


def governor(*args: str, models: str = TINY) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOVERNOR_", "KAFKA_", "REDIS_"))}
    env |= {
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'telemetry'}",
        "GOVERNOR_MODELS": models,
        "GOVERNOR_ZONES": "az-a",
        "KAFKA_BOOTSTRAP": f"127.0.0.1:{_free_port()}",  # nothing listens: --print must not need Kafka
    }
    cmd = [sys.executable, "-m", "governor.cli", "ingest", "scrape", "--once", "--print", *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=90)


def test_once_print_shows_the_records_it_would_send(metrics_url: str) -> None:
    out = governor("--endpoint", f"{metrics_url}=az-a", "--engine", "sglang")
    assert out.returncode == 0, out.stderr
    recs = [json.loads(line) for line in out.stdout.splitlines()]
    reqs = [r for r in recs if r["kind"] == "request"]
    assert len(reqs) == 28 and [r["kind"] for r in recs].count("gpu") == 1
    assert all(validate_record(r) is None for r in recs) and {r["model"] for r in recs} == {"tiny"}
    assert sum(r["status"] == "error" for r in reqs) == 1
    assert "29 records from 1 targets" in out.stderr
    # the ITL SLO (150 ms) is not one of SGLang's edges: said once, with the flag that adds it
    assert "not a bucket edge of sglang:inter_token_latency_seconds" in out.stderr
    assert "--bucket-inter-token-latency" in out.stderr


def test_once_print_names_a_wrong_engine(metrics_url: str) -> None:
    out = governor("--endpoint", f"{metrics_url}=az-a", "--engine", "vllm")
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
    assert "shows no vllm: series" in out.stderr and "--engine sglang" in out.stderr
    assert "no_engine_series 1" in out.stderr


def test_once_print_names_an_unmapped_served_model(metrics_url: str) -> None:
    out = governor("--endpoint", f"{metrics_url}=az-a", "--engine", "sglang", models='[{"name": "llama"}]')
    assert out.returncode == 0, out.stderr
    assert "served model 'tiny' is not a configured model (llama)" in out.stderr
    assert "--model-map tiny=MODEL" in out.stderr and "unmapped_model 1" in out.stderr
    mapped = governor(
        "--endpoint",
        f"{metrics_url}=az-a",
        "--engine",
        "sglang",
        "--model-map",
        "tiny=llama",
        models='[{"name": "llama"}]',
    )
    assert "unmapped_model" not in mapped.stderr and len(mapped.stdout.splitlines()) == 29
