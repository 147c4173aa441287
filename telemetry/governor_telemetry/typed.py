"""Typed columns: a columnar message's column as one little-endian array, not a JSON array of values.

In a columnar message (:mod:`governor_telemetry.columnar`) a column is a JSON
array: the worker parses one Python object per value and then checks the
type of every one.  A *typed* message is a frame: a short JSON header that
says each column's type once, then the columns' values as raw little-endian
arrays, which the worker reads with ``numpy.frombuffer`` (no parse, no copy
per value) and checks by range, not by type::

    b"GTC1" | header length (uint32 LE) | header (JSON) | payload (the arrays)

    header: {"schema_version": 1, "kind": "columns", "source": "node-17", "sent_ms": 1700000000000,
             "request": {"ttft_ms": {"t": "f8", "n": 100, "at": 0, "absent": 800},
                         "status": {"t": "str", "n": 100, "at": 900, "vocab": ["ok", "error"]},
                         "request_id": ["r1", "r2", ...]}}

A typed column is ``{"t", "n", "at"}`` (type, rows, byte offset of its values
in the payload), ``absent`` (offset of one byte per row, 1: the row does not
carry the field; left out: every row does) and, for ``str``, ``vocab`` (its
distinct values; each row's value is a uint16 code into it).  ``t`` is one of
:data:`ITEM_BYTES`: ``f8``/``f4`` floats, ``i8``/``i4`` signed ints, ``b1``
bools (a byte each: 0 false, 1 true), ``str``.  A column may also be a JSON
array, as in a columnar message.  What breaks the layout -- an unknown ``t``,
a range past the payload, a code past its vocabulary, an ``absent`` byte
other than 0 or 1 -- makes the whole message unusable
(:class:`~governor_telemetry.records.EnvelopeError`); a value that breaks a
record rule (a negative latency, a NaN, a non-string in ``vocab``, a bool
byte of 2) is its row's fault, and the row is dead-lettered alone, with the
reason :func:`~governor_telemetry.records.validate_record` gives the same
row sent as a record.

The encoder (:func:`typed_column`) types a column only where that is exact:
all ints (``i4`` when they fit), all floats (``f4`` when every value survives
the round trip), all bools, or strings of few distinct values; anything else
(a column of mixed types, lists, ints past int64, strings mostly distinct)
stays a JSON array.

>>> payload = bytearray()
>>> spec = typed_column([3, None, 5], payload)
>>> spec["t"], parse_typed(spec, "c", bytes(payload)).tolist()
('i4', [3, None, 5])
>>> parse_typed(typed_column(["ok", "ok", "ok", "error"], payload), "s", bytes(payload)).tolist()
['ok', 'ok', 'ok', 'error']
>>> typed_column([1, 2.5], payload) is None  # an int and a float: kept a JSON array (exact either way)
True
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from typing import Any, NamedTuple

from governor_telemetry.records import EnvelopeError, show

__all__ = ["FORMATS", "ITEM_BYTES", "MAGIC", "TypedColumn", "frame", "parse_typed", "split_frame", "typed_column"]

#: The first bytes of a typed message (JSON never starts so); then the header's length, uint32 LE.
MAGIC = b"GTC1"

#: A typed column's ``t`` and the bytes of one value (``str``: its uint16 code).
ITEM_BYTES = {"f8": 8, "f4": 4, "i8": 8, "i4": 4, "b1": 1, "str": 2}
# array module type codes of each ``t`` (little-endian on the wire; swapped on a big-endian host).
_ARRAY = {"f8": "d", "f4": "f", "i8": "q", "i4": "i", "b1": "B", "str": "H"}
#: Each ``t``'s value as a struct format (also a numpy dtype), little-endian.
FORMATS = {t: "<" + code for t, code in _ARRAY.items()}
_HEAD = struct.Struct("<I")  # the header's length, after MAGIC
_KEYS = frozenset({"t", "n", "at", "absent", "vocab"})
_INT32 = 2**31
_INT64 = 2**63
#: The most distinct values a ``str`` column's vocabulary holds (its codes are uint16).
MAX_VOCAB = 65_536
_MAX_ROWS = 65_536  # columnar.MAX_COLUMN_ROWS
_SCALARS = frozenset({str, int, float, bool, type(None)})


class TypedColumn(NamedTuple):
    """A typed column, layout checked: ``n`` values of type ``t`` in ``data`` (little-endian).

    ``absent``: one byte per row (1: the row does not carry the field), or None
    (every row does); ``vocab``: a ``str`` column's distinct values.  (A named
    tuple: a message makes a dozen, and a tuple is the cheapest to make.)
    """

    t: str
    n: int
    data: bytes
    absent: bytes | None = None
    vocab: tuple[Any, ...] = ()

    def value(self, i: int) -> Any:
        """Row ``i``'s value as a row record would carry it (None: absent)."""
        if self.absent is not None and self.absent[i]:
            return None
        size = ITEM_BYTES[self.t]
        (raw,) = struct.unpack_from(FORMATS[self.t], self.data, i * size)
        if self.t == "str":
            return self.vocab[raw]
        if self.t == "b1":
            return bool(raw) if raw <= 1 else raw  # a byte of 2: an int, the row's type error
        return raw

    def tolist(self) -> list[Any]:
        """Every row's value (None: absent)."""
        vals = _array(self.t, self.data).tolist()
        if self.t == "str":
            vals = [self.vocab[c] for c in vals]
        elif self.t == "b1":
            vals = [bool(v) if v <= 1 else v for v in vals]
        if self.absent is not None:
            vals = [None if a else v for v, a in zip(vals, self.absent, strict=True)]
        return vals


