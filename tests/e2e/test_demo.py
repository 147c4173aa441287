"""The README's main command, shortened, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_the_closed_loop_and_reports_applied_commands(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP", "REDIS_URL")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "governor.cli",
            "--log-level",
            "WARNING",
            "demo",
            "--duration-s",
            "150",
            "--step-at-s",
            "40",
            "--step-factor",
            "3",
            "--speed",
            "5",
            "--out",
            str(out),
            "--no-progress",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "governor demo report" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["commands"]["applied"] >= 1, report["commands"]
    assert report["commands"]["outcomes"].get("applied", 0) == report["commands"]["applied"]
    # The loop scaled up after the load step.
    assert any(r["max"] > r["start"] for r in report["replicas"].values()), report["replicas"]
    # Injected malformed records all came back as dead letters, with reasons.
    assert report["dead_letters"]["count"] == report["injected_bad_records"]
    assert report["requests_finished"] > 500
    assert (out / "report.png").stat().st_size > 10_000
