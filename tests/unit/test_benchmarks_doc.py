"""docs/benchmarks.md answers a user's questions with the latest tables, not a lab notebook.

Each question is a section, in this order; each table of figures sits under the command that
printed it; the history of runs is left to git, so the page names no commit.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "docs" / "benchmarks.md").read_text()
LINES = TEXT.splitlines()

QUESTIONS = [
    "## How close to the physical limit?",
    "## Against the peers?",
    "## Under faults?",
    "## How fast?",
    "## On real engines?",
]
# A git commit as the docs wrote them: 7-40 hex digits with at least one letter and one digit.
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")
COMMAND = re.compile(r"`(governor|python3?) [^`]+`")


def tables() -> list[tuple[int, str]]:
    """(line index, the text since the last heading) of every markdown table's header row.

    >>> len(tables()) > 40
    True
    """
    found, heading = [], 0
    for i, line in enumerate(LINES):
        if line.startswith("#"):
            heading = i
        is_header = line.startswith("|") and i + 1 < len(LINES) and re.fullmatch(r"\|[-:| ]+\|", LINES[i + 1])
        if is_header and not LINES[i - 1].startswith("|"):
            found.append((i, "\n".join(LINES[heading:i])))
    return found


def test_the_questions_are_the_sections_in_order() -> None:
    headings = [line for line in LINES if line.startswith("## ")]
    assert [h for h in headings if h in QUESTIONS] == QUESTIONS
    # the answers start on the first screen: the summary table links each question
    first_table = tables()[0][0]
    assert first_table < 25, f"the first table is at line {first_table + 1}"
    for question in QUESTIONS:
        anchor = re.sub(r"[^\w\- ]", "", question[3:].lower()).replace(" ", "-")
        assert f"(#{anchor})" in "\n".join(LINES[: first_table + 10]), question


def test_every_table_sits_under_the_command_that_printed_it() -> None:
    orphans = [LINES[i][:60] for i, context in tables() if not COMMAND.search(context)]
    assert not orphans, f"tables with no command above them in their section: {orphans}"


def test_the_history_of_runs_is_left_to_git() -> None:
    assert not COMMIT.findall(TEXT)
    assert "before -> after" not in TEXT


def test_the_real_engines_question_names_the_commands_of_its_real_figures() -> None:
    # Issue 33: the figures on real engines each come from a command of the repository, its table under it.
    section = TEXT.split("## On real engines?", 1)[1].split("### Engine telemetry", 1)[0]
    assert "No real-engine figures exist yet" not in TEXT  # neither the summary nor the section
    for command in ("governor demo --platform local", "governor bench sim-vs-real", "governor engines setup"):
        assert command in section, command
    capacity = TEXT.split("### Real engines on one machine: capacity a replica adds", 1)[1].split("\n#", 1)[0]
    assert "`governor bench engines " in capacity.split("\n|", 1)[0]  # its table sits under its command
