"""Plain-data snapshots: the shared rules of every ``to_state`` / ``from_state``.

State that crosses a restart (Redis, files) is *plain data*: ``dict``, ``list``,
``str``, ``int``, ``float``, ``bool`` and ``None`` only, so ``json.dumps(...,
allow_nan=False)`` takes it and loading it can run nothing.  Pickle is not
used anywhere on this path: a planted pickle runs code.

Conventions of every snapshot:

* The top level carries ``"type"`` (the class, e.g. ``"DriftDetector"``) and
  ``"version"`` (:data:`STATE_VERSION`); a snapshot of another type or of an
  unknown version is refused.
* Floats are JSON numbers; non-finite ones are the strings ``"nan"``,
  ``"inf"`` and ``"-inf"`` (:func:`enc_float`).
* Objects have exactly their fields: a missing field and an unknown one are
  both errors.
* A wrapped library model (River) is an object whose ``"class"`` must be the
  one its owner builds for that kind: an allowlist that is compared, never
  looked up, so nothing named by the data is imported or called.

Reading goes through :class:`Obj` and the ``as_*`` checks: anything malformed
raises :class:`~controllers.errors.ParameterError` naming the field by its path
(``state.detector.buckets[2].totals[0]``).

Examples
--------
>>> o = open_state({"type": "Demo", "version": 1, "n": 3, "x": "inf"}, "Demo", ("n", "x"))
>>> o.get_int("n", lo=0), o.get_float("x")
(3, inf)
>>> enc_float(float("-inf")), enc_float(0.5)
('-inf', 0.5)
>>> open_state({"type": "Demo", "version": 2}, "Demo", ())
Traceback (most recent call last):
...
controllers.errors.ParameterError: state.version=2: unknown version (this code reads version 1)
>>> open_state({"type": "Demo", "version": 1, "n": True, "x": 0.0}, "Demo", ("n", "x")).get_int("n")
Traceback (most recent call last):
...
controllers.errors.ParameterError: state.n=True: must be an int
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypeVar

from controllers.errors import ParameterError

__all__ = [
    "STATE_VERSION",
    "Obj",
    "as_bool",
    "as_float",
    "as_int",
    "as_list",
    "as_str",
    "enc_float",
    "float_list",
    "header",
    "open_state",
    "show",
    "show_key",
]

STATE_VERSION = 1
I32_MIN, I32_MAX = -(2**31), 2**31 - 1

T = TypeVar("T")

_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def show(value: object) -> str:
    """A short ``repr`` for messages (never raises, never long)."""
    try:
        text = repr(value)
    except Exception:  # e.g. an int too long to print
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def show_key(key: object) -> str:
    """A field name for a path: as is when it is a short identifier, else its short ``repr``."""
    if isinstance(key, str) and key.isidentifier() and len(key) <= 60:
        return key
    return show(key)


def bad(path: str, value: object, why: str) -> ParameterError:
    """The error for a malformed field: names it, shows the value, says why."""
    return ParameterError(f"{path}={show(value)}: {why}")


def enc_float(x: float) -> float | str:
    """``x`` as plain data: a float, or ``"nan"`` / ``"inf"`` / ``"-inf"``."""
    x = float(x)
    if math.isfinite(x):
        return x
    if math.isnan(x):
        return "nan"
    return "inf" if x > 0 else "-inf"


def as_float(
    value: object,
    path: str,
    lo: float | None = None,
    hi: float | None = None,
    *,
    finite: bool = False,
) -> float:
    """Read a float (a number, or a non-finite string of :func:`enc_float`) in ``[lo, hi]``."""
    x: float
    if isinstance(value, bool):
        raise bad(path, value, "must be a number")
    if isinstance(value, float):
        x = value
    elif isinstance(value, int):
        try:
            x = float(value)
        except OverflowError:
            raise bad(path, value, "out of the float range") from None
    elif isinstance(value, str) and value in _NON_FINITE:
        x = _NON_FINITE[value]
    else:
        raise bad(path, value, "must be a number")
    if finite and not math.isfinite(x):
        raise bad(path, value, "must be finite")
    if (lo is not None and not x >= lo) or (hi is not None and not x <= hi):
        raise bad(path, value, f"must lie in [{lo}, {hi}]")
    return x


def as_int(value: object, path: str, lo: int | None = None, hi: int | None = None) -> int:
    """Read an int (not a bool, not a float) in ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(path, value, "must be an int")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise bad(path, value, f"must lie in [{lo}, {hi}]")
    return int(value)


def as_bool(value: object, path: str) -> bool:
    """Read a bool."""
    if not isinstance(value, bool):
        raise bad(path, value, "must be a bool")
    return value