def frame(header: bytes, payload: bytes | bytearray) -> bytes:
    """A typed message: MAGIC, the header's length, the (JSON) header, the payload."""
    return b"".join((MAGIC, _HEAD.pack(len(header)), header, payload))


def split_frame(raw: bytes) -> tuple[bytes, bytes]:
    """A typed message's (header, payload), the frame checked; raises :class:`EnvelopeError`.

    >>> split_frame(MAGIC + bytes([200, 0, 0, 0]) + b"{}")
    Traceback (most recent call last):
    ...
    governor_telemetry.records.EnvelopeError: typed message: a header of 200 bytes in a message of 10
    """
    if len(raw) < 8:
        raise EnvelopeError(f"typed message: {len(raw)} bytes, shorter than its frame")
    (size,) = _HEAD.unpack_from(raw, 4)
    if 8 + size > len(raw):
        raise EnvelopeError(f"typed message: a header of {size} bytes in a message of {len(raw)}")
    return raw[8 : 8 + size], raw[8 + size :]


def _array(t: str, data: bytes) -> array[Any]:
    arr = array(_ARRAY[t], data)
    if sys.byteorder == "big":
        arr.byteswap()
    return arr


def _put(arr: array[Any], payload: bytearray) -> int:
    """Append ``arr`` little-endian to ``payload`` (8-byte aligned); its offset."""
    if sys.byteorder == "big":
        arr = array(arr.typecode, arr)
        arr.byteswap()
    payload += bytes(-len(payload) % 8)
    at = len(payload)
    payload += arr.tobytes()
    return at


def _offset(value: Any, what: str, size: int, payload: bytes) -> bytes:
    """The ``size`` bytes at offset ``value`` of the payload (checked to lie inside it)."""
    if type(value) is not int or value < 0 or value + size > len(payload):
        raise EnvelopeError(f"columns: typed column {what} must be an offset in the payload of {len(payload)} bytes")
    return payload[value : value + size]


