"""The window's shape is listed once (controllers.window_fields) and the window modules form no import circle.

Issue 32 item 5: the aggregate, the columns and the record were written out three times, and
``controllers/windows.py`` and ``controllers/window_result.py`` imported each other.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from controllers import window_fields
from controllers.window_fields import AGGREGATE, RECORD, FieldTableError, check_dataclass, check_keys, field_names
from controllers.window_record import WindowRecord
from controllers.window_result import node_kv, result
from controllers.windows import WindowAggregate, initialize

CONTROLLERS = Path(__file__).resolve().parents[2] / "controllers"


def _imports(path: Path) -> set[str]:
    """The ``controllers`` modules ``path`` imports anywhere (top level, in functions, under TYPE_CHECKING)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("controllers."):
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("controllers.")}
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module -> modules it imports), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return [*path[path.index(n) :], n]
            if n not in state and (found := visit(n)):
                return found
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_controllers_package_has_no_import_cycle() -> None:
    graph = {p.stem: _imports(p) - {p.stem} for p in CONTROLLERS.glob("*.py")}
    assert "window_result" in graph and "windows" in graph["window_result"]
    assert _cycle(graph) is None, f"import cycle in controllers/: {' -> '.join(_cycle(graph) or [])}"


def test_the_cycle_finder_finds_the_old_windows_circle() -> None:
    old = {"windows": {"window_result", "window_columns"}, "window_result": {"windows"}, "window_columns": set()}
    found = _cycle(old)
    assert found is not None and set(found) == {"windows", "window_result"}


def test_the_record_class_and_the_summaries_are_the_table() -> None:
    assert [f.name for f in dataclasses.fields(WindowRecord)] == [f.name for f in RECORD]
    assert set(result(initialize(), 1.0)) == set(field_names("result"))
    assert set(node_kv(None)) == set(field_names("node"))
    assert {f.name for f in dataclasses.fields(WindowAggregate)} == {f.name for f in AGGREGATE}


def test_a_record_field_is_listed_once() -> None:
    names = [f.name for f in RECORD]
    assert len(names) == len(set(names))
    aggs = [f.name for f in AGGREGATE]
    assert len(aggs) == len(set(aggs))


def test_every_field_of_a_signed_record_is_in_the_table() -> None:
    import orjson

    from tests.unit.test_window_wire import FIXTURE

    keys: set[str] = set()
    for line in FIXTURE.read_bytes().splitlines()[::3]:
        keys |= set(orjson.loads(line))
    assert keys - {"schema_version", "kind"} == {f.name for f in RECORD}


def test_a_dataclass_that_drifts_from_its_table_is_refused() -> None:
    @dataclasses.dataclass
    class Extra(WindowAggregate):
        n_new: int = 0

    with pytest.raises(FieldTableError, match=r"not in the table: \['n_new'\]"):
        check_dataclass(Extra, AGGREGATE, ordered=False)

    @dataclasses.dataclass(frozen=True)
    class Renamed:
        scope: str
        model: str

    with pytest.raises(FieldTableError, match="missing"):
        check_dataclass(Renamed, RECORD, ordered=True)
    with pytest.raises(FieldTableError, match="out of order"):
        check_dataclass(Renamed, (RECORD[1], RECORD[0]), ordered=True)

    @dataclasses.dataclass
    class WrongDefault:
        count: int = 1

    with pytest.raises(FieldTableError, match="empty values of \\['count'\\]"):
        check_dataclass(WrongDefault, (RECORD[11],), ordered=True)


def test_a_summary_with_a_key_not_in_the_table_is_refused() -> None:
    with pytest.raises(FieldTableError, match="agent_new_mean"):
        check_keys("result", [*field_names("result"), "agent_new_mean"], "result")


def test_the_names_that_follow_a_column_are_made_from_it() -> None:
    """One edit of a column table, and the aggregate and the record follow."""
    assert {f"{c}_micro" for c in window_fields.AGENT_SIGNAL_COLUMNS} <= {f.name for f in AGGREGATE}
    assert {f"{c}_mean" for c in window_fields.AGENT_SIGNAL_COLUMNS} <= {f.name for f in RECORD}
    assert set(window_fields.KV_COLUMNS) <= set(field_names("node"))
