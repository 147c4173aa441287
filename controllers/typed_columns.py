"""Typed columns (:mod:`governor_telemetry.typed`) read with numpy: values, absent rows, codes, joins.

A typed column says its type once: the record rules that a JSON array's
values need a per-value type scan for are here a check of the column's type
and of its values' ranges (:func:`check`), and a ``str`` column's rules are
checked once per distinct value (:func:`code_mask`), not once per row.  The
layout was checked when the message was decoded (every code within its
vocabulary, absent bytes 0 or 1); nothing here trusts more than that.

>>> from governor_telemetry.typed import parse_typed, typed_column
>>> payload = bytearray()
>>> col = parse_typed(typed_column([1.5, None, -2.0], payload), "ttft_ms", bytes(payload))
>>> values(col).tolist()[0], absent(col).tolist()
(1.5, [False, True, False])
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from governor_telemetry.records import _BOOL, _INT, _STR  # the record rules' check codes
from governor_telemetry.typed import FORMATS, ITEM_BYTES, MAX_VOCAB, TypedColumn

__all__ = ["EXACT", "absent", "check", "code_mask", "codes", "join", "latest_ts", "lookup", "values"]

_DTYPE = {t: np.dtype(f) for t, f in FORMATS.items()}
_U2 = struct.Struct(FORMATS["str"])
_INTS = frozenset({"i8", "i4"})
_NUMBERS = frozenset({"i8", "i4", "f8", "f4"})
#: Numbers at or past this are not exact in float64: such rows go to the per-record path.
EXACT = 2.0**53


def values(col: TypedColumn) -> Any:
    """The column's values as stored (absent rows: whatever the producer wrote there)."""
    return np.frombuffer(col.data, _DTYPE[col.t])


def absent(col: TypedColumn) -> Any:
    """Rows that do not carry the field."""
    if col.absent is None:
        return np.zeros(col.n, bool)
    return np.frombuffer(col.absent, np.uint8).view(bool)


def check(col: TypedColumn, kind: int, required: bool, minimum: float, maximum: float) -> tuple[Any, Any]:
    """(rows a record rule refuses or that are not vouched for, values as float64 with NaN where absent;
    None for a ``str`` field).  A column of the wrong type refuses every row that carries it (the
    per-record path then gives each its reason, or takes an integral float in an int field)."""
    gone = absent(col)
    carried = ~gone
    bad = gone.copy() if required else np.zeros(col.n, bool)
    if kind == _STR:
        if col.t != "str":
            return bad | carried, None
        return bad | (code_mask(col, lambda v: type(v) is not str or v == "") & carried), None
    fits = col.t == "b1" if kind == _BOOL else col.t in (_INTS if kind == _INT else _NUMBERS)
    if not fits:
        return bad | carried, np.full(col.n, np.nan)
    raw = values(col)
    vals = raw.astype(np.float64)
    with np.errstate(invalid="ignore"):
        if kind == _BOOL:
            wrong = raw > 1  # a byte of 2: no bool
        else:
            wrong = ~np.isfinite(vals) | (vals < minimum) | (vals > maximum) | (np.abs(vals) >= EXACT)
    bad |= wrong & carried
    if col.absent is not None:
        vals[gone] = np.nan
    return bad, vals


def code_mask(col: TypedColumn, refused: Callable[[Any], bool]) -> Any:
    """Rows of a ``str`` column whose value ``refused`` says yes to (checked once per distinct value)."""
    bad = [i for i, v in enumerate(col.vocab) if refused(v)]
    if not bad:
        return np.zeros(col.n, bool)
    return np.isin(values(col), bad) & ~absent(col)


def lookup(col: TypedColumn, table: Callable[[Any], float], missing: float) -> Any:
    """A ``str`` column mapped through ``table`` (one call per distinct value) as float64; absent rows
    and any column of another type: ``missing``."""
    if col.t != "str" or not col.vocab:
        return np.full(col.n, missing)
    out = np.array([table(v) for v in col.vocab], dtype=np.float64)[_safe_codes(col)]
    if col.absent is not None:
        out[absent(col)] = missing
    return out


def codes(col: TypedColumn) -> tuple[Any, list[Any]]:
    """(int64 code per row, -1 where absent or not a string; the vocabulary the codes index)."""
    if col.t != "str":
        return np.full(col.n, -1, np.int64), []
    out = values(col).astype(np.int64)
    out[code_mask(col, lambda v: type(v) is not str) | absent(col)] = -1
    return out, list(col.vocab)


def _safe_codes(col: TypedColumn) -> Any:
    """The codes, with absent rows' (unchecked) codes as 0."""
    raw = values(col)
    return raw if col.absent is None else np.where(absent(col), 0, raw)


def latest_ts(col: TypedColumn) -> int | None:
    """The latest ``ts_ms`` of a typed column (None: an absent row, or not a finite number)."""
    if col.t not in _NUMBERS or col.absent is not None and absent(col).any() or not col.n:
        return None
    last = values(col).max()
    if col.t in _INTS:
        return int(last)
    return math.ceil(last) if math.isfinite(last) else None


def join(parts: Sequence[Any], sizes: Sequence[int]) -> TypedColumn | None:
    """Typed columns of consecutive sections as one (None parts: a section without the column, its rows
    absent); None when a part is a JSON array, the parts' types differ or a joined vocabulary passes
    uint16 (join them as lists)."""
    if any(p is not None and type(p) is not TypedColumn for p in parts):
        return None
    kinds = {p.t for p in parts if p is not None}
    if len(kinds) != 1:
        return None
    (t,) = kinds
    n = sum(sizes)
    mask = None
    if any(p is None or p.absent is not None for p in parts):
        mask = b"".join(b"\x01" * k if p is None else p.absent or bytes(k) for p, k in zip(parts, sizes, strict=True))
    size = ITEM_BYTES[t]
    if t != "str":  # the bytes are the values already: joined in C
        return TypedColumn(
            t, n, b"".join(bytes(k * size) if p is None else p.data for p, k in zip(parts, sizes, strict=True)), mask
        )
    index: dict[tuple[type, Any], int] = {}  # keyed by type too: 1, 1.0 and true stay three values
    pieces = []
    for p, k in zip(parts, sizes, strict=True):
        if p is None or not p.vocab:
            pieces.append(bytes(k * size))
            continue
        remap = [index.setdefault((type(v), v), len(index)) for v in p.vocab]
        if remap == list(range(len(remap))):  # the first part's vocabulary, or the same: codes as they are
            pieces.append(p.data)
        elif len(remap) == 1:  # one value (a message's model, zone, node): one code
            pieces.append(_U2.pack(remap[0]) * k)
        else:
            pieces.append(np.asarray(remap, "<u2")[_safe_codes(p)].tobytes())
    if len(index) > MAX_VOCAB:
        return None
    return TypedColumn(t, n, b"".join(pieces), mask, tuple(v for _, v in index))
