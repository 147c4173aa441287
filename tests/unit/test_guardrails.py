"""Guardrail settings and the kill switch's command line, without servers."""

from __future__ import annotations

import pytest

from core.settings import ModelSpec, Settings, SettingsError
from executors.backends import FleetBudget
from governor.cli import main


def test_budgets_are_read_from_the_environment_and_validated() -> None:
    s = Settings.from_env(
        {
            "GOVERNOR_MAX_REPLICAS_TOTAL": "100",
            "GOVERNOR_MODELS": '[{"name": "a", "max_replicas_total": 40}, {"name": "b"}]',
        }
    )
    assert s.max_replicas_total == 100 and s.models[0].max_replicas_total == 40
    assert Settings.from_env(s.to_env()) == s
    assert FleetBudget.from_settings(s) == FleetBudget(("az-a", "az-b"), 100, {"a": 40}, ("a", "b"))
    assert FleetBudget.from_settings(Settings()) is None  # no budget: the plain write
    with pytest.raises(SettingsError, match="GOVERNOR_MAX_REPLICAS_TOTAL=-1"):
        Settings.from_env({"GOVERNOR_MAX_REPLICAS_TOTAL": "-1"})
    with pytest.raises(SettingsError, match="max_replicas_total"):
        ModelSpec("a", max_replicas_total=-2)


@pytest.mark.parametrize("command", ["pause", "resume"])
def test_pause_without_redis_exits_2_with_one_line_naming_redis_url(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens on port 1
    assert main([command, "--reason", "x"] if command == "pause" else [command]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "REDIS_URL" in err and err.startswith(f"governor {command}:")
