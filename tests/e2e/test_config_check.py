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


def test_check_and_the_worker_refuse_a_gain_the_controllers_refuse(tmp_path: Path) -> None:
    """Settings check a gain's name and that it is a number; its range is the controller's.  Both
    ``config check`` and the worker ask the controllers before any server, so a gain out of range
    is a bad setting with its reason, not a worker that dies building its loop."""
    bad = tmp_path / "governor.yaml"
    bad.write_text(
        "zones: [a, b]\nmodels:\n  - name: m\n    replica_capacity_rps: 2.0\npid_gains: {ki: 0.05, ff_lift_z: -1}\n"
    )
    proc = _run("config", "check", str(bad))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == f"{bad}: pid_gains (model m): lift_z=-1.0: must be >= 0"
    key = "k1:" + bytes(range(32)).hex()
    proc = _run("worker", GOVERNOR_CONFIG=str(bad), GOVERNOR_COMMAND_KEYS=key)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "governor worker: bad setting: pid_gains (model m): lift_z=-1.0: must be >= 0"
    # a constraint between gains: the fractional PID's ki / kp < 0.5 alpha
    fpid = tmp_path / "fpid.yaml"
    fpid.write_text(
        "zones: [a, b]\nmodels:\n  - name: m\ncontroller: fpid\npid_gains: {kp: 0.1, ki: 0.2, alpha: 0.5}\n"
    )
    proc = _run("config", "check", str(fpid))
    assert proc.returncode == 2 and "ki=0.2: need ki/kp < 0.5*alpha" in proc.stderr, proc.stderr
    # the environment's gains are checked the same way
    proc = _run("config", "check", str(EXAMPLE), GOVERNOR_PID_GAINS='{"ki": 0.05, "ff_error_margin": -2}')
    assert proc.returncode == 2 and "ff_error_margin" not in proc.stderr and "error_margin=-2" in proc.stderr
