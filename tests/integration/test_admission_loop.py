"""Admission on the real path: request telemetry -> the worker measures each model's P99 -> ``governor admission
add`` (the CLI, a real process) is answered by the worker -> the tail grows -> the admitted set is marked
infeasible in the registry and the metric says so, before any deadline has been missed."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import orjson
import pytest
from governor_telemetry.producer import TelemetryProducer

from core import names
from core.settings import Settings
from launch.embedded import free_port
from tests.integration.harness import worker_and_executors

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "llama2-70b"


def _req(i: int, now: int, e2e_ms: float) -> dict[str, object]:
    return {
        "kind": "request",
        "request_id": f"r{i}",
        "ts_ms": now,
        "model": MODEL,
        "zone": "az-a",
        "node": "az-a/n1",
        "ttft_ms": 50.0,
        "itl_ms": 5.0,
        "e2e_ms": e2e_ms,
        "prompt_tokens": 100,
        "output_tokens": 10,
        "status": "ok",
    }


async def _send(settings: Settings, start: int, seconds: float, e2e_ms: float) -> int:
    i = start
    async with TelemetryProducer(settings.kafka_bootstrap, settings.topic("telemetry"), source="t", linger_ms=20) as p:
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            now = int(time.time() * 1000)
            for _ in range(20):
                await p.send(_req(i, now, e2e_ms))
                i += 1
            await asyncio.sleep(0.1)
    return i


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings.to_env()}
    return subprocess.run(
        [sys.executable, "-m", "governor.cli", "admission", *args], env=env, capture_output=True, text=True, timeout=60
    )


async def test_the_worker_admits_then_warns_when_the_tail_grows(settings: Settings, tmp_path: Path) -> None:
    settings = settings.replace(zones=("az-a",), metrics_port=free_port())
    async with worker_and_executors(settings, tmp_path) as (worker, redis, _executors):
        i = await _send(settings, 0, 3.0, 100.0)  # windows of 1 s: P99 = 100 ms
        common = ("--orchestrator", "desk", "--model", MODEL, "--wait-s", "20")
        quote = await asyncio.to_thread(
            _cli, settings, "add", "--task", "quote", "--period-ms", "300", "--priority", "0", *common
        )
        assert quote.returncode == 0, (quote.stdout, quote.stderr, worker.tail())
        assert "desk|quote: admitted" in quote.stdout
        voice = await asyncio.to_thread(
            _cli, settings, "add", "--task", "voice", "--period-ms", "500", "--priority", "1", *common
        )
        assert voice.returncode == 0 and "admitted" in voice.stdout, voice.stdout
        # A third call every 250 ms at the lowest priority: w = 100 -> 300 (one quote, one voice ahead) > 250.
        big = await asyncio.to_thread(
            _cli, settings, "add", "--task", "bulk", "--period-ms", "250", "--priority", "2", *common
        )
        assert big.returncode == 1 and "rejected" in big.stdout, big.stdout
        # The tail grows to 260 ms: voice (500 ms) can miss: 260 -> 520 > 500.
        i = await _send(settings, i, 3.0, 260.0)
        key = names.admission(settings.topic_prefix)
        states: dict[str, str] = {}
        for _ in range(100):
            states = {k.decode(): orjson.loads(v)["state"] for k, v in (await redis.hgetall(key)).items()}
            if states.get("desk|voice") == "infeasible":
                break
            await asyncio.sleep(0.1)
        assert states == {"desk|quote": "infeasible", "desk|voice": "infeasible", "desk|bulk": "rejected"}, states
        check = await asyncio.to_thread(_cli, settings, "check")
        assert check.returncode == 1 and "desk" in check.stdout
        body = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{settings.metrics_port}/metrics", timeout=5).read()
        )
        assert b'governor_admission_feasible{orchestrator="desk"} 0.0' in body
        listing = await asyncio.to_thread(_cli, settings, "list")
        assert "desk|voice" in listing.stdout and "infeasible" in listing.stdout
        assert "Traceback" not in worker.log_text()


def _gpu(now: int) -> dict[str, object]:
    return {
        "kind": "gpu",
        "ts_ms": now,
        "model": MODEL,
        "zone": "az-a",
        "node": "az-a/n1",
        "state": "ready",
        "gpu_util": 0.7,
        "mem_used_bytes": 60,
        "mem_total_bytes": 80,
        "queue_len": 3,
        "running": 8,
    }


async def test_a_thousand_tasks_under_review_never_hold_up_the_scale_commands(
    settings: Settings, tmp_path: Path
) -> None:
    # 1,000 pending tasks (8 orchestrators x 125): their review starts as soon as the first window measures the
    # model's P99.  On the event loop it held every later window for minutes; off it, the overload that follows
    # is scaled within seconds, and the review still decides every task.
    settings = settings.replace(zones=("az-a",), metrics_port=free_port(), pid_gains={"kp": 0.0, "ki": 0.5, "kd": 0.0})
    async with worker_and_executors(settings, tmp_path) as (worker, redis, executors):
        desired = names.desired_replicas(settings.topic_prefix, "az-a")
        await redis.hset(desired, MODEL, 1)  # one ready node: the overload's scale-up asks for 2
        key = names.admission(settings.topic_prefix)
        tasks = {
            f"o{i % 8}|t{i}": orjson.dumps(
                {
                    "orchestrator": f"o{i % 8}",
                    "name": f"t{i}",
                    "model": MODEL,
                    "period_ms": 20_000 + 40 * i,
                    "priority": i % 50,
                    "state": "pending",
                    "registered_ms": i,
                }
            )
            for i in range(1000)
        }
        await redis.hset(key, mapping=tasks)  # type: ignore[arg-type]
        i = await _send(settings, 0, 3.0, 100.0)  # healthy: P99 = 100 ms, the review starts
        async with TelemetryProducer(
            settings.kafka_bootstrap, settings.topic("telemetry"), source="t", linger_ms=20
        ) as p:
            scaled = None
            t_end = time.monotonic() + 60
            while scaled is None and time.monotonic() < t_end:  # overload: TTFT 3 s, every request violates
                now = int(time.time() * 1000)
                await p.send(_gpu(now))
                for _ in range(20):
                    await p.send({**_req(i, now, 3100.0), "ttft_ms": 3000.0})
                    i += 1
                await asyncio.sleep(0.2)
                await executors[0].poll_once()
                raw = await redis.hget(desired, MODEL)
                scaled = int(raw) if raw is not None and int(raw) > 1 else None
        assert scaled is not None, ("no scale-up applied while the review ran", worker.tail())
        states: dict[str, str] = {}
        for _ in range(300):
            entries = await redis.hgetall(key)
            states = {(k.decode() if isinstance(k, bytes) else k): orjson.loads(v)["state"] for k, v in entries.items()}
            if "pending" not in states.values():
                break
            await asyncio.sleep(0.2)
        assert len(states) == 1000 and "pending" not in states.values(), sorted(states.values())[:5]
        assert "Traceback" not in worker.log_text()
