"""/healthz, /readyz and /metrics of real worker and executor processes (streams/health.py),
and the executor's retry lines while its Redis is away."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest

from core.settings import Secret, Settings
from launch.embedded import free_port
from launch.processes import EXECUTOR_READY, WORKER_READY, ChildProcess, start_executor, start_worker
from launch.topics import ensure_topics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _until(port: int, path: str, status: int, timeout_s: float, child: ChildProcess) -> tuple[int, bytes]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            got = _get(port, path)
        except OSError:
            got = (0, b"")
        if got[0] == status or time.monotonic() > deadline:
            return got
        assert child.alive(), child.tail()
        time.sleep(0.2)


def _probe_settings(settings: Settings) -> tuple[Settings, int]:
    port = free_port()
    return settings.replace(metrics_port=port, metrics_addr="127.0.0.1"), port


def test_executor_probes_when_connected(settings: Settings, tmp_path: Path) -> None:
    s, port = _probe_settings(settings)
    ex = start_executor(s, "az-a", tmp_path)
    try:
        ex.wait_for_log(EXECUTOR_READY, 60)
        assert _until(port, "/healthz", 200, 10, ex)[0] == 200
        status, body = _until(port, "/readyz", 200, 15, ex)
        assert status == 200, body
        assert orjson.loads(body)["ready"] is True
        status, metrics = _get(port, "/metrics")
        assert status == 200 and b'governor_build_info{python="' in metrics
        assert b"governor_commands_applied_total" in metrics or b"governor_executor_paused" in metrics
    finally:
        ex.stop()


def test_executor_without_redis_stays_up_not_ready_and_says_why(settings: Settings, tmp_path: Path) -> None:
    s, port = _probe_settings(settings)
    s = s.replace(redis_url=Secret("redis://127.0.0.1:1/0"), log_format="json")
    ex = start_executor(s, "az-a", tmp_path)
    try:
        ex.wait_for_log("retry in", 30)
        assert _until(port, "/healthz", 200, 10, ex)[0] == 200
        status, body = _get(port, "/readyz")
        assert status == 503, body
        out = orjson.loads(body)
        assert out["ready"] is False and out["reason"].startswith("redis:"), out
        assert "127.0.0.1:1" in out["reason"] or "Connection refused" in out["reason"], out
        time.sleep(1.0)
        assert ex.alive()
        assert _get(port, "/readyz")[0] == 503
        lines = [orjson.loads(ln) for ln in ex.log_text().splitlines() if ln.startswith("{")]
        retries = [ln for ln in lines if "retry in" in ln["msg"]]
        assert len(retries) >= 2, ex.tail()
        assert retries[0]["level"] == "WARNING" and "redis" in retries[0]["msg"]
        assert "Traceback" not in ex.log_text()
    finally:
        assert ex.stop() == 0


def test_worker_ready_after_worker_ready(settings: Settings, tmp_path: Path) -> None:
    s, port = _probe_settings(settings)
    asyncio.run(ensure_topics(s))
    w = start_worker(s, tmp_path)
    try:
        w.wait_for_log(WORKER_READY, 120)
        status, body = _until(port, "/readyz", 200, 20, w)
        assert status == 200, body
        assert orjson.loads(body)["checks"] == {"kafka": "ok", "agents": "ok", "redis": "ok"}
        assert _get(port, "/healthz")[0] == 200
        assert b"governor_build_info" in _get(port, "/metrics")[1]
    finally:
        w.stop()


def test_version() -> None:
    from streams.health import governor_version

    out = subprocess.run(
        [sys.executable, "-m", "governor.cli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0
    assert out.stdout.strip() == f"governor {governor_version()}"
    assert governor_version()[0].isdigit()
