"""A model spec refuses what the loop cannot do: no scale from zero (issue 34 item 4)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from core.settings import ModelSpec, Settings, SettingsError

ROOT = Path(__file__).resolve().parents[2]


def test_min_replicas_zero_is_refused_with_the_reason() -> None:
    with pytest.raises(SettingsError, match=r"min_replicas must be >= 1 .*does not scale from zero"):
        ModelSpec("m", min_replicas=0)
    with pytest.raises(SettingsError, match="need 1 <= min_replicas"):
        ModelSpec("m", min_replicas=3, max_replicas=2)
    assert ModelSpec("m", min_replicas=1, max_replicas=1).min_replicas == 1


def test_the_environment_and_the_config_file_refuse_it_too(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="scale from zero"):
        Settings.from_env({"GOVERNOR_MODELS": '[{"name": "m", "min_replicas": 0}]'})
    cfg = tmp_path / "governor.yaml"
    cfg.write_text("models:\n  - name: m\n    min_replicas: 0\n")
    out = subprocess.run(
        [sys.executable, "-m", "governor.cli", "config", "check", str(cfg)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stdout + out.stderr
    assert "min_replicas" in out.stderr and "Traceback" not in out.stderr