def as_str(value: object, path: str, choices: Collection[str] | None = None) -> str:
    """Read a string, one of ``choices`` if given."""
    if not isinstance(value, str):
        raise bad(path, value, "must be a string")
    if choices is not None and value not in choices:
        raise bad(path, value, f"must be one of {sorted(choices)}")
    return value


def as_list(value: object, path: str, max_len: int | None = None, length: int | None = None) -> Sequence[object]:
    """Read a list (``length`` items exactly, or at most ``max_len``)."""
    if not isinstance(value, list | tuple):
        raise bad(path, value, "must be a list")
    if length is not None and len(value) != length:
        raise bad(path, value, f"must have {length} items, not {len(value)}")
    if max_len is not None and len(value) > max_len:
        raise bad(path, value, f"must have at most {max_len} items, not {len(value)}")
    return value


def float_list(value: object, path: str, max_len: int | None = None, length: int | None = None) -> list[float]:
    """Read a list of floats."""
    items = as_list(value, path, max_len=max_len, length=length)
    return [as_float(v, f"{path}[{i}]") for i, v in enumerate(items)]


def header(type_name: str) -> dict[str, Any]:
    """The first two fields of every snapshot."""
    return {"type": type_name, "version": STATE_VERSION}


class Obj:
    """One JSON object being read: exactly ``keys``; errors name ``path.key``."""

    def __init__(self, data: object, path: str, keys: Collection[str]) -> None:
        if not isinstance(data, Mapping):
            raise bad(path, data, "must be an object")
        for key in data:
            if key not in keys:
                raise ParameterError(f"{path}.{show_key(key)}: unknown field")
        for key in keys:
            if key not in data:
                raise ParameterError(f"{path}.{key}: missing")
        self.data: Mapping[Any, Any] = data
        self.path = path

    def at(self, key: str) -> str:
        """The path of a field."""
        return f"{self.path}.{key}"

    def raw(self, key: str) -> object:
        return self.data[key]

    def get_float(self, key: str, lo: float | None = None, hi: float | None = None, *, finite: bool = False) -> float:
        return as_float(self.data[key], self.at(key), lo, hi, finite=finite)

    def get_opt_float(self, key: str) -> float | None:
        value = self.data[key]
        return None if value is None else as_float(value, self.at(key))

    def get_int(self, key: str, lo: int | None = None, hi: int | None = None) -> int:
        return as_int(self.data[key], self.at(key), lo, hi)

    def get_bool(self, key: str) -> bool:
        return as_bool(self.data[key], self.at(key))

    def get_str(self, key: str, choices: Collection[str] | None = None) -> str:
        return as_str(self.data[key], self.at(key), choices)

    def get_floats(self, key: str, max_len: int | None = None, length: int | None = None) -> list[float]:
        return float_list(self.data[key], self.at(key), max_len=max_len, length=length)

    def get_obj(self, key: str, keys: Collection[str]) -> Obj:
        return Obj(self.data[key], self.at(key), keys)

    def get_pairs(self, key: str, names: Collection[str], read: Callable[[object, str], T]) -> list[tuple[str, T]]:
        """An ordered map stored as ``[[name, value], ...]``: names from ``names``, each once."""
        path = self.at(key)
        out: list[tuple[str, T]] = []
        seen: set[str] = set()
        for i, item in enumerate(as_list(self.data[key], path, max_len=len(names))):
            pair = as_list(item, f"{path}[{i}]", length=2)
            name = as_str(pair[0], f"{path}[{i}][0]", names)
            if name in seen:
                raise bad(f"{path}[{i}][0]", name, "repeated")
            seen.add(name)
            out.append((name, read(pair[1], f"{path}[{i}][1]")))
        return out

    def check_class(self, expected: str, what: str) -> None:
        """The ``"class"`` field must be exactly ``expected`` (an allowlist: compared, never looked up)."""
        value = self.data["class"]
        if not isinstance(value, str) or value != expected:
            raise bad(self.at("class"), value, f"must be {expected!r} for {what}")


def open_state(data: object, type_name: str, keys: Collection[str]) -> Obj:
    """Check the ``type`` and ``version`` of a snapshot; read it with fields ``keys``."""
    if not isinstance(data, Mapping):
        raise bad("state", data, "must be an object")
    kind = data.get("type")
    if not isinstance(kind, str) or kind != type_name:
        raise bad("state.type", kind, f"must be {type_name!r}")
    version = data.get("version")
    if type(version) is not int or version != STATE_VERSION:
        raise bad("state.version", version, f"unknown version (this code reads version {STATE_VERSION})")
    return Obj(data, "state", ("type", "version", *keys))
