"""Docs that are derived from the settings' one source stay equal to it."""

from __future__ import annotations

import json
from pathlib import Path

from core.settings import ENV_VARS, Settings, json_schema, settings_table

ROOT = Path(__file__).resolve().parents[2]


def test_the_settings_reference_holds_the_table_derived_from_the_fields() -> None:
    # The table moved from the README to docs/settings.md; regenerate with: python -m governor.reference
    assert settings_table() in (ROOT / "docs" / "settings.md").read_text()


def test_the_shipped_json_schema_is_the_one_derived_from_the_fields() -> None:
    shipped = json.loads((ROOT / "docs" / "settings.schema.json").read_text())
    assert shipped == json_schema()


def test_every_field_has_one_environment_variable_and_round_trips() -> None:
    env = Settings().to_env()
    assert list(env) == list(ENV_VARS)
    assert Settings.from_env(env) == Settings()
    props = json_schema()["properties"]
    assert sorted(p["x-env"] for p in props.values()) == sorted(ENV_VARS)
