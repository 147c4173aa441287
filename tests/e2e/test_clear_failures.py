"""One-shot commands that cannot reach their servers fail in seconds, in one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

DOWN = {"KAFKA_BOOTSTRAP": "127.0.0.1:1", "REDIS_URL": "redis://127.0.0.1:1/0"}


def _run(argv: list[str], env: dict[str, str], tmp_path: Path) -> tuple[int, str, float]:
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "governor.cli", *argv],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    return out.returncode, out.stderr, time.monotonic() - t0


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        (["demo", "--duration-s", "10"], DOWN, ("KAFKA_BOOTSTRAP", "REDIS_URL")),
        (["demo", "--duration-s", "10"], {"KAFKA_BOOTSTRAP": "127.0.0.1:1"}, ("KAFKA_BOOTSTRAP",)),
        (["bench", "pipeline"], DOWN, ("KAFKA_BOOTSTRAP", "REDIS_URL")),
        (["pause"], DOWN, ("REDIS_URL",)),
        (["resume"], DOWN, ("REDIS_URL",)),
        (["canary", "status", "--model", "m"], DOWN, ("REDIS_URL",)),
    ],
    ids=["demo", "demo-kafka-only", "bench-pipeline", "pause", "resume", "canary"],
)
def test_unreachable_server_is_one_line_and_exit_2(
    argv: list[str], env: dict[str, str], names: tuple[str, ...], tmp_path: Path
) -> None:
    rc, err, took = _run(argv, env, tmp_path)
    assert rc == 2, err
    assert took < 10, took
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    for name in names:
        assert name in lines[0]
    assert "127.0.0.1:1" in lines[0] and "check" in lines[0]
