"""The docs name only things that exist.

Every repository path written in backticks in README.md and the guides of docs/
exists; every ``docs/model.md §N (anchor)`` reference names
a real section; and the feature index at the top of docs/architecture.md
agrees with the code: its modules exist in the right packages, its driver
classes are attributes of those modules, its command kinds are
``core.vocab.COMMAND_KINDS``, its backends are the executor backends, and
its benchmark commands parse with the real CLI.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = (
    "README.md",
    "docs/architecture.md",
    "docs/benchmarks.md",
    "docs/contracts.md",
    "docs/internals.md",
    "docs/model.md",
    "docs/operations.md",
    "infra/k8s/keda/README.md",
)
# The guides of the deployment bundle: what they quote of the manifests is what the manifests say.
INFRA_DOCS = ("infra/README.md", "infra/k8s/keda/README.md")
SUFFIXES = (".py", ".md", ".yml", ".yaml", ".toml", ".json")
# Paths the docs name on purpose that are not in this repository.  Absolute paths
# (outside the clone, e.g. /work/shared/...) are skipped altogether.
EXCLUDED = frozenset(
    {
        "python/ray/serve/autoscaling_policy.py",  # docs/model.md §24: a file of Ray's repository
    }
)

INDEX_HEADING = "## Feature index"
INDEX_COLUMNS = [
    "feature",
    "controller module(s)",
    "stream driver",
    "command kind",
    "executor backend(s)",
    "simulator part",
    "benchmark",
    "tests",
]
# Which package each path column's modules must live in.
COLUMN_PACKAGE: dict[str, str | tuple[str, ...]] = {
    "controller module(s)": "controllers/",
    "stream driver": ("loop/", "streams/"),  # the pure loop, or the worker around it
    "simulator part": "sim/",
    "tests": "tests/",
}


def _strip_fences(text: str) -> str:
    """The text without fenced code blocks (diagrams, shell sessions)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return "\n".join(out)


def code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", _strip_fences(text))


def paths_in(span: str) -> list[str]:
    """The repository file paths in one code span.

    >>> paths_in("streams/agents.py")
    ['streams/agents.py']
    >>> paths_in("governor bench kv"), paths_in("loop/*_driver.py"), paths_in("runs/<name>/report.json")
    ([], [], [])
    >>> paths_in("sim/fastloop.py:LoopConfig"), paths_in("/work/shared/x.md")
    (['sim/fastloop.py'], [])
    """
    found = []
    for token in span.split():
        if any(c in token for c in "<*{"):
            continue
        token = token.strip("()[],;'\"").split("#", 1)[0].split(":", 1)[0]
        if "/" in token and token.endswith(SUFFIXES) and not token.startswith("/"):
            found.append(token.removeprefix("./"))
    return found


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_in_backticks_exists(doc: str) -> None:
    text = (ROOT / doc).read_text()
    named = {p for span in code_spans(text) for p in paths_in(span)} - EXCLUDED
    assert named, f"{doc}: no paths found; is the extraction broken?"
    missing = sorted(p for p in named if not (ROOT / p).is_file())
    assert not missing, f"{doc} names files that do not exist: {missing}"


