"""Fuzz the typed window-record decoder: whatever arrives on the metrics topic,
:func:`controllers.window_record.decode_window` returns a record or raises
:class:`WindowRecordError` -- never anything else (issue #13, item 6a)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controllers.window_record import WindowRecord, WindowRecordError, decode_window

FIELDS = [*WindowRecord.__dataclass_fields__, "kind", "schema_version", "bogus"]
VALID = {"scope": "node", "model": "m", "zone": "az-a", "node": "n1", "window_end_ms": 20_000, "window_s": 10.0}

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # past int64 and float range too: only orjson's loads bounds them
    | st.floats()
    | st.text(max_size=300)
)
_json = st.recursive(
    _scalars,
    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=10), kids, max_size=5),
    max_leaves=20,
)


def _decodes_or_refuses(obj: Any) -> None:
    try:
        rec = decode_window(obj)
    except WindowRecordError as exc:
        assert str(exc).split(":", 1)[0]  # the message names the field
        assert len(str(exc)) < 2000
        return
    assert decode_window(rec.to_dict()) == rec


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_window_record_error(raw: bytes) -> None:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return
    _decodes_or_refuses(obj)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_json)
def test_arbitrary_json_values_decode_or_raise_window_record_error(obj: Any) -> None:
    _decodes_or_refuses(obj)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(FIELDS), _json, max_size=6), st.sampled_from(["zone", "node"]))
def test_forged_shapes_of_a_window_decode_or_raise_window_record_error(changes: dict[str, Any], scope: str) -> None:
    _decodes_or_refuses({**VALID, "scope": scope, **changes})


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FIELDS), st.integers(1, 1020))
def test_deeply_nested_values_raise_window_record_error(name: str, depth: int) -> None:
    deep = orjson.loads(b"[" * depth + b"1" + b"]" * depth)
    _decodes_or_refuses({**VALID, name: deep})
    _decodes_or_refuses({**VALID, name: {"rag": deep}})


def test_a_window_without_window_end_ms_is_refused_not_a_key_error() -> None:
    obj = {k: v for k, v in VALID.items() if k != "window_end_ms"}
    try:
        decode_window(obj)
    except WindowRecordError as exc:
        assert str(exc) == "window_end_ms: missing"
    else:
        raise AssertionError("decoded a window without window_end_ms")
