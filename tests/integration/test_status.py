"""``governor status`` against the real servers with the loop running: a real worker process,
one running executor per zone (heartbeats included), violating telemetry until a scale command is
applied in every zone; then the status, in-process and as ``python -m governor.cli status``;
``governor pause`` shows; an unreachable Redis is one line and exit 2 within 10 s."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from governor_telemetry.producer import TelemetryProducer

from core import names
from core.settings import Settings
from governor.pause_cli import run_pause
from governor.status import collect, render_plain
from tests.integration.harness import worker_and_executors

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MODEL = "llama2-70b"  # default ModelSpec: TTFT SLO 1000 ms
ZONES = ("az-a", "az-b")
BAD = 3  # malformed telemetry records: dead letters of the last minute


def _records(i: int, now: int, zone: str) -> list[dict[str, Any]]:
    req = {
        "kind": "request",
        "request_id": f"{zone}-{i}",
        "ts_ms": now,
        "model": MODEL,
        "zone": zone,
        "node": f"{zone}/n1",
        "ttft_ms": 2500.0,  # over the SLO: every request violates
        "itl_ms": 30.0,
        "e2e_ms": 5500.0,
        "prompt_tokens": 1000,
        "output_tokens": 100,
        "status": "ok",
    }
    gpu = {
        "kind": "gpu",
        "ts_ms": now,
        "model": MODEL,
        "zone": zone,
        "node": f"{zone}/n1",
        "state": "ready",
        "gpu_util": 0.9,
        "mem_used_bytes": 60,
        "mem_total_bytes": 80,
        "queue_len": 2,
        "running": 4,
    }
    return [req, gpu]


def _cli(settings: Settings, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **settings.to_env(), **(env or {}), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "governor.cli", *args], env=full, capture_output=True, text=True, timeout=60
    )


async def _applied_everywhere(redis: Any, settings: Settings) -> bool:
    for z in ZONES:
        raw = await redis.hget(names.executor_last_result(settings.topic_prefix, z), MODEL)
        if raw is None or orjson.loads(raw)["outcome"] != "applied":
            return False
    return True


async def test_status_shows_the_running_loop(settings: Settings, tmp_path: Path) -> None:
    settings = settings.replace(zones=ZONES, command_ttl_s=30.0, pid_gains={"kp": 0.0, "ki": 0.5, "kd": 0.0})
    async with worker_and_executors(settings, tmp_path) as (worker, redis, executors):
        tasks = [asyncio.create_task(ex.run()) for ex in executors]  # polls and heartbeats
        try:
            async with TelemetryProducer(
                settings.kafka_bootstrap, settings.topic("telemetry"), source="test", linger_ms=20, validate=False
            ) as producer:
                for i in range(BAD):  # missing every field but these: dead-lettered by the worker
                    await producer.send({"kind": "request", "model": MODEL, "zone": "az-a", "request_id": f"bad{i}"})
                deadline = time.monotonic() + 60
                step = 0
                while time.monotonic() < deadline and not (step > 25 and await _applied_everywhere(redis, settings)):
                    now = int(time.time() * 1000)
                    for zone in ZONES:
                        for rec in _records(step, now, zone):
                            await producer.send(rec)
                    step += 1
                    await asyncio.sleep(0.2)
            assert await _applied_everywhere(redis, settings), worker.tail(40)

            snap = await collect(settings)
            text = render_plain(snap)
            print(text)
            assert snap["paused"] is False and snap["worker"]["alive"], text
            assert all(snap["executors"][z]["alive"] for z in ZONES), text
            rows = {(r["model"], r["zone"]): r for r in snap["rows"]}
            assert set(rows) == {(MODEL, z) for z in ZONES}, text
            for r in rows.values():
                assert 0 <= r["window_age_s"] < 10, text
                assert r["rate_rps"] > 0 and r["violation_rate"] > 0.5, text
                assert r["ttft_p95_ms"] > r["ttft_slo_ms"] == 1000, text
                assert isinstance(r["target"], int) and r["target"] >= 1, text
                assert r["stale"] is False and r["ff_mode"] in (True, False), text
                assert r["last_command"]["outcome"] == "applied", text
                assert r["last_command"]["kind"] in ("scale", "route", "breaker", "agents"), text
                assert 0 <= r["last_command"]["age_s"] < 60, text
            kafka = snap["kafka"]
            assert "error" not in kafka, kafka
            assert kafka["dead_letters_60s"] == BAD, kafka
            assert set(kafka["lag"]) == {"telemetry", "metrics", "commands"}, kafka
            assert all(isinstance(n, int) and n >= 0 for n in kafka["lag"].values()), kafka

            # The same from the command line: one JSON object, and the plain table when piped.
            out = await asyncio.to_thread(_cli, settings, "status", "--json")
            assert out.returncode == 0, out.stderr
            cli = orjson.loads(out.stdout)
            assert {(r["model"], r["zone"]) for r in cli["rows"]} == set(rows) and cli["worker"]["alive"]
            plain = await asyncio.to_thread(_cli, settings, "status")
            assert plain.returncode == 0 and "loop running" in plain.stdout, plain.stderr
            assert "applied" in plain.stdout and "MODEL" in plain.stdout and "Traceback" not in plain.stderr
            print(plain.stdout)

            assert run_pause(settings, argparse.Namespace(command="pause", reason="status test")) == 0
            paused = await collect(settings)
            assert paused["paused"] is True and paused["pause"]["reason"] == "status test"
            assert "PAUSED (status test)" in render_plain(paused)
        finally:
            for ex in executors:
                ex.stop()
            await asyncio.gather(*tasks, return_exceptions=True)
    assert "Traceback" not in worker.log_text()


def test_an_unreachable_redis_is_one_line_and_exit_2(settings: Settings) -> None:
    out = _cli(settings, "status", env={"REDIS_URL": "redis://127.0.0.1:1/0"})
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "REDIS_URL" in lines[0] and "127.0.0.1:1" in lines[0], out.stderr
    assert out.stdout == ""


def test_an_unreachable_kafka_is_one_line_and_exit_2(settings: Settings) -> None:
    out = _cli(settings, "status", "--json", env={"KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "KAFKA_BOOTSTRAP" in lines[0] and "127.0.0.1:1" in lines[0], out.stderr


async def test_status_beside_a_scaled_clock_run_shows_true_ages(settings: Settings) -> None:
    """A demo at speed 5 (its origin 100 s ago: its clock 400 s ahead of the wall) writes what its worker and
    executor write; ``governor status`` in a shell at speed 1, told nothing of that clock, shows ages >= 0
    and close to the wall truth (issue 34 item 8: they were about -400 s)."""
    import redis.asyncio as aioredis

    from core.clock import ScaledClock
    from core.transport import redis_options
    from executors.heartbeat import Heartbeat

    settings = settings.replace(zones=("az-a",))
    run = ScaledClock(5.0, time.time() - 100.0)
    p = settings.topic_prefix
    redis = aioredis.Redis.from_url(str(settings.redis_url), **redis_options(settings))
    try:
        await redis.set(names.worker_heartbeat(p), orjson.dumps(run.stamp()), px=30_000)  # as streams.agents
        assert await Heartbeat(redis, p, "az-a", "ex1", "sim", 5.0, run.now_ms).beat()
        ten_run_s_ago = run.now_ms() - 10_000  # 10 s of the run's clock = 2 wall seconds
        await redis.hset(names.status(p), f"{MODEL}|az-a", orjson.dumps({"window_end_ms": ten_run_s_ago}))
        await redis.hset(
            names.executor_last_result(p, "az-a"), MODEL, orjson.dumps({"outcome": "applied", "at_ms": ten_run_s_ago})
        )
        snap = await collect(settings.replace(clock_speed=1.0, clock_origin_s=0.0))
    finally:
        await redis.aclose()
    assert snap["clock_speed"] == 5.0
    assert 0.0 <= snap["worker"]["age_s"] < 1.5
    assert 0.0 <= snap["executors"]["az-a"]["age_s"] < 1.5
    (row,) = snap["rows"]
    assert 1.9 <= row["window_age_s"] < 3.5
    assert 1.9 <= row["last_command"]["age_s"] < 3.5
    assert not re.search(r"-[\d.]+ s ago", render_plain(snap)), render_plain(snap)
