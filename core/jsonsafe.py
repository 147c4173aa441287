"""Limits every JSON value governor reads from outside must respect (standard library only).

orjson reads 1,024 levels of nesting but writes only 254: a value nested in
between decodes, then raises when it is written back (a dead letter, a
result, a signed command).  Python's ``repr`` and ``json`` recurse too.  So
nested values are refused at the door, checked without recursion.

>>> too_deep({"a": [[1]]}, 3), too_deep({"a": [[1]]}, 2)
(False, True)
>>> nested = 0
>>> for _ in range(5000):
...     nested = [nested]
>>> too_deep(nested, MAX_DEPTH)
True
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_DEPTH", "too_deep"]

MAX_DEPTH = 32  # levels of nesting a command's detail or payload may have


def too_deep(v: Any, limit: int) -> bool:
    """Whether the JSON value ``v`` nests deeper than ``limit`` levels (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(v, 0)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, dict | list):
            if d >= limit:
                return True
            stack.extend((y, d + 1) for y in (x.values() if isinstance(x, dict) else x))
    return False
