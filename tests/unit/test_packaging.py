"""Inference nodes install the telemetry contract alone; the control plane depends on it."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _deps(pyproject: Path) -> list[str]:
    return tomllib.loads(pyproject.read_text())["project"]["dependencies"]


def _name(requirement: str) -> str:
    return requirement.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower()


def test_the_slim_distribution_depends_on_aiokafka_and_orjson_only() -> None:
    assert sorted(_name(d) for d in _deps(ROOT / "telemetry" / "pyproject.toml")) == ["aiokafka", "orjson"]


def test_the_control_plane_depends_on_the_slim_distribution() -> None:
    assert "governor-telemetry" in {_name(d) for d in _deps(ROOT / "pyproject.toml")}


def test_importing_the_producer_loads_nothing_of_the_control_plane() -> None:
    # A fresh interpreter: which top-level modules does the producer pull in?
    code = (
        "import json, sys; before = set(sys.modules);"
        "import governor_telemetry.producer, governor_telemetry.records, governor_telemetry.vocab;"
        "print(json.dumps(sorted({m.split('.')[0] for m in set(sys.modules) - before})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    loaded = set(json.loads(out.stdout))
    # aiokafka brings async_timeout, packaging, typing_extensions; cython_runtime is its compiled parts.
    allowed = {
        "governor_telemetry",
        "aiokafka",
        "orjson",
        "async_timeout",
        "packaging",
        "typing_extensions",
        "cython_runtime",
    }
    foreign = {m for m in loaded if m not in sys.stdlib_module_names and not m.startswith("_") and m not in allowed}
    assert not foreign, f"the producer imports {sorted(foreign)}"
    assert {"aiokafka", "orjson"} <= loaded
