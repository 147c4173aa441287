"""The PromQL source against a real Prometheus: the same records as the direct scrape.

``/usr/bin/prometheus`` (Debian's ``prometheus`` package; ``infra/install-debian-packages.sh
prometheus`` installs it, and ``.ci/run`` does so under CI) scrapes, every second, a
local HTTP server that serves the vLLM fixture expositions in turn (baseline, +10
requests, an engine restart with 3 requests); the zone label comes from the scrape
config, as a relabel rule would set it.  For each advance, the records that
:class:`adapters.scrape.promql.PromqlSource` reads back through ``/api/v1/query`` must
equal, field by field (timestamps and ids aside), those the direct scrape path makes
of the same two texts; and Prometheus' own ``histogram_quantile(0.95, rate(...))``
must agree with the P95 of the reconstructed delta.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from adapters.scrape.promql import PromqlSource
from adapters.scrape.runner import Endpoint, Scraper
from core.settings import ModelSpec, Settings
from tests.integration.redis7 import prometheus as debian_prometheus

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
SCRAPES = ["vllm_1.txt", "vllm_2.txt", "vllm_3_restart.txt"]
SERVED = "meta-llama/Llama-3.1-8B-Instruct"
PROMETHEUS = Path("/usr/bin/prometheus")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def engine() -> Iterator[tuple[str, list[int]]]:
    """An engine /metrics whose text is ``texts[stage[0]]``; the test advances the stage."""
    texts = [(FIX / name).read_bytes() for name in SCRAPES]
    stage = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if stage[0] < 0:  # the engine is unwell: Prometheus records up == 0
                self.send_error(503)
                return
            body = texts[stage[0]]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", stage
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def prometheus(engine: tuple[str, list[int]], tmp_path: Path) -> Iterator[str]:
    debian_prometheus("the PromQL source test")
    target, _ = engine
    port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: vllm\n    static_configs:\n"
        f"      - targets: ['{target}']\n        labels: {{zone: az-a}}\n"
    )
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not start:\n{(tmp_path / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _comparable(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Records without their timestamps and ids (which say when, not what), sorted."""
    return sorted(tuple(sorted((k, v) for k, v in r.items() if k not in ("ts_ms", "request_id"))) for r in records)


def test_promql_records_equal_the_direct_scrape(engine: tuple[str, list[int]], prometheus: str) -> None:
    target, stage = engine
    settings = Settings(models=(ModelSpec("llama", ttft_slo_ms=1000.0, itl_slo_ms=150.0),))
    source = PromqlSource(settings, prometheus, "vllm", {SERVED: "llama"}, interval_s=0.3)
    direct = Scraper(settings, [Endpoint(f"http://{target}/metrics", "az-a")], "vllm", {SERVED: "llama"})
    texts = [(FIX / name).read_text() for name in SCRAPES]

    async def poll_until(done: Any, timeout_s: float = 15.0) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = await source.collect(settings_now())
            if done(got):
                return got
            await asyncio.sleep(0.3)
        raise AssertionError(f"no answer from Prometheus in {timeout_s} s ({source.polls} polls)")

    def settings_now() -> int:
        return int(time.time() * 1000)

    async def run() -> None:
        t0 = time.monotonic()
        await poll_until(lambda _: source.scraper.baselines == 1)  # Prometheus scraped the baseline
        assert direct.step({direct.endpoints[0].url: texts[0]}, settings_now()) == []
        for i in (1, 2):
            stage[0] = i
            got = await poll_until(lambda recs: any(r["kind"] == "request" for r in recs))
            want = direct.step({direct.endpoints[0].url: texts[i]}, settings_now())
            assert sum(r["kind"] == "request" for r in got) == (10, 3)[i - 1]
            assert _comparable(got) == _comparable(want), f"advance {i}"
            # Timestamps: the sample's scrape time, within the last second and a bit.
            assert all(settings_now() - 3000 <= r["ts_ms"] <= settings_now() for r in got)
        print(f"Prometheus scrapes -> PromQL records equal to the direct scrape's: {time.monotonic() - t0:.1f} s")

    asyncio.run(run())
    # Prometheus' histogram_quantile over rate() agrees with the reconstruction's P95 of each delta.
    checks = [c for c in source.p95_checks if c[3] is not None]
    assert len(checks) >= 2
    for node, served, theirs, ours in checks:
        assert ours is not None and node == target and served == SERVED
        assert abs(theirs - ours.value) <= 0.01 * ours.value, (theirs, ours)
        assert ours.lo <= theirs <= ours.hi


def test_promql_source_sends_nothing_for_a_target_that_is_down(engine: tuple[str, list[int]], prometheus: str) -> None:
    """A target Prometheus cannot scrape (up == 0) keeps its baseline and sends nothing;
    a poll that finds no newer scrape sends nothing either (``timestamp(up)`` is the
    scrape's time, not the query's)."""
    target, stage = engine
    settings = Settings()
    source = PromqlSource(settings, prometheus, "vllm", interval_s=0.3)

    async def run() -> None:
        deadline = time.monotonic() + 15
        while source.scraper.baselines == 0 and time.monotonic() < deadline:
            await source.collect(int(time.time() * 1000))
            await asyncio.sleep(0.2)
        assert source.scraper.baselines == 1
        now = time.time()
        a, b = source.query("timestamp(up)", now), source.query("timestamp(up)", now + 0.3)
        # Evaluated 0.3 s apart: the same scrape (0 apart) or the next one (~1 s), never 0.3 s.
        assert len(a) == 1 and a[0][1] <= now and abs(b[0][1] - a[0][1] - 0.3) > 0.05
        stage[0] = -1
        sent: list[dict[str, Any]] = []
        t_end = time.monotonic() + 2.5  # two scrape intervals and a half: up == 0 is in
        while time.monotonic() < t_end:
            got = await source.collect(int(time.time() * 1000))
            if source.query("up", time.time())[0][1] == 0.0:
                sent.extend(got)
            await asyncio.sleep(0.2)
        assert sent == [] and source.scraper.baselines == 1
        assert source.query("up", time.time())[0][1] == 0.0
        # The zone filter: the same Prometheus, read by a governor whose zones lack az-a.
        stage[0] = 0
        other = PromqlSource(settings.replace(zones=("az-x",)), prometheus, "vllm", interval_s=0.3)
        assert await other.collect(int(time.time() * 1000)) == [] and other.scraper.baselines == 0

    asyncio.run(run())
