"""A process started with a placeholder or weak command signing key stops before any connection.

The installed console script, as a user or a container starts it: exit 2, one line on stderr
naming the setting, no traceback, and no connection to Kafka or Redis (both point at a
listener of the test that counts who dials it).  Issue 31, item 2: the ``REPLACE-ME:00...0``
key once shipped in docker-compose.yml and infra/k8s/secret.yaml started an executor that
applied commands signed with it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
GOVERNOR = str(Path(sys.executable).parent / "governor")
SHIPPED_PLACEHOLDER = "REPLACE-ME:" + "00" * 32  # what docker-compose.yml and secret.yaml held at ac0d19c
GOOD_HEX = bytes(range(32)).hex()


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A loopback listener standing in for Kafka and Redis: any connection to it is a failure."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        srv.setblocking(False)
        yield srv


def _run(argv: list[str], srv: socket.socket, **env: str) -> subprocess.CompletedProcess[str]:
    port = srv.getsockname()[1]
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GOVERNOR_", "KAFKA_", "REDIS_"))}
    servers = {"KAFKA_BOOTSTRAP": f"127.0.0.1:{port}", "REDIS_URL": f"redis://127.0.0.1:{port}/0"}
    return subprocess.run(
        [GOVERNOR, *argv], cwd=ROOT, env={**clean, **servers, **env}, capture_output=True, text=True, timeout=60
    )


def _dialled(srv: socket.socket) -> bool:
    try:
        conn, _ = srv.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


EXECUTOR = ["executor", "--zone", "az-a", "--backend", "sim"]
# Every weak kind on the executor (the process that applied the placeholder's command), and the
# shipped placeholder on the other processes that load the keys: one start costs ~2.5 s.
CASES = [
    (EXECUTOR, SHIPPED_PLACEHOLDER, "placeholder"),
    (EXECUTOR, "k1:" + "00" * 32, "all one value"),
    (EXECUTOR, "k1:" + "5a" * 40, "all one value"),
    (EXECUTOR, "k1:CHANGE_ME", "placeholder"),
    (EXECUTOR, "k1:" + GOOD_HEX + ",example:" + bytes(range(32, 64)).hex(), "placeholder"),  # a verify-only key
    (EXECUTOR, "k1:" + "ab" * 16, "at least 32 bytes"),
    (["worker"], SHIPPED_PLACEHOLDER, "placeholder"),
    (["fleet", "--duration-s", "1"], SHIPPED_PLACEHOLDER, "placeholder"),
]
IDS = ["shipped", "zeros", "one-value", "changeme-value", "example-kid", "short", "worker-shipped", "fleet-shipped"]


@pytest.mark.parametrize(("argv", "keys", "why"), CASES, ids=IDS)
def test_a_weak_key_stops_the_process_with_one_line_before_any_connection(
    argv: list[str], keys: str, why: str, listener: socket.socket
) -> None:
    proc = _run(argv, listener, GOVERNOR_ZONES="az-a,az-b", GOVERNOR_COMMAND_KEYS=keys)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "GOVERNOR_COMMAND_KEYS" in lines[0] and why in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert keys.split(":", 1)[1][:64] not in lines[0], "the key material is never printed"
    assert not _dialled(listener), "the process connected before refusing its key"


def test_a_placeholder_in_the_keys_file_names_the_file_setting(tmp_path: Path, listener: socket.socket) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# copied from an old docker-compose.yml\n{SHIPPED_PLACEHOLDER}\n")
    proc = _run(["worker"], listener, GOVERNOR_COMMAND_KEYS_FILE=str(path))
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "GOVERNOR_COMMAND_KEYS_FILE=" in line and "placeholder" in line
    assert not _dialled(listener)
