"""One-shot commands that cannot reach their servers fail in one line, exit 2.

How long that takes is a start-up figure (imports on a loaded machine), not behaviour: no
test here bounds it (issue 32 item 7); the subprocess timeout only keeps a hang from stalling.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

DOWN = {"KAFKA_BOOTSTRAP": "127.0.0.1:1", "REDIS_URL": "redis://127.0.0.1:1/0"}


def _run(argv: list[str], env: dict[str, str], tmp_path: Path) -> tuple[int, str]:
    out = subprocess.run(
        [sys.executable, "-m", "governor.cli", *argv],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    return out.returncode, out.stderr


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
    rc, err = _run(argv, env, tmp_path)
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    for name in names:
        assert name in lines[0]
    assert "127.0.0.1:1" in lines[0] and "check" in lines[0]
