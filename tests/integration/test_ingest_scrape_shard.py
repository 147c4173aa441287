"""Two ``governor ingest scrape`` processes share the targets of one discovery document.

The simulated engines (:class:`sim.engine_server.EngineServer`: a loopback port per replica,
each one's node ``127.0.0.1:<port>``, and an HTTP SD document of them) serve twelve replicas,
then eighteen.  ``GOVERNOR_SCRAPE_SHARD=0/2`` and ``1/2`` run as operators run them
(``--once --print``, no Kafka); the nodes of the records each prints say which targets it read.
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

from adapters.scrape.targets import shard_of
from sim.engine_metrics import FleetMetrics
from sim.engine_server import EngineServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
TINY = '[{"name": "tiny", "ttft_slo_ms": 1000, "itl_slo_ms": 150}]'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Engines:
    """An EngineServer on its own loop in a thread; :meth:`add` brings replicas up."""

    def __init__(self) -> None:
        self.metrics = FleetMetrics("tiny", epoch_ms0=1_700_000_000_000)
        self.server = EngineServer(self.metrics)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self._call(self.server.start())

    def _call(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)  # type: ignore[arg-type]

    def add(self, names: range) -> None:
        for i in names:
            rec = {"node": f"r{i}", "zone": "az-a", "ts_ms": 1_700_000_000_000, "ttft_ms": 200.0, "itl_ms": 20.0}
            self.metrics.observe(rec | {"e2e_ms": 900.0, "output_tokens": 32, "status": "ok"})
        self._call(self.server.sync())

    def nodes(self) -> set[str]:
        return {addr for addr, _zone in self.server.targets().values()}

    def close(self) -> None:
        self._call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture
def engines() -> Iterator[_Engines]:
    e = _Engines()
    try:
        yield e
    finally:
        e.close()


def scraped_nodes(sd_url: str, shard: str) -> set[str]:
    """The nodes of the records one ``governor ingest scrape --once --print`` of ``shard`` prints."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOVERNOR_", "KAFKA_", "REDIS_"))}
    env |= {
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'telemetry'}",
        "GOVERNOR_MODELS": TINY,
        "GOVERNOR_ZONES": "az-a",
        "GOVERNOR_SCRAPE_SHARD": shard,
        "GOVERNOR_SCRAPE_MAX_TARGETS": "17",  # per adapter: 18 targets need two
        "KAFKA_BOOTSTRAP": f"127.0.0.1:{_free_port()}",  # nothing listens: --print needs no Kafka
    }
    cmd = [sys.executable, "-m", "governor.cli", "ingest", "scrape", "--once", "--print", "--http-sd", sd_url]
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    assert "MAX_TARGETS" not in out.stderr  # each adapter's share is under its own bound
    return {json.loads(line)["node"] for line in out.stdout.splitlines()}


def test_two_shards_read_every_target_once_and_keep_theirs_as_targets_come(engines: _Engines) -> None:
    engines.add(range(12))
    first = [scraped_nodes(engines.server.sd_url, f"{i}/2") for i in range(2)]
    # each reads the targets its hash names, and between them every one, once
    assert first == [{n for n in engines.nodes() if shard_of(f"http://{n}/metrics", 2) == i} for i in range(2)]
    assert not first[0] & first[1] and first[0] | first[1] == engines.nodes()
    engines.add(range(12, 18))  # six replicas come up
    then = [scraped_nodes(engines.server.sd_url, f"{i}/2") for i in range(2)]
    assert not then[0] & then[1] and then[0] | then[1] == engines.nodes()
    assert first[0] <= then[0] and first[1] <= then[1]  # nobody moved
