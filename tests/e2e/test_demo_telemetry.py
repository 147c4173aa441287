"""The demo's closed loop through the engines' own telemetry, as a user runs it.

``--telemetry scrape``: the simulated replicas serve vLLM ``/metrics`` and an HTTP
service-discovery document; ``governor ingest scrape`` (a child process) is all the
worker hears from, and the loop still scales the fleet up after the load step.
``--telemetry otlp`` (the replicas export request spans to ``governor ingest otlp``) is tested
without the demo's start-up: tests/integration/test_ingest_otlp.py runs the same exporter against
the real receiver.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]


def _demo(out: Path, mode: str, *extra: str, **env_extra: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP", "REDIS_URL")} | env_extra
    argv = [sys.executable, "-m", "governor.cli", "--log-level", "WARNING", "demo", "--telemetry", mode]
    argv += ["--speed", "10", "--out", str(out), "--no-progress", "--bad-rate", "0", *extra]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    assert report["telemetry"]["mode"] == mode
    assert f"telemetry             mode={mode}" in proc.stdout
    return report


def test_the_load_step_is_scaled_through_the_scrape_path(tmp_path: Path) -> None:
    # The adapter ships typed messages (GOVERNOR_TELEMETRY_ENCODING): the worker's fastest path, end to end.
    out = tmp_path / "scrape"
    argv = ("--duration-s", "100", "--step-at-s", "25", "--step-factor", "3")
    report = _demo(out, "scrape", *argv, GOVERNOR_TELEMETRY_ENCODING="typed")
    tel = report["telemetry"]
    # The fleet shipped no native record: everything the worker windowed was scraped.
    assert report["telemetry_records_sent"] == 0
    assert tel["scrapes_answered"] > 20, tel
    assert report["pipeline"]["requests_in_windows"] > 0.5 * report["requests_finished"], report["pipeline"]
    # The loop scaled up after the step: desired replicas rose, and more replicas became ready.
    assert report["commands"]["applied"] >= 1, report["commands"]
    assert any(r["max"] > r["start"] for r in report["replicas"].values()), report["replicas"]
    assert any(target > 4 for _, _, target in report["decisions"]), report["decisions"]  # desired > --replicas
    assert "ingest-scrape.log" in {p.name for p in out.iterdir()}
    assert "telemetry as typed" in (out / "ingest-scrape.log").read_text()
