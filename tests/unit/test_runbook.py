"""docs/runbook.md covers every alert, its links resolve, and it names only metrics the code exports."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "runbook.md"
ALERTS = ROOT / "infra" / "prometheus" / "alerts.yml"
METRIC_RE = re.compile(r"\bgovernor_[a-z0-9_]+\b")
# Where metrics are defined: the worker's and executors' exporters (streams/), the executor's own (executors/).
METRIC_SOURCES = ("streams", "executors")


def _rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"] if "alert" in r]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens.

    >>> anchor("GovernorSLOViolationHigh"), anchor("First look: `governor status`")
    ('governorsloviolationhigh', 'first-look-governor-status')
    """
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors() -> set[str]:
    return {anchor(m) for m in re.findall(r"^#{1,6} (.+)$", RUNBOOK.read_text(), flags=re.M)}


def _exported() -> set[str]:
    """Every governor_* name that appears in the code of the exporters (counters also with _total)."""
    names: set[str] = set()
    for pkg in METRIC_SOURCES:
        for path in (ROOT / pkg).rglob("*.py"):
            for name in re.findall(r"[\"'](governor_[a-z0-9_]+)[\"']", path.read_text()):
                names |= {name, name.removesuffix("_total"), name + "_total"}
    return names


def test_every_alert_has_a_runbook_url_that_resolves() -> None:
    anchors = _anchors()
    rules = _rules()
    assert len(rules) >= 6
    for rule in rules:
        url = rule.get("annotations", {}).get("runbook_url", "")
        path, _, frag = url.partition("#")
        assert path == "docs/runbook.md" and (ROOT / path).is_file(), f"{rule['alert']}: runbook_url {url!r}"
        assert frag in anchors, f"{rule['alert']}: no heading with anchor #{frag} in docs/runbook.md"
        assert frag == anchor(rule["alert"]), f"{rule['alert']}: link its own entry, not #{frag}"


def test_every_alert_entry_says_what_it_means_what_to_check_and_what_to_do() -> None:
    sections = re.split(r"^## ", RUNBOOK.read_text(), flags=re.M)
    by_title = {s.split("\n", 1)[0].strip(): s for s in sections[1:]}
    for rule in _rules():
        body = by_title.get(rule["alert"])
        assert body is not None, f"docs/runbook.md has no '## {rule['alert']}' entry"
        for part in ("**Means.**", "**Check.**", "**Do.**"):
            assert part in body, f"{rule['alert']}: entry lacks {part}"
        used = set(METRIC_RE.findall(rule["expr"]))
        assert used <= set(METRIC_RE.findall(body)), f"{rule['alert']}: name the alert's metric {used}"


def test_every_metric_the_runbook_names_exists() -> None:
    named = set(METRIC_RE.findall(RUNBOOK.read_text()))
    assert len(named) >= 10  # the check must see names at all
    missing = sorted(named - _exported())
    assert not missing, f"docs/runbook.md names metrics no exporter defines: {missing}"


def test_internal_links_of_the_runbook_resolve() -> None:
    links = re.findall(r"\]\(#([^)]+)\)", RUNBOOK.read_text())
    assert links and set(links) <= _anchors()
