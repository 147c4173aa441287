"""The generated references in docs/ stay equal to the code they are made from.

``docs/commands.md`` is every command's --help (``governor.cli.build_parser``) and
``docs/settings.md`` the settings table (``core.settings.settings_table``).  When one of these
tests fails, regenerate: ``python -m governor.reference``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from core.settings import ENV_VARS
from governor.cli import build_parser
from governor.reference import REFERENCES, command_parsers, commands_markdown, main, settings_markdown

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_the_shipped_reference_is_the_one_generated_from_the_code(name: str) -> None:
    assert (ROOT / name).read_text() == REFERENCES[name](), f"{name} is stale: run python -m governor.reference"


def test_every_command_of_the_parser_has_its_section_and_usage() -> None:
    text = commands_markdown()
    progs = [prog for prog, _, _ in command_parsers(build_parser())]
    # the walk reaches the nested groups, not only the top level
    assert {"governor demo", "governor bench control", "governor analyze gains", "governor ingest scrape"} <= set(progs)
    for prog in progs:
        assert f"\n## {prog}\n" in text, prog
        assert f"usage: {prog}" in text, prog


def test_every_setting_is_in_the_settings_reference() -> None:
    text = settings_markdown()
    for env in ENV_VARS:
        assert f"| `{env}` |" in text, env


def test_check_names_a_stale_reference_and_writing_fixes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "settings.md").write_text("# an old table\n")
    assert main(["--check"], root=tmp_path) == 1
    assert "docs/settings.md: differs from the code" in capsys.readouterr().out
    assert not (tmp_path / "docs" / "commands.md").exists()  # --check writes nothing
    assert main([], root=tmp_path) == 0
    assert main(["--check"], root=tmp_path) == 0
    assert (tmp_path / "docs" / "settings.md").read_text() == settings_markdown()
