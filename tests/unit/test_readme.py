"""The README's configuration table is the settings module's: every variable, its default."""
from __future__ import annotations

import re
from pathlib import Path

from governor.settings import ENV_VARS, Settings

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_environment_variable_is_in_the_readme_with_its_default() -> None:
    rows = dict(re.findall(r"^\| `([A-Z_]+)` \| `([^`]*)` \|", README.read_text(), flags=re.M))
    defaults = Settings().to_env()
    assert set(rows) == set(ENV_VARS), set(rows) ^ set(ENV_VARS)
    for name, shown in rows.items():
        want = defaults.get(name) or ("INFO" if name == "GOVERNOR_LOG_LEVEL" else "(unset)")
        assert shown == want, (name, shown, want)
