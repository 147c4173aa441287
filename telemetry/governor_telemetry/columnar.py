"""The columnar telemetry envelope: a batch's records as one array per field.

A row batch (:func:`governor_telemetry.records.encode_envelope`) carries one
JSON object per record, and the worker builds a Python dict per record to
read it.  A columnar batch carries the same records as columns, so the
worker checks and aggregates them with numpy, a column at a time, and builds
a Python object only for a record that fails a check (its dead letter).
Both encodings are accepted on the same topic; the producer picks one
(``TelemetryProducer(..., encoding="columns")``).

Envelope (JSON, orjson-encoded)::

    {"schema_version": 1, "kind": "columns", "source": "node-17", "sent_ms": 1700000000000,
     "request": {"request_id": ["r1", "r2"], "ts_ms": [1700000000000, 1700000000005],
                 "ttft_ms": [120.5, 98.0], "itl_ms": [40.0, null], ...},
     "gpu": {"ts_ms": [1700000000000], "node": ["n1"], "state": ["ready"], ...}}

``request`` and ``gpu`` are optional sections, each a JSON object of equal
length arrays named after the fields of
:data:`governor_telemetry.records.REQUEST_FIELDS` / ``GPU_FIELDS`` (row ``i``
of a section is the record made of every column's ``i``-th value).  ``null``
is a field the record does not carry; a column no record carries may be left
out.  The rules a row record follows (types, required fields, minimums,
vocabularies) hold for every row, and a row that breaks one is dead-lettered
alone with the reason :func:`~governor_telemetry.records.validate_record`
gives for it.  What makes the whole message unusable -- a column that is not
an array, columns of different lengths, more than :data:`MAX_COLUMN_ROWS`
rows, a ``kind`` or ``schema_version`` column (the envelope says them), an
unknown section -- raises :class:`~governor_telemetry.records.EnvelopeError`
(one dead letter for the message).

A *typed* message (:mod:`governor_telemetry.typed`, ``encoding="typed"``,
:func:`encode_typed`) is the same envelope as a frame: a JSON header where
each column says its type once, then the values as raw little-endian
arrays, which the worker reads without parsing or type-checking a Python
object per value (typed and array columns mix in one section).  Measured in
``governor bench pipeline`` (docs/benchmarks.md).  A worker older than typed
messages dead-letters them ("not JSON"): upgrade workers before producers.

>>> recs = [{"kind": "gpu", "ts_ms": 5, "node": "n1", "zone": "az-a", "model": "m", "state": "ready",
...          "gpu_util": 0.5, "mem_used_bytes": 1, "mem_total_bytes": 2}]
>>> batch = decode_columns(orjson.loads(encode_columns(recs, "node-1", 7)))
>>> batch.sections["gpu"].n, batch.sections["gpu"].cols["node"], batch.rows()
(1, ['n1'], 1)
>>> batch.sections["gpu"].row(0) == recs[0]
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from governor_telemetry.records import (
    SCHEMA_VERSION,
    EnvelopeError,
    _supported,
    decode_envelope,
    parse_message,
    show,
)
from governor_telemetry.typed import MAGIC, TypedColumn, frame, parse_typed, split_frame, typed_column

__all__ = [
    "MAX_COLUMN_ROWS",
    "SECTIONS",
    "ColumnBatch",
    "Section",
    "decode_columns",
    "decode_message",
    "decode_typed",
    "encode_columns",
    "encode_typed",
]

#: The most rows a columnar message may carry (all sections together); a
#: producer's batch is a few hundred.
MAX_COLUMN_ROWS = 65_536
#: The record kinds a columnar message may carry, one section each.
SECTIONS = ("request", "gpu")
# Envelope keys besides the sections.
_HEADER = frozenset({"schema_version", "kind", "source", "sent_ms"})
_KEYS = _HEADER | frozenset(SECTIONS)
# Said by the envelope (the section and its schema_version), never a column.
_NOT_COLUMNS = ("kind", "schema_version")


@dataclass(frozen=True)
class Section:
    """The rows of one record kind: ``n`` rows, ``cols[field][i]`` is row ``i``'s value (None: absent);
    a typed column is a :class:`~governor_telemetry.typed.TypedColumn` (:meth:`column`: as a list)."""

    kind: str
    n: int
    cols: dict[str, list[Any] | TypedColumn]

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` as the record a row batch would carry (only for rows that need one: dead letters)."""
        rec: dict[str, Any] = {"kind": self.kind}
        for name, col in self.cols.items():
            v = col.value(i) if type(col) is TypedColumn else col[i]
            if v is not None:
                rec[name] = v
        return rec

    def column(self, name: str) -> list[Any] | None:
        """Column ``name`` as a list of values (None: no such column)."""
        col = self.cols.get(name)
        return col.tolist() if isinstance(col, TypedColumn) else col


@dataclass(frozen=True)
class ColumnBatch:
    """A decoded columnar message (structure checked, values not); ``encoding``: columns or typed."""

    source: Any
    sections: dict[str, Section]
    encoding: str = "columns"

    def rows(self) -> int:
        return sum(s.n for s in self.sections.values())


