"""The README a newcomer reads, and the docs derived from the settings' one source.

The settings table lives in docs/settings.md (generated; tests/unit/test_reference_docs.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

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


# --- the README a newcomer reads in ten minutes (issue 32, item 6) ----------------------------

README = (ROOT / "README.md").read_text()


def test_the_readme_reads_in_ten_minutes() -> None:
    # everything else lives in docs/: the guides and the generated references
    assert len(README.splitlines()) <= 250
    assert len(README.split()) <= 2500


def test_the_first_two_commands_are_the_demo_and_the_test_suite() -> None:
    block = README.split("```", 2)[1]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands[:2] == ["python3 dev.py demo", "python3 dev.py test"]


def test_the_readme_names_every_executor_backend_and_no_other() -> None:
    from executors.chain import REGISTRY

    (sentence,) = [p for p in README.split("\n\n") if p.startswith("There are ") and "backends" in p]
    assert f"There are {_NUMBERS[len(REGISTRY)]} executor backends" in sentence
    named = re.findall(r"`([\w-]+)`", sentence.split(":", 1)[1].split(".", 1)[0])
    assert sorted(named) == sorted(REGISTRY)


_NUMBERS = {4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}


@pytest.mark.parametrize("doc", ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("docs/*.md"))])
def test_every_relative_link_of_the_docs_reaches_a_file_and_its_heading(doc: str) -> None:
    text = (ROOT / doc).read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not this test's business
        path, _, anchor = target.partition("#")
        file = (ROOT / doc).parent / path if path else ROOT / doc
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
            broken.append(target)
    assert not broken, f"{doc}: links that reach nothing: {broken}"


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a markdown file's headings.

    >>> sorted(_anchors("## The demo and its report\\n### Past one worker (issue 18)"))
    ['past-one-worker-issue-18', 'the-demo-and-its-report']
    """
    out = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out