def _k8s_documents() -> list[dict[str, Any]]:
    import yaml

    return [d for p in sorted((ROOT / "infra" / "k8s").rglob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


@pytest.mark.parametrize("doc", INFRA_DOCS)
def test_the_infra_guides_quote_the_settings_and_flags_the_manifests_use(doc: str) -> None:
    """`NAME: value` / `NAME=value` of a ConfigMap key is its value there; `--backend X` is a flag some
    Deployment runs with (infra/k8s/keda/README.md said the executors run dry-run; they run the k8s one)."""
    docs = _k8s_documents()
    env = {k: v for d in docs if d["kind"] == "ConfigMap" for k, v in (d.get("data") or {}).items()}
    commands = [
        " ".join(c["command"])
        for d in docs
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
    ]
    text = " ".join((ROOT / doc).read_text().split())  # a span may wrap
    wrong = []
    for span in re.findall(r"`([^`]+)`", text):
        quoted = re.fullmatch(r"([A-Z][A-Z0-9_]+)(?::\s*|=)(.+)", span)
        if quoted and quoted[1] in env and env[quoted[1]] != quoted[2]:
            wrong.append(f"{span} (the ConfigMap: {env[quoted[1]]})")
        flag = re.fullmatch(r"--backend[ =]([\w-]+)", span)
        if flag and not any(f"--backend {flag[1]}" in cmd or f"--backend={flag[1]}" in cmd for cmd in commands):
            wrong.append(f"{span} (no Deployment runs with it)")
    assert not wrong, f"{doc} says what infra/k8s does not: {wrong}"


def _model_sections() -> dict[int, str]:
    text = (ROOT / "docs" / "model.md").read_text()
    return {int(n): a for n, a in re.findall(r"^## (\d+)\. .*\(([\w-]+)\)\s*$", text, re.M)}


@pytest.mark.parametrize("doc", DOCS)
def test_every_model_md_section_reference_exists(doc: str) -> None:
    sections = _model_sections()
    refs = re.findall(r"docs/model\.md §(\d+) \(([\w-]+)\)", (ROOT / doc).read_text())
    bad = sorted({f"§{n} ({a})" for n, a in refs if sections.get(int(n)) != a})
    assert not bad, f"{doc} cites sections docs/model.md does not have: {bad}"


# --- the feature index of docs/architecture.md ----------------------------------------


def feature_index() -> list[dict[str, str]]:
    """The rows of the table under ``## Feature index``, as column -> cell text."""
    lines = (ROOT / "docs" / "architecture.md").read_text().splitlines()
    start = lines.index(INDEX_HEADING)
    assert start < 10, "the feature index must open docs/architecture.md"
    table = []
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        if line.startswith("|"):
            table.append([c.strip() for c in line.strip().strip("|").split("|")])
    header, rule, *rows = table
    assert header == INDEX_COLUMNS
    assert all(set(c) <= set("-: ") for c in rule)
    assert all(len(r) == len(header) for r in rows), "a row with the wrong number of cells"
    return [dict(zip(header, r, strict=True)) for r in rows]


ROWS = feature_index()


def _ids(row: dict[str, str]) -> str:
    return row["feature"].split(" (")[0]


def _words(cell: str) -> list[str]:
    """Code spans of a cell that are names, not paths or placeholders."""
    return [s for s in re.findall(r"`([^`]+)`", cell) if re.fullmatch(r"[\w.-]+", s) and "/" not in s]


def test_the_index_has_the_features() -> None:
    want = {
        "Scaling feedback",
        "Feedforward and forecast",
        "Drift detection",
        "Kalman observer",
        "Zone capacity",
        "Latency-aware routing",
        "Circuit breaker",
        "Canary",
        "Mixed agent load",
        "KV relocation",
        "Commands, HLC, delivery",
        "Snapshots",
    }
    have = [r["feature"] for r in ROWS]
    missing = [w for w in want if not any(h.startswith(w) for h in have)]
    assert not missing, f"features missing from the index: {missing}"


@pytest.mark.parametrize("row", ROWS, ids=_ids)
def test_every_module_in_the_index_exists_in_its_package(row: dict[str, str]) -> None:
    problems = []
    for column, cell in row.items():
        for path in (p for span in re.findall(r"`([^`]+)`", cell) for p in paths_in(span)):
            if not (ROOT / path).is_file():
                problems.append(f"{column}: {path} does not exist")
            package = COLUMN_PACKAGE.get(column)
            if package and not path.startswith(package):
                problems.append(f"{column}: {path} is not under {package}")
    for column in ("stream driver", "tests"):
        if not any(paths_in(s) for s in re.findall(r"`([^`]+)`", row[column])):
            problems.append(f"{column}: names no module")
    assert not problems, problems


@pytest.mark.parametrize("row", ROWS, ids=_ids)
def test_driver_names_are_in_the_driver_modules(row: dict[str, str]) -> None:
    spans = re.findall(r"`([^`]+)`", row["stream driver"])
    modules = [importlib.import_module(p.removesuffix(".py").replace("/", ".")) for s in spans for p in paths_in(s)]
    for name in _words(row["stream driver"]):
        found = False
        for module in modules:
            obj: object = module
            try:
                for part in name.split("."):
                    obj = getattr(obj, part)
            except AttributeError:
                continue
            found = True
        assert found, f"{name} is in none of {[m.__name__ for m in modules]}"


def test_command_kinds_are_the_codes_and_all_are_indexed() -> None:
    from core.vocab import COMMAND_KINDS

    named = {w for r in ROWS for w in _words(r["command kind"])}
    assert named == set(COMMAND_KINDS)


def test_backends_are_the_executors_and_each_is_listed_only_for_its_kinds() -> None:
    from executors.backends import RoutingBackend
    from executors.chain import REGISTRY
    from executors.gateway import GatewayBackend
    from executors.k8s import KubernetesBackend

    backends = set(REGISTRY)
    only = {b.name: set(b.KINDS) for b in (RoutingBackend, KubernetesBackend, GatewayBackend)}
    named = set()
    for row in ROWS:
        listed = set(_words(row["executor backend(s)"]))
        assert listed <= backends, row["feature"]
        named |= listed
        kinds = set(_words(row["command kind"]))
        for name, theirs in only.items():
            if name in listed and "every" not in row["command kind"]:
                assert kinds & theirs, f"{row['feature']}: {name} applies none of {kinds}"
        if kinds and kinds <= set(RoutingBackend.KINDS):
            assert RoutingBackend.name in listed, f"{row['feature']}: {kinds} are the routing backend's"
    assert named == backends


def test_benchmark_commands_parse_with_the_cli() -> None:
    from bench.control import GOVERNOR_VARIANTS
    from governor.cli import build_parser

    parser = build_parser()
    for row in ROWS:
        for span in re.findall(r"`([^`]+)`", row["benchmark"]):
            if span.startswith("governor "):
                args = parser.parse_args(span.split()[1:])
                assert args.command == "bench", span
            else:  # a strategy of `governor bench control`
                assert span in GOVERNOR_VARIANTS, f"{row['feature']}: no strategy {span!r}"


# --- docs/architecture.md is a short guide --------------------------------------------


def test_the_architecture_is_a_short_guide_with_the_ways_in() -> None:
    from executors.chain import REGISTRY
    from sim.baselines import BASELINES

    text = (ROOT / "docs" / "architecture.md").read_text()
    assert len(text.splitlines()) <= 320, "deep detail belongs in docs/internals.md or docs/model.md"
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[:4] == [
        "Feature index",
        "The loop",
        "Package boundaries",
        "Where to add a backend, a telemetry source or a peer autoscaler",
    ]
    guide = text.split("## Where to add", 1)[1].split("\n## ", 1)[0]
    # the registries a newcomer is sent to are the ones the code reads
    assert REGISTRY and "`REGISTRY` of `executors/chain.py`" in guide
    assert BASELINES and "`BASELINES` (`sim/baselines/__init__.py`)" in guide
