"""Online retuning through the real worker (issue 36, item 1): a real ``governor worker`` process, real
Redis and broker, telemetry until a retune has run in its search process.  Shadow mode writes a
proposal with its expected effect that ``governor status`` shows, the gains in force unchanged; apply
mode with uncertified configured gains refuses the step towards the proposal (not certified, with the
certificate's reason) and keeps the gains in force; the kill switch (``governor pause --retune``) shows."""

from __future__ import annotations

import argparse
import asyncio
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

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MODEL = "llama2-70b"
ZONES = ("az-a", "az-b")


def _records(i: int, now: int, zone: str) -> list[dict[str, Any]]:
    req = {
        "kind": "request", "request_id": f"{zone}-{i}", "ts_ms": now, "model": MODEL, "zone": zone,
        "node": f"{zone}/n1", "ttft_ms": 1500.0 if i % 3 else 300.0, "itl_ms": 30.0, "e2e_ms": 4000.0,
        "prompt_tokens": 1000, "output_tokens": 100, "status": "ok",
    }  # fmt: skip
    gpu = {
        "kind": "gpu", "ts_ms": now, "model": MODEL, "zone": zone, "node": f"{zone}/n1", "state": "ready",
        "gpu_util": 0.8, "mem_used_bytes": 60, "mem_total_bytes": 80, "queue_len": 1, "running": 4,
    }  # fmt: skip
    return [req, gpu]


async def _feed_until_retuned(settings: Settings, redis: Any, worker: Any) -> dict[str, Any]:
    key = names.retune(settings.topic_prefix)
    deadline = time.monotonic() + 120
    async with TelemetryProducer(
        settings.kafka_bootstrap, settings.topic("telemetry"), source="test", linger_ms=20, validate=False
    ) as producer:
        step = 0
        while time.monotonic() < deadline:
            raw = await redis.hget(key, MODEL)
            if raw is not None and orjson.loads(raw).get("proposal"):
                return dict(orjson.loads(raw))
            now = int(time.time() * 1000)
            for zone in ZONES:
                for _ in range(5):
                    for rec in _records(step, now, zone):
                        await producer.send(rec)
                    step += 1
            await asyncio.sleep(0.2)
    raise AssertionError("no retune record in 120 s:\n" + worker.tail(60))


@pytest.mark.parametrize("mode", ["shadow", "apply"])
async def test_retune_in_the_live_worker(settings: Settings, tmp_path: Path, mode: str) -> None:
    # apply: the configured gains are not certified (b ki dt = 2.1 at the top of the plant-gain interval)
    gains = {"kp": 0.0, "ki": 0.0235, "kd": 0.0, "ki_down": 0.0105} if mode == "shadow" else {"kp": 0.0, "ki": 0.5}
    settings = settings.replace(
        zones=ZONES, command_ttl_s=30.0, pid_gains=gains, retune=mode, retune_period_s=8.0, retune_trials=3
    )
    async with worker_and_executors(settings, tmp_path) as (worker, redis, _executors):
        rec = await _feed_until_retuned(settings, redis, worker)
        prop = rec["proposal"]
        assert rec["mode"] == mode and rec["in_force"] == gains == rec["configured"], rec
        assert prop["keys"] == [f"{MODEL}|{z}" for z in ZONES] and 1 <= prop["trials"] <= 3, prop
        for arm in ("current", "proposed"):
            assert 0.0 <= prop["expected"][arm]["attainment"] <= 1.0 and prop["expected"][arm]["gpu_seconds"] > 0
        if mode == "shadow":
            assert rec["action"] == "shadow", rec
        else:  # the step towards the proposal is not certified: refused with the reason, nothing moves
            assert not prop["step_gate"]["accepted"], prop
            assert rec["action"] == "refused" and rec["reason"].startswith("not certified: "), rec
            assert prop["step_gate"]["reasons"][0] in rec["reason"], rec

        snap = await collect(settings)
        text = render_plain(snap)
        print(text)
        assert snap["retune"][MODEL]["proposal"]["proposed"] == prop["proposed"], snap["retune"]
        assert f"retune {MODEL}: {mode} ({rec['action']}: " in text and "expected attainment" in text, text

        assert run_pause(settings, argparse.Namespace(command="pause", reason="t", retune=True)) == 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            raw = await redis.hget(names.retune(settings.topic_prefix), MODEL)
            if raw is not None and orjson.loads(raw)["killed"]:
                break
            await asyncio.sleep(0.2)
        killed = orjson.loads(raw or b"{}")
        assert killed.get("killed") and killed["in_force"] == gains, killed
        assert f"retune {MODEL}: {mode} KILLED" in render_plain(await collect(settings))