def parse_typed(spec: dict[str, Any], name: str, payload: bytes) -> TypedColumn:
    """A typed column's layout, checked (``name``: for the error); raises :class:`EnvelopeError`.

    >>> parse_typed({"t": "i8", "n": 2, "at": 0}, "ts_ms", bytes(12))
    Traceback (most recent call last):
    ...
    governor_telemetry.records.EnvelopeError: columns: typed column ts_ms.at must be an offset in the payload of 12 bytes
    """
    if not spec.keys() <= _KEYS:
        extra = sorted(str(k) for k in spec if k not in _KEYS)
        raise EnvelopeError(f"columns: typed column {show(name)} has unknown key {show(extra[0])}")
    t, n = spec.get("t"), spec.get("n")
    if type(t) is not str or t not in ITEM_BYTES:
        raise EnvelopeError(f"columns: typed column {show(name)} has type {show(t)} (types: {', '.join(ITEM_BYTES)})")
    if type(n) is not int or not 0 <= n <= _MAX_ROWS:
        raise EnvelopeError(f"columns: typed column {name}: n must be a row count 0-{_MAX_ROWS}, got {show(n)}")
    data = _offset(spec.get("at"), f"{name}.at", n * ITEM_BYTES[t], payload)
    absent = spec.get("absent")
    if absent is not None:
        absent = _offset(absent, f"{name}.absent", n, payload)
        if absent.translate(None, b"\x00\x01"):
            raise EnvelopeError(f"columns: typed column {name}: absent bytes must be 0 or 1")
    vocab: tuple[Any, ...] = ()
    if t == "str":
        vocab = _vocab(spec.get("vocab"), name)
        if len(vocab) != 1 or data.count(0) != len(data):  # (one value: every code 0, checked in C)
            codes = _array("str", data)
            if absent is not None and absent.count(1):
                codes = array("H", (c for c, a in zip(codes, absent, strict=True) if not a))
            if codes and max(codes) >= len(vocab):
                raise EnvelopeError(f"columns: typed column {name}: code {max(codes)} past its {len(vocab)} values")
    elif "vocab" in spec:
        raise EnvelopeError(f"columns: typed column {name}: vocab is for type str, not {t}")
    return TypedColumn(t, n, data, absent, vocab)


def _vocab(value: Any, name: str) -> tuple[Any, ...]:
    if type(value) is not list or len(value) > MAX_VOCAB:
        raise EnvelopeError(f"columns: typed column {name}: vocab must be an array of at most {MAX_VOCAB} values")
    if not set(map(type, value)) <= _SCALARS:
        raise EnvelopeError(f"columns: typed column {name}: vocab holds a value that is no JSON scalar")
    if len(set(value)) != len(value):  # (1, 1.0 and true are one value here)
        raise EnvelopeError(f"columns: typed column {name}: vocab values must be distinct")
    return tuple(value)


def typed_column(col: Sequence[Any], payload: bytearray) -> dict[str, Any] | None:
    """``col`` (one field's values, None: absent) as a typed column whose arrays are appended to
    ``payload``, or None where typing it would not be exact or not pay (keep the JSON array): see
    the module docstring."""
    present = [v for v in col if v is not None]
    if not present:
        return None
    types = set(map(type, present))
    arr: array[Any]
    vocab = None
    if types == {bool}:
        t, arr = "b1", array("B", (v is True for v in col))
    elif types == {int}:
        low, high = min(present), max(present)
        if low < -_INT64 or high >= _INT64:
            return None
        t = "i4" if -_INT32 <= low and high < _INT32 else "i8"
        arr = array(_ARRAY[t], (0 if v is None else v for v in col))
    elif types == {float}:
        vals = [0.0 if v is None else v for v in col]
        narrow = array("f", vals)
        t, arr = ("f4", narrow) if narrow.tolist() == vals else ("f8", array("d", vals))
    elif types == {str}:
        vocab = list(dict.fromkeys(present))
        if len(vocab) * 2 > len(col) or len(vocab) > MAX_VOCAB:
            return None  # mostly distinct (request ids): a JSON array is shorter and as fast
        code = {v: i for i, v in enumerate(vocab)}
        t, arr = "str", array("H", (0 if v is None else code[v] for v in col))
    else:
        return None
    spec: dict[str, Any] = {"t": t, "n": len(col), "at": _put(arr, payload)}
    if vocab is not None:
        spec["vocab"] = vocab
    if len(present) < len(col):
        spec["absent"] = _put(array("B", (v is None for v in col)), payload)
    return spec
