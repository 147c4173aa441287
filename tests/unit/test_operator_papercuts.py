"""Operator papercuts (issue 34 item 8): a closed pipe and a taken metrics port end in one line, no traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from core.signing import generate_keys

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOVERNOR_", "KAFKA_", "REDIS_"))}
    path = os.pathsep.join([str(ROOT), str(ROOT / "telemetry"), env.get("PYTHONPATH", "")])
    return {**env, "PYTHONPATH": path, **extra}


def test_config_show_into_a_closed_pipe_is_quiet() -> None:
    """`governor config show | true`: the reader is gone before the write; no BrokenPipe traceback."""
    r, w = os.pipe()
    os.close(r)  # closed before governor writes a byte: every write raises EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "governor.cli", "config", "show"],
            stdout=w,
            stderr=subprocess.PIPE,
            env=_env(),
            cwd=ROOT,
            timeout=60,
            check=False,
        )
    finally:
        os.close(w)
    err = done.stderr.decode()
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert err == ""
    assert done.returncode == 141  # 128 + SIGPIPE: what `cat` and other Unix tools end with


@pytest.mark.parametrize("command", [["executor", "--zone", "az-a", "--backend", "dry-run"], ["worker"]])
def test_a_taken_metrics_port_is_one_line_and_exit_2(command: list[str], tmp_path: Path) -> None:
    """The executor and the worker serve /metrics through one function: both end in one line naming it."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    port = held.getsockname()[1]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "governor.cli", *command],
            capture_output=True,
            env=_env(
                GOVERNOR_METRICS_PORT=str(port),
                GOVERNOR_METRICS_ADDR="127.0.0.1",
                GOVERNOR_COMMAND_KEYS=generate_keys(),
                GOVERNOR_ZONES="az-a",
                GOVERNOR_DATA_DIR=str(tmp_path / "state"),
            ),
            cwd=ROOT,
            timeout=60,
            check=False,
        )
    finally:
        held.close()
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert f"127.0.0.1:{port}" in lines[0]
    assert "GOVERNOR_METRICS_PORT" in lines[0] and "GOVERNOR_METRICS_ADDR" in lines[0]
