"""Mixed agent load (docs/model.md §15 (agents)) on the real path: request telemetry
carrying the signals (stability 0.9, RAG score 0.9, tool confidence 0.2) in two zones
-> the worker (a real process) -> one ``agents`` command per zone -> the zone executors ->
``<prefix>:routing:<zone>`` field ``_agents|<model>`` holds the weights of
those signals; the driver's state is in the worker's snapshot and the weights
in its metrics."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path

import pytest
from governor_telemetry.producer import TelemetryProducer

from controllers.agent_weights import AgentSignals, weights
from core import names
from core.settings import Settings
from launch.embedded import free_port
from loop.agent_weights_driver import AgentWeightsDriver
from tests.integration.harness import field_in_every_zone, read_snapshot, worker_and_executors

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

MODEL = "llama2-70b"
SIGNALS = {"agent_stability": 0.9, "agent_rag_score": 0.9, "agent_tool_conf": 0.2}


def _req(i: int, now: int, zone: str) -> dict:
    return {
        "kind": "request",
        "request_id": f"{zone}-{i}",
        "ts_ms": now,
        "model": MODEL,
        "zone": zone,
        "node": f"{zone}/n1",
        "ttft_ms": 200.0,
        "itl_ms": 30.0,
        "e2e_ms": 3200.0,
        "prompt_tokens": 1000,
        "output_tokens": 100,
        "status": "ok",
        **SIGNALS,
        "agent_path": ("rag", "rag", "llm", "tool")[i % 4],
    }


async def test_agent_signals_in_the_telemetry_reach_every_zones_routing_hash(
    settings: Settings, tmp_path: Path
) -> None:
    settings = settings.replace(zones=("az-a", "az-b"), command_ttl_s=60.0, metrics_port=free_port())
    want = weights(AgentSignals(0.9, 0.9, 0.2)).as_dict()
    field = f"_agents|{MODEL}"
    async with worker_and_executors(settings, tmp_path) as (worker, redis, executors):
        async with TelemetryProducer(
            settings.kafka_bootstrap, settings.topic("telemetry"), source="test", linger_ms=20
        ) as producer:
            for step in range(20):  # 4 s, 10 requests/s per zone
                now = int(time.time() * 1000)
                for zone in ("az-a", "az-b"):
                    for k in range(2):
                        await producer.send(_req(2 * step + k, now, zone))
                await asyncio.sleep(0.2)
        got = await field_in_every_zone(redis, executors, lambda z: names.routing_hash(settings.topic_prefix, z), field)
        assert set(got) == {"az-a", "az-b"}, (got, worker.tail())
        for zone, value in got.items():
            assert value["weights"] == pytest.approx(want, abs=1e-5), zone
            assert value["signals"] == pytest.approx({"stability": 0.9, "rag_score": 0.9, "tool_conf": 0.2}, abs=1e-5)
            assert value["model"] == MODEL and value["basis_ms"] > 0 and value["command_id"].startswith("agents-")
            assert set(value["paths"]) == {"rag", "tool", "llm"}
        # Constant signals: one publication per zone, never a second (weights do not move).
        assert worker.log_text().count(f"agents {MODEL}") == 2, worker.tail()
        restored = AgentWeightsDriver.from_settings(settings)
        for _ in range(50):
            parts = await read_snapshot(redis, settings, MODEL)
            if parts and restored.restore(parts["agents"]) == 2:
                break
            await asyncio.sleep(0.1)
        assert restored.published[(MODEL, "az-b")] == pytest.approx(want, abs=1e-5)
        url = f"http://127.0.0.1:{settings.metrics_port}/metrics"
        text = (await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())).decode()
        line = f'governor_agent_weight{{model="{MODEL}",path="rag",zone="az-a"}} '
        assert float(text.split(line, 1)[1].split()[0]) == pytest.approx(want["rag"], abs=1e-5)
        assert "Traceback" not in worker.log_text()
