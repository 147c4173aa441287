"""docs/model.md's table of constants matches the code.

Each row of the table under ``## Constants checked against the code`` is
``| constant | value | code |``: ``value`` is a Python literal and ``code`` is
``module:NAME`` (a module attribute, possibly dotted: ``module:OBJ.attr``) or
``module:Class.field``, the default of a dataclass field (``default`` or
``default_factory``) or, for a plain class, of an ``__init__`` parameter.
A value changed in the code without the document (or the reverse) fails here.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import math
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "model.md"
HEADING = "## Constants checked against the code"
MIN_ROWS = 25


def _cell(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text.startswith("`") and text.endswith("`"):
        text = text[1:-1]
    return text.strip()


def parse_table(markdown: str) -> list[tuple[str, str, str]]:
    """The ``(constant, value, code)`` rows of the checked table (header and rule excluded)."""
    lines = markdown.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == HEADING)
    except StopIteration:
        raise AssertionError(f"{DOC}: no {HEADING!r} section") from None
    rows: list[tuple[str, str, str]] = []
    header_seen = False
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        if not line.lstrip().startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not header_seen:
            assert [c.lower() for c in cells] == ["constant", "value", "code"], f"table header: {cells}"
            header_seen = True
            continue
        if all(set(c) <= set("-: ") for c in cells):
            continue  # the |---|---|---| rule
        assert len(cells) == 3, f"row needs 3 cells: {line!r}"
        rows.append((cells[0], _cell(cells[1]), _cell(cells[2])))
    return rows


def resolve(ref: str) -> Any:
    """The value ``module:path`` names (see the module docstring)."""
    module, sep, path = ref.partition(":")
    assert sep and module and path, f"code reference {ref!r}: need module:NAME"
    obj: Any = importlib.import_module(module)
    *parents, last = path.split(".")
    for name in parents:
        obj = getattr(obj, name)
    if isinstance(obj, type):
        if dataclasses.is_dataclass(obj):
            for f in dataclasses.fields(obj):
                if f.name == last:
                    if f.default is not dataclasses.MISSING:
                        return f.default
                    if f.default_factory is not dataclasses.MISSING:
                        return f.default_factory()
                    raise AssertionError(f"{ref}: dataclass field without a default")
        else:
            try:
                params = inspect.signature(obj).parameters
            except (TypeError, ValueError):
                params = {}  # type: ignore[assignment]
            p = params.get(last)
            if p is not None and p.default is not inspect.Parameter.empty:
                return p.default
    return getattr(obj, last)


def same(actual: Any, expected: Any) -> bool:
    """Equality for literals: floats with ``math.isclose``, containers element-wise."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(actual) is type(expected) and actual == expected
    if isinstance(expected, float):
        return isinstance(actual, int | float) and math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-15)
    if isinstance(expected, int):
        return isinstance(actual, int) and actual == expected
    if isinstance(expected, tuple | list):
        return (
            isinstance(actual, tuple | list)
            and len(actual) == len(expected)
            and all(same(a, e) for a, e in zip(actual, expected, strict=True))
        )
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and set(actual) == set(expected)
            and all(same(actual[k], v) for k, v in expected.items())
        )
    return bool(actual == expected)


ROWS = parse_table(DOC.read_text(encoding="utf-8"))


def test_table_has_enough_rows_and_unique_references() -> None:
    assert len(ROWS) >= MIN_ROWS
    refs = [code for _, _, code in ROWS]
    assert len(set(refs)) == len(refs), "a code reference appears twice"


@pytest.mark.parametrize(("constant", "value", "code"), ROWS, ids=[r[2] for r in ROWS])
def test_constant_matches_the_code(constant: str, value: str, code: str) -> None:
    expected = ast.literal_eval(value)
    actual = resolve(code)
    assert same(actual, expected), f"{constant}: docs/model.md says {value}, {code} is {actual!r}"


def test_the_check_can_fail() -> None:
    """A wrong value in the document is caught (the comparison is not vacuous)."""
    table = (
        f"{HEADING}\n\n| constant | value | code |\n|---|---|---|\n"
        "| PID integral gain | `0.06` | `controllers.pid:PidParams.ki` |\n"
        "| canary stages | `(0.01, 0.05, 0.25, 1.0)` | `controllers.canary:CanaryParams.stages` |\n"
        "| batch degradable | `0` | `controllers.routing_model:BATCH.degradable` |\n"
    )
    rows = parse_table(table)
    assert len(rows) == 3
    for _, value, code in rows:
        assert not same(resolve(code), ast.literal_eval(value)), code
