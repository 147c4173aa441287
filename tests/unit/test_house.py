"""House rules that a reviewer would otherwise check by hand."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _python_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / line for line in out.stdout.split() if (ROOT / line).exists()]


def test_no_module_excuses_its_length() -> None:
    # Issue 32 item 7: the 400-line rule is gone; a module is split by idea, not by count, so no
    # docstring carries an "Over 400 lines:" note any more (they read as noise to a newcomer).
    noted = [
        str(p.relative_to(ROOT))
        for p in _python_files()
        if "Over 400 lines:" in (ast.get_docstring(ast.parse(p.read_text())) or "")
    ]
    assert len(_python_files()) > 100  # the check sees the repository, not an empty list
    assert not noted, noted


def test_no_package_imports_pickle() -> None:
    # State crosses restarts as plain data (driver snapshots, River models' state): a pickle read
    # back from Redis or Kafka would run whatever was planted there.
    users = []
    for path in _python_files():
        rel = path.relative_to(ROOT)
        if rel.parts[0] == "tests":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n.split(".")[0] in ("pickle", "cPickle", "dill", "cloudpickle") for n in names):
                users.append(str(rel))
    assert not users, users
