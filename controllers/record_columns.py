"""The record rules of :func:`governor_telemetry.records.validate_record`, a column at a time.

A columnar telemetry message (:mod:`governor_telemetry.columnar`) carries a
section of rows per record kind as one list per field.  :func:`check_requests`
and :func:`check_gpus` apply the row rules -- types, required fields,
minimums, the realistic maxima (``records.MAXIMA``) and the int64 bound, finiteness, non-empty strings, the closed
vocabularies, the cross-field rules -- with numpy and C-speed builtins
(``set(map(type, col))``, ``max(map(len, col))``), without building a
Python object per row, and return the rows' values as float arrays for the
windows, and a mask of the rows they do not vouch for.

The mask is *sound*, not exact: every row that breaks a rule is in it, and a
few valid rows may be too (an integral float in an int field, an int past
2**53 in a float field).  The caller hands the masked rows to the per-record
path, which dead-letters the invalid ones with
:func:`~governor_telemetry.records.validate_record`'s reason (the same text a
row batch gets) and takes the valid ones as any row.

>>> cols = {"ts_ms": [5, 6], "node": ["n", "n"], "zone": ["z", "z"], "model": ["m", "m"],
...         "state": ["ready", "gone"], "gpu_util": [0.5, 0.5], "mem_used_bytes": [1, 1],
...         "mem_total_bytes": [2, 2]}
>>> check_gpus(cols, 2).suspect.tolist()
[False, True]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
from governor_telemetry.records import _BOOL, _COMPILED, _INT, _NUMBER, _STR, INT_MAX, MAX_HIST_BINS, MAX_NODE_CHARS
from governor_telemetry.typed import TypedColumn
from governor_telemetry.vocab import AGENT_PATHS, AGENT_SIGNALS, GPU_STATES, REQUEST_STATUSES

from controllers import typed_columns as typed
from controllers.window_columns import REQUEST_CLASS_CODES

__all__ = ["Checked", "check_gpus", "check_requests"]

_NONE = type(None)
_ALLOWED: dict[int, set[type]] = {_STR: {str}, _INT: {int}, _NUMBER: {int, float}, _BOOL: {bool}}
_EXACT = typed.EXACT  # numbers at or past this are not exact in float64: such rows go to the per-record path
_PATH_INDEX = {p: float(i) for i, p in enumerate(AGENT_PATHS)}
_PATHS_OR_NONE = frozenset({*AGENT_PATHS, None})


class Checked(NamedTuple):
    """A section's checked columns.

    ``suspect``: rows for the per-record path (invalid, or not vouched for).
    ``num``: every numeric and bool field present as float64 (NaN: absent or
    suspect); ``ts``: ``ts_ms`` as int64 (0 where suspect).  The string
    fields stay the lists they came as.
    """

    suspect: Any
    num: dict[str, Any]
    ts: Any


def _type_mask(col: list[Any], allowed: set[type], required: bool) -> Any:
    """Rows whose value is of no allowed type (None counts as a bad type when required)."""
    ok = allowed if required else allowed | {_NONE}
    return np.fromiter((type(v) not in ok for v in col), bool, len(col))


def _numbers(col: list[Any], types: set[type], allowed: set[type], required: bool) -> tuple[Any, Any]:
    """(float64 values with NaN for absent or badly typed rows, mask of badly typed rows)."""
    n = len(col)
    bad = np.zeros(n, bool)
    if not types <= allowed | {_NONE} or (required and _NONE in types):
        bad = _type_mask(col, allowed, required)
        col = [None if b else v for v, b in zip(col, bad.tolist(), strict=True)]
    try:
        vals = np.array(col, dtype=np.float64)
    except OverflowError:  # an int past float64's range: certainly past INT_MAX
        big = np.fromiter((type(v) is int and abs(v) > INT_MAX for v in col), bool, n)
        bad |= big
        vals = np.array([None if b else v for v, b in zip(col, big.tolist(), strict=True)], dtype=np.float64)
    return vals, bad


def _columns(cols: Mapping[str, Any], kind: str, n: int) -> tuple[Any, dict[str, Any]]:
    """The per-field rules of ``kind`` (records._check_fields) over the columns: (suspect, numbers).

    The well-typed numeric columns (the usual case) are checked together, as one matrix: a
    handful of numpy calls per section instead of a handful per field.
    """
    suspect = np.zeros(n, bool)
    num: dict[str, Any] = {}
    stack: list[list[Any]] = []  # well-typed numeric columns
    names: list[str] = []
    mins: list[float] = []
    maxes: list[float] = []
    nan_bad: list[bool] = []  # a NaN in this column is a bad row (required, or no None in it)
    for name, required, check, minimum, maximum in _COMPILED[kind]:
        col = cols.get(name)
        if col is None:
            if required:
                return np.ones(n, bool), num  # "missing field": every row
            continue
        if type(col) is TypedColumn:  # its type said once: ranges, no type scan
            bad, vals = typed.check(col, check, required, float(minimum or 0.0), float(maximum or np.inf))
            suspect |= bad
            if vals is not None:
                num[name] = vals
            continue
        first = col[0]
        # A column of one string (a batch's model, zone, node, status): one type, found in C (a
        # str equals only a str; for numbers 1 == 1.0 == True, so they are typed one by one).
        types: set[type] = {str} if type(first) is str and col.count(first) == n else set(map(type, col))
        if types == {_NONE}:
            if required:
                return np.ones(n, bool), num
            continue
        allowed = _ALLOWED[check]
        fine = types <= allowed if required else types <= allowed | {_NONE}
        if check == _STR:
            if not fine:
                suspect |= _type_mask(col, allowed, required)
            if "" in col:
                suspect |= np.fromiter((v == "" for v in col), bool, n)
            continue
        if check == _BOOL:
            if not fine:
                suspect |= _type_mask(col, allowed, required)
                col = [v if type(v) is bool else None for v in col]
            num[name] = np.array(col, dtype=np.float64)
            continue
        if fine:
            if float in types and _NONE in types and _has_nan(col):
                suspect |= np.fromiter((v != v for v in col), bool, n)  # NaN is not absent: not finite
            stack.append(col)
            names.append(name)
            mins.append(float(minimum or 0.0))
            maxes.append(float(maximum))
            nan_bad.append(required or _NONE not in types)
            continue
        vals, bad = _numbers(col, types, allowed, required)
        suspect |= bad | np.isinf(vals) | (vals < (minimum or 0.0)) | (vals > maximum) | (vals >= _EXACT)
        if float in types and _has_nan(col):
            suspect |= np.fromiter((type(v) is float and v != v for v in col), bool, n)
        num[name] = vals
    if stack:
        try:
            mat = np.array(stack, dtype=np.float64)
        except OverflowError:  # an int past float64's range: column by column
            mat = np.empty((len(stack), n))
            for i, col in enumerate(stack):
                mat[i], bad = _numbers(col, set(map(type, col)), {int, float}, False)
                suspect |= bad
        bad = np.isinf(mat) | (mat < np.array(mins)[:, None]) | (mat > np.array(maxes)[:, None]) | (mat >= _EXACT)
        if any(nan_bad):
            bad |= np.isnan(mat) & np.array(nan_bad)[:, None]
        suspect |= bad.any(axis=0)
        num.update(zip(names, mat, strict=True))
    return suspect, num


def _has_nan(col: list[Any]) -> bool:
    """Whether a column holds a float NaN (JSON cannot say one; a caller's Python floats can)."""
    total = sum(v for v in col if type(v) is float)
    return total != total


def _vocab_mask(col: list[Any] | TypedColumn, vocab: frozenset[Any]) -> Any:
    """Rows whose (str) value is not in ``vocab`` (None: no such row; rows of other types: flagged by type)."""
    if type(col) is TypedColumn:
        bad = typed.code_mask(col, lambda v: type(v) is str and v not in vocab) if col.t == "str" else None
        return bad if bad is not None and bad.any() else None
    try:
        if set(col) <= vocab:
            return None
    except TypeError:  # an unhashable value (a list): that row is already flagged by type
        pass
    return np.fromiter((type(v) is str and v not in vocab for v in col), bool, len(col))


def _node_mask(col: list[Any] | TypedColumn, n: int) -> Any:
    """Rows whose node id is longer than MAX_NODE_CHARS (non-str rows: flagged by type)."""
    if type(col) is TypedColumn:
        return typed.code_mask(col, lambda v: type(v) is str and len(v) > MAX_NODE_CHARS)
    if col.count(col[0]) == n and type(col[0]) is str:
        return np.full(n, len(col[0]) > MAX_NODE_CHARS)
    try:
        if max(map(len, col)) <= MAX_NODE_CHARS:  # in C (several messages' nodes); TypeError: no str, flagged
            return np.zeros(n, bool)
    except TypeError:
        pass
    return np.fromiter((type(v) is str and len(v) > MAX_NODE_CHARS for v in col), bool, n)


def _as_zero(arr: Any) -> Any:
    """Absent (NaN) as 0, as the per-record path reads ``rec.get(name) or 0``."""
    return np.nan_to_num(arr, nan=0.0, posinf=np.inf, neginf=-np.inf)


def _ts(col: list[Any] | TypedColumn, suspect: Any) -> Any:
    """``ts_ms`` as exact int64 (suspect rows: 0)."""
    if type(col) is TypedColumn:
        if col.t not in ("i8", "i4"):
            return np.zeros(len(suspect), np.int64)  # a float or other type: every row suspect already
        return np.where(suspect, 0, typed.values(col).astype(np.int64))
    if not suspect.any():
        try:
            return np.array(col, dtype=np.int64)
        except (OverflowError, TypeError, ValueError):
            pass
    clean = [v if type(v) is int and not s else 0 for v, s in zip(col, suspect.tolist(), strict=True)]
    return np.array(clean, dtype=np.int64)


def check_requests(cols: Mapping[str, Any], n: int) -> Checked:
    """The request rows of a columnar section: see the module docstring.

    ``num`` gets, besides the fields: ``ok`` (status is ``ok``, 1.0/0.0),
    ``request_class`` (its :data:`REQUEST_CLASS_CODES` code, 0: none or
    unknown) and ``agent_path`` (the :data:`AGENT_PATHS` index, NaN: none).

    >>> cols = {"request_id": ["a", "b"], "ts_ms": [1, 2], "model": ["m", "m"], "zone": ["z", "z"],
    ...         "node": ["n", "n"], "ttft_ms": [5.0, -1.0], "e2e_ms": [9.0, 9.0], "status": ["ok", "ok"]}
    >>> c = check_requests(cols, 2); c.suspect.tolist(), c.num["ok"].tolist()
    ([False, True], [1.0, 1.0])
    """
    suspect, num = _columns(cols, "request", n)
    if suspect.all():
        return Checked(suspect, num, np.zeros(n, np.int64))
    node_bad = _node_mask(cols["node"], n)
    suspect |= node_bad
    status = cols["status"]
    bad = _vocab_mask(status, REQUEST_STATUSES)
    if bad is not None:
        suspect |= bad
    if type(status) is TypedColumn:
        num["ok"] = typed.lookup(status, lambda v: float(v == "ok"), 0.0)
    elif status.count("ok") == n:
        num["ok"] = np.ones(n)
    else:
        num["ok"] = (np.array(status, dtype=object) == "ok").astype(np.float64)
    suspect |= num["e2e_ms"] + 1e-6 < num["ttft_ms"]
    # Agent signals: all three or none, each at most 1 (the minimum 0 is checked above); a known path.
    signals = [num.get(name) for name in AGENT_SIGNALS]
    if any(s is not None for s in signals):
        full = [np.full(n, np.nan) if s is None else s for s in signals]
        carried = [~np.isnan(s) for s in full]
        given = [_given(cols.get(nm), n) for nm in AGENT_SIGNALS]
        # A row whose value was refused by type shows as NaN: the type check flagged it already.
        suspect |= (given[0] != given[1]) | (given[0] != given[2])
        with np.errstate(invalid="ignore"):
            for s, c in zip(full, carried, strict=True):
                suspect |= c & (s > 1.0)
        for name, s in zip(AGENT_SIGNALS, full, strict=True):
            num[name] = s
    path = cols.get("agent_path")
    if path is not None and _given(path, n).any():
        bad = _vocab_mask(path, _PATHS_OR_NONE)
        if bad is not None:
            suspect |= bad
        if type(path) is TypedColumn:
            num["agent_path"] = typed.lookup(path, lambda v: _PATH_INDEX.get(v, np.nan), np.nan)
        else:
            num["agent_path"] = np.array(
                [_PATH_INDEX.get(v, np.nan) if type(v) is str else np.nan for v in path], dtype=np.float64
            )
    klass = cols.get("request_class")
    if klass is not None:
        get = REQUEST_CLASS_CODES.get
        if type(klass) is TypedColumn:
            num["request_class"] = typed.lookup(klass, lambda v: float(get(v, 0)) if type(v) is str else 0.0, 0.0)
        elif klass.count(klass[0]) == n and type(klass[0]) is str:
            num["request_class"] = np.full(n, float(get(klass[0], 0)))
        else:
            num["request_class"] = np.array([get(v, 0) if type(v) is str else 0 for v in klass], dtype=np.float64)
    return Checked(suspect, num, _ts(cols["ts_ms"], suspect))


def check_gpus(cols: Mapping[str, Any], n: int) -> Checked:
    """The GPU rows of a columnar section: see the module docstring."""
    suspect, num = _columns(cols, "gpu", n)
    if suspect.all():
        return Checked(suspect, num, np.zeros(n, np.int64))
    suspect |= _node_mask(cols["node"], n)
    bad = _vocab_mask(cols["state"], GPU_STATES)
    if bad is not None:
        suspect |= bad
    with np.errstate(invalid="ignore"):
        suspect |= num["gpu_util"] > 1.0
        suspect |= num["mem_used_bytes"] > num["mem_total_bytes"]
        used, total = (_as_zero(num.get(k, np.zeros(n))) for k in ("kv_blocks_used", "kv_blocks_total"))
        suspect |= (used > total) & (total > 0)
        if "fragmentation_ratio" in num:
            suspect |= num["fragmentation_ratio"] > 1.0
    hists = cols.get("free_block_hist")
    if type(hists) is TypedColumn:  # lists of ints sent as a typed column: every carried row refused below
        hists = hists.tolist()
    if hists is not None and hists.count(None) != n:
        suspect |= np.fromiter((h is not None and not _hist_ok(h) for h in hists), bool, n)
    return Checked(suspect, num, _ts(cols["ts_ms"], suspect))


def _given(col: list[Any] | TypedColumn | None, n: int) -> Any:
    """Rows that carry the field."""
    if col is None:
        return np.zeros(n, bool)
    if type(col) is TypedColumn:
        return ~typed.absent(col)
    return np.fromiter((v is not None for v in col), bool, n)


def _hist_ok(hist: Any) -> bool:
    """records.validate_record's free_block_hist rule (per GPU row: a sample's histogram is a list)."""
    return (
        isinstance(hist, list)
        and len(hist) <= MAX_HIST_BINS
        and all((type(v) is int or (type(v) is float and v.is_integer())) and 0 <= v <= INT_MAX for v in hist)
    )
