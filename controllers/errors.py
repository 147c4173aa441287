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

__all__ = ["LateWindowError", "ParameterError"]


class ParameterError(ValueError):
    """A parameter is out of its domain; the message names it and says why."""


class LateWindowError(ValueError):
    """A record belongs to a window that has already been closed and emitted.

    The caller must dead-letter the record (with this message as the reason);
    it is never merged into a closed window or dropped silently.
    """