def encode_columns(records: Sequence[Mapping[str, Any]], source: str, sent_ms: int, typed: bool = False) -> bytes:
    """The columnar message of ``records`` (request and GPU records, in any mix).

    Row order within a kind is kept.  Raises ``ValueError`` for a record the
    columns cannot carry: not a request or GPU record, or one with its own
    ``schema_version`` other than the envelope's.  ``typed``: a typed message
    (:mod:`governor_telemetry.typed`), each column that
    :func:`~governor_telemetry.typed.typed_column` types exactly typed.
    """
    by_kind: dict[str, list[Mapping[str, Any]]] = {}
    for rec in records:
        kind = rec.get("kind")
        if kind not in SECTIONS:
            raise ValueError(f"a columnar batch carries request and gpu records, not kind {show(kind)}")
        version = rec.get("schema_version", SCHEMA_VERSION)
        if version != SCHEMA_VERSION or isinstance(version, bool):
            raise ValueError(f"a columnar batch is schema_version {SCHEMA_VERSION}, a record says {show(version)}")
        by_kind.setdefault(kind, []).append(rec)
    env: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "kind": "columns", "source": source, "sent_ms": sent_ms}
    payload = bytearray()
    for kind, rows in by_kind.items():
        names: dict[str, None] = {}
        for rec in rows:
            names.update(dict.fromkeys(rec))
        cols: dict[str, Any] = {
            name: [rec.get(name) for rec in rows] for name in names if name not in ("kind", "schema_version")
        }
        if typed:
            cols = {name: typed_column(col, payload) or col for name, col in cols.items()}
        env[kind] = cols
    if not typed:
        return orjson.dumps(env)
    return frame(orjson.dumps(env), payload)


def encode_typed(records: Sequence[Mapping[str, Any]], source: str, sent_ms: int) -> bytes:
    """:func:`encode_columns` with typed columns (``TelemetryProducer(..., encoding="typed")``).

    >>> recs = [{"kind": "request", "request_id": f"r{i}", "ts_ms": 5 + i, "model": "m", "zone": "z",
    ...          "node": "n", "ttft_ms": 1.5, "e2e_ms": 9.0, "status": "ok"} for i in range(3)]
    >>> batch = decode_message(encode_typed(recs, "node-1", 7))
    >>> [batch.sections["request"].row(i) for i in range(3)] == recs
    True
    """
    return encode_columns(records, source, sent_ms, typed=True)


def decode_columns(obj: Mapping[str, Any], payload: bytes | None = None) -> ColumnBatch:
    """Check the structure of a decoded ``kind: columns`` envelope; raises :class:`EnvelopeError`.
    ``payload``: a typed message's arrays (its typed columns' ``at`` and ``absent`` are offsets into it).

    >>> decode_columns({"schema_version": 1, "kind": "columns", "request": {"ts_ms": [1, 2], "zone": ["a"]}})
    Traceback (most recent call last):
    ...
    governor_telemetry.records.EnvelopeError: columns: request column 'zone' has 1 values, 'ts_ms' has 2
    """
    version = obj.get("schema_version")
    if not _supported(version):
        raise EnvelopeError(f"unsupported envelope schema_version {show(version)}")
    if not obj.keys() <= _KEYS:
        extra = sorted(str(k) for k in obj if k not in _KEYS)
        raise EnvelopeError(f"columns: unknown section {show(extra[0])} (sections are {', '.join(SECTIONS)})")
    sections: dict[str, Section] = {}
    total = 0
    for kind in SECTIONS:
        cols = obj.get(kind)
        if cols is None:
            continue
        if not isinstance(cols, dict):
            raise EnvelopeError(f"columns: section {kind!r} must be an object of arrays, got {type(cols).__name__}")
        n: int | None = None
        first = ""
        taken: dict[str, list[Any] | TypedColumn] = {}
        for name, col in cols.items():
            if name in _NOT_COLUMNS:
                raise EnvelopeError(f"columns: {kind} column {name!r} is not allowed (the envelope says it)")
            if isinstance(col, dict) and payload is not None:
                col = parse_typed(col, name, payload)
                size = col.n
            elif isinstance(col, list):
                size = len(col)
            else:
                typed = " or a typed column" if payload is not None else ""
                raise EnvelopeError(
                    f"columns: {kind} column {show(name)} must be an array{typed}, got {type(col).__name__}"
                )
            if n is None:
                n, first = size, name
            elif size != n:
                raise EnvelopeError(f"columns: {kind} column {show(name)} has {size} values, {first!r} has {n}")
            taken[name] = col
        if not n:  # no column, or empty columns: no rows
            continue
        total += n
        if total > MAX_COLUMN_ROWS:
            raise EnvelopeError(f"columns: more than {MAX_COLUMN_ROWS} rows in one message")
        sections[kind] = Section(kind, n, taken)
    return ColumnBatch(obj.get("source"), sections, "columns" if payload is None else "typed")


def decode_message(raw: bytes | str | Any) -> list[Any] | ColumnBatch:
    """A telemetry message of either encoding: its records (row batch or bare record) or its columns.

    Raises :class:`EnvelopeError` when the message is unusable as a whole.
    """
    if type(raw) is bytes and raw[:4] == MAGIC:
        return decode_typed(raw)
    obj = parse_message(raw)
    if isinstance(obj, dict) and obj.get("kind") == "columns":
        return decode_columns(obj)
    return decode_envelope(obj)


def decode_typed(raw: bytes) -> ColumnBatch:
    """A typed message (:mod:`governor_telemetry.typed`): its header checked as a columnar envelope, its
    typed columns' ranges inside the payload; raises :class:`EnvelopeError`."""
    header, payload = split_frame(raw)
    obj = parse_message(header)
    if not isinstance(obj, dict) or obj.get("kind") != "columns":
        raise EnvelopeError("typed message: the header must be a kind: columns envelope")
    return decode_columns(obj, payload)
