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

Why JSON arrays and not a binary layout: measured in ``governor bench
pipeline`` (docs/benchmarks.md), decoding is a small share of the worker's
time per message once records are not dicts; JSON keeps the producer at
orjson alone and the dead letters readable.

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

__all__ = [
    "MAX_COLUMN_ROWS",
    "SECTIONS",
    "ColumnBatch",
    "Section",
    "decode_columns",
    "decode_message",
    "encode_columns",
]

#: The most rows a columnar message may carry (all sections together); a
#: producer's batch is a few hundred.
MAX_COLUMN_ROWS = 65_536
#: The record kinds a columnar message may carry, one section each.
SECTIONS = ("request", "gpu")
# Envelope keys besides the sections.
_HEADER = frozenset({"schema_version", "kind", "source", "sent_ms"})
# Said by the envelope (the section and its schema_version), never a column.
_NOT_COLUMNS = ("kind", "schema_version")


@dataclass(frozen=True)
class Section:
    """The rows of one record kind: ``n`` rows, ``cols[field][i]`` is row ``i``'s value (None: absent)."""

    kind: str
    n: int
    cols: dict[str, list[Any]]

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` as the record a row batch would carry (only for rows that need one: dead letters)."""
        rec: dict[str, Any] = {"kind": self.kind}
        for name, col in self.cols.items():
            v = col[i]
            if v is not None:
                rec[name] = v
        return rec


@dataclass(frozen=True)
class ColumnBatch:
    """A decoded columnar message (structure checked, values not)."""

    source: Any
    sections: dict[str, Section]

    def rows(self) -> int:
        return sum(s.n for s in self.sections.values())


def encode_columns(records: Sequence[Mapping[str, Any]], source: str, sent_ms: int) -> bytes:
    """The columnar message of ``records`` (request and GPU records, in any mix).

    Row order within a kind is kept.  Raises ``ValueError`` for a record the
    columns cannot carry: not a request or GPU record, or one with its own
    ``schema_version`` other than the envelope's.
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
    for kind, rows in by_kind.items():
        names: dict[str, None] = {}
        for rec in rows:
            names.update(dict.fromkeys(rec))
        env[kind] = {name: [rec.get(name) for rec in rows] for name in names if name not in ("kind", "schema_version")}
    return orjson.dumps(env)


def decode_columns(obj: Mapping[str, Any]) -> ColumnBatch:
    """Check the structure of a decoded ``kind: columns`` envelope; raises :class:`EnvelopeError`.

    >>> decode_columns({"schema_version": 1, "kind": "columns", "request": {"ts_ms": [1, 2], "zone": ["a"]}})
    Traceback (most recent call last):
    ...
    governor_telemetry.records.EnvelopeError: columns: request column 'zone' has 1 values, 'ts_ms' has 2
    """
    version = obj.get("schema_version")
    if not _supported(version):
        raise EnvelopeError(f"unsupported envelope schema_version {show(version)}")
    extra = sorted(str(k) for k in obj if k not in _HEADER and k not in SECTIONS)
    if extra:
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
        for name, col in cols.items():
            if name in _NOT_COLUMNS:
                raise EnvelopeError(f"columns: {kind} column {name!r} is not allowed (the envelope says it)")
            if not isinstance(col, list):
                raise EnvelopeError(f"columns: {kind} column {show(name)} must be an array, got {type(col).__name__}")
            if n is None:
                n, first = len(col), name
            elif len(col) != n:
                raise EnvelopeError(f"columns: {kind} column {show(name)} has {len(col)} values, {first!r} has {n}")
        if not n:  # no column, or empty columns: no rows
            continue
        total += n
        if total > MAX_COLUMN_ROWS:
            raise EnvelopeError(f"columns: more than {MAX_COLUMN_ROWS} rows in one message")
        sections[kind] = Section(kind, n, cols)
    return ColumnBatch(obj.get("source"), sections)


def decode_message(raw: bytes | str | Any) -> list[Any] | ColumnBatch:
    """A telemetry message of either encoding: its records (row batch or bare record) or its columns.

    Raises :class:`EnvelopeError` when the message is unusable as a whole.
    """
    obj = parse_message(raw)
    if isinstance(obj, dict) and obj.get("kind") == "columns":
        return decode_columns(obj)
    return decode_envelope(obj)
