"""Exceptions shared by the pure controllers.

Every parameter object in :mod:`controllers` validates itself at construction
and raises :class:`ParameterError` with a message that names the offending
parameter and says why it is wrong (the python-control habit of
``ControlArgument``).  It subclasses :class:`ValueError` so callers that only
know the builtin still catch it.

Examples
--------
>>> try:
...     raise ParameterError("alpha=2.0: must lie in (0, 1)")
... except ValueError as exc:
...     print(exc)
alpha=2.0: must lie in (0, 1)
"""

from __future__ import annotations

import math

__all__ = ["LateWindowError", "ParameterError", "check_int", "check_number"]


class ParameterError(ValueError):
    """A parameter is out of its domain; the message names it and says why."""


class LateWindowError(ValueError):
    """A record belongs to a window that has already been closed and emitted.

    The caller must dead-letter the record (with this message as the reason);
    it is never merged into a closed window or dropped silently.
    """


def check_number(name: str, value: object, lo: float | None = None, *, strict: bool = False) -> float:
    """``value`` as a float: a finite number (not a bool), ``>= lo`` (``> lo`` with ``strict``).

    The shared parameter check of the controllers; the message names the parameter.

    >>> check_number("gain", 2), check_number("x", -1.5)
    (2.0, -1.5)
    >>> check_number("rate", -1, 0.0)
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: rate=-1: must be >= 0
    >>> check_number("hold_s", 0.0, 0.0, strict=True)
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: hold_s=0.0: must be > 0
    >>> check_number("flag", True)
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: flag=True: must be a finite number
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ParameterError(f"{name}={value!r}: must be a finite number")
    if lo is not None and (value < lo or (strict and value == lo)):
        raise ParameterError(f"{name}={value!r}: must be {'>' if strict else '>='} {lo:g}")
    return float(value)


def check_int(name: str, value: object, lo: int = 0) -> int:
    """``value`` unchanged: an int (not a bool) ``>= lo``.

    >>> check_int("probes", 20, 1)
    20
    >>> check_int("requests", 2.0)
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: requests=2.0: must be an int >= 0
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ParameterError(f"{name}={value!r}: must be an int >= {lo}")
    return value
