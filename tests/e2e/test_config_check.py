"""``governor config check`` and ``GOVERNOR_CONFIG`` as a user runs them: the installed
console script, exit codes 0 and 2, and the messages.  No servers are needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
GOVERNOR = str(Path(sys.executable).parent / "governor")
EXAMPLE = ROOT / "infra" / "governor.example.yaml"


def _run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("GOVERNOR_", "KAFKA_", "REDIS_"))}
    return subprocess.run([GOVERNOR, *argv], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=60)


def test_check_accepts_the_example_file() -> None:
    proc = _run("config", "check", str(EXAMPLE))
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert "\n" not in line and line.startswith(f"{EXAMPLE}: ok: 2 models (llama2-70b: classes trading, voice, batch")
    assert "from the file: zones, zone_redundancy, models" in line and "Traceback" not in proc.stderr


def test_check_names_the_first_bad_value_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "governor.yaml"
    bad.write_text("zones: [a, b]\nmodels:\n  - name: m\n  - name: n\n    ttft_slo_ms: -5\n")
    proc = _run("config", "check", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"{bad}: models[1].ttft_slo_ms: must be > 0 (got -5)"
    assert proc.stdout == ""


def test_the_environment_overrides_the_file_unless_no_env(tmp_path: Path) -> None:
    proc = _run("config", "check", str(EXAMPLE), GOVERNOR_EPS_REF="1.5")
    assert proc.returncode == 2 and proc.stderr.strip() == "GOVERNOR_EPS_REF=1.5: must be < 1"
    proc = _run("config", "check", "--no-env", str(EXAMPLE), GOVERNOR_EPS_REF="1.5")
    assert proc.returncode == 0, proc.stderr
    proc = _run("config", "show", GOVERNOR_CONFIG=str(EXAMPLE), GOVERNOR_EPS_REF="0.03")
    assert (
        proc.returncode == 0 and "eps_ref: 0.03  # env" in proc.stdout and "zone_redundancy: 1  # file" in proc.stdout
    )


def test_every_command_reads_governor_config(tmp_path: Path) -> None:
    bad = tmp_path / "governor.yaml"
    bad.write_text("zones: [a]\nzone_redundancy: 1\n")
    proc = _run("status", GOVERNOR_CONFIG=str(bad))  # fails on the settings, before any server is asked
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"governor: bad setting: {bad}: zone_redundancy: must be below the number of zones (1) (got 1)"
    )
