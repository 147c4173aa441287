"""Dead letters: bounded, always serialisable records of what the pipeline refused.

A dead letter is ``{"schema_version": 1, "kind", "reason", "source", "record",
"dead_lettered_ms", "truncated"}``.  ``kind`` is one of
:data:`core.vocab.DEAD_LETTER_KINDS` (the Prometheus label, a fixed set);
``reason`` is the detail (at most :data:`MAX_REASON_CHARS` characters);
``record`` is what was refused.

Whatever was refused, :func:`dead_letter` returns a record that ``orjson``
serialises and whose JSON is at most :data:`MAX_DEAD_LETTER_BYTES` -- far
below the producer's 1 MB request limit.  orjson reads 1024 levels of nesting
but writes only 254, and a message may be tens of MB: a record that does not
serialise or is too big is replaced by a clipped copy (at most
:data:`MAX_DEPTH` levels, strings cut at :data:`MAX_STR_CHARS`, containers cut
when the byte budget is spent, each cut marked with ``"…"``) and
``truncated`` is true; ``record_bytes`` then gives the original's JSON size
when it is known.

>>> dl = dead_letter("late: window closed", {"topic": "t"}, {"a": [[[1]]]}, 5)
>>> dl["kind"], dl["truncated"], dl["record"]
('late', False, {'a': [[[1]]]})
>>> import orjson
>>> deep = orjson.loads("[" * 1024 + "]" * 1024)
>>> dl = dead_letter("bad envelope: x", {}, deep, 0)
>>> dl["truncated"], len(orjson.dumps(dl)) < 1024
(True, True)
>>> dead_letter_kind("field 'ttft_ms'=-1.0 is below 0"), dead_letter_kind("unknown zone: 'x'")
('invalid record', 'unknown zone')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from core.vocab import DEAD_LETTER_KINDS

__all__ = [
    "MAX_DEAD_LETTER_BYTES",
    "MAX_DEPTH",
    "MAX_REASON_CHARS",
    "MAX_STR_CHARS",
    "clip",
    "dead_letter",
    "dead_letter_kind",
]

#: The most bytes one dead letter's JSON takes.
MAX_DEAD_LETTER_BYTES = 64 * 1024
#: The most characters of a dead letter's reason.
MAX_REASON_CHARS = 1024
#: The deepest nesting kept of a refused record (orjson writes at most 254).
MAX_DEPTH = 32
#: The most characters kept of one string of a refused record.
MAX_STR_CHARS = 4096

CUT = "…"
_KINDS = frozenset(DEAD_LETTER_KINDS)
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what orjson writes


def dead_letter_kind(reason: str) -> str:
    """The kind of a reason: the text before its first ':' when that is a kind.

    Reasons without a kind prefix are :func:`governor_telemetry.records.validate_record`'s
    (``invalid record``); ``no SLO configured for model ...`` is ``unknown model``.
    """
    head = reason.split(":", 1)[0] if isinstance(reason, str) else ""
    if head in _KINDS:
        return head
    if isinstance(reason, str) and reason.startswith("no SLO configured"):
        return "unknown model"
    return "invalid record"


def _safe_text(s: str) -> str:
    """``s`` as valid UTF-8 (a lone surrogate becomes '?'; orjson refuses it)."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "replace").decode("utf-8")


def _cut_text(s: str, limit: int) -> str:
    return _safe_text(s if len(s) <= limit else s[:limit] + f"{CUT}[{len(s) - limit} more characters]")


def _size(v: Any) -> int | None:
    try:
        return len(orjson.dumps(v))
    except (TypeError, ValueError):  # orjson.JSONEncodeError is a TypeError
        return None


def _scalar(v: Any) -> Any:
    """A JSON scalar for ``v`` (None: ``v`` is a container)."""
    if v is None or isinstance(v, bool | float):
        return v
    if isinstance(v, int):
        return v if _INT_MIN <= v <= _INT_MAX else f"{CUT}[int of {v.bit_length()} bits]"
    if isinstance(v, str):
        return _cut_text(v, MAX_STR_CHARS)
    if isinstance(v, bytes | bytearray | memoryview):
        b = bytes(v)
        text = b[:MAX_STR_CHARS].decode("utf-8", "replace")
        return text if len(b) <= MAX_STR_CHARS else text + f"{CUT}[{len(b) - MAX_STR_CHARS} more bytes]"
    return f"{CUT}[{type(v).__name__}]"


def clip(v: Any, budget: int, depth: int = 0) -> tuple[Any, int]:
    """A JSON-safe copy of ``v`` of at most ``MAX_DEPTH`` levels and about ``budget`` bytes.

    Returns ``(copy, budget left)``; every cut is marked with ``"…"``.
    """
    if not isinstance(v, Mapping | list | tuple):
        out = _scalar(v)
        return out, budget - (_size(out) or 0)
    if depth >= MAX_DEPTH:
        return f"{CUT}[nested deeper than {MAX_DEPTH}]", budget - 32
    budget -= 2
    n = len(v)
    if isinstance(v, Mapping):
        d: dict[str, Any] = {}
        for i, (k, x) in enumerate(v.items()):
            if budget <= 0:
                d[CUT] = f"{n - i} more keys"
                break
            key = _cut_text(k, 256) if isinstance(k, str) else f"{CUT}[{type(k).__name__} key]"
            budget -= (_size(key) or 0) + 2
            d[key], budget = clip(x, budget, depth + 1)
        return d, budget
    items: list[Any] = []
    for i, x in enumerate(v):
        if budget <= 0:
            items.append(f"{CUT}[{n - i} more items]")
            break
        item, budget = clip(x, budget - 1, depth + 1)
        items.append(item)
    return items, budget


def dead_letter(
    reason: str, source: Mapping[str, Any], record: Any, now_ms: int, kind: str | None = None
) -> dict[str, Any]:
    """A bounded dead letter (see the module docstring); never raises.

    ``kind`` defaults to :func:`dead_letter_kind` of ``reason``.
    """
    text = reason if isinstance(reason, str) else repr(type(reason))
    dl: dict[str, Any] = {
        "schema_version": 1,
        "kind": kind if kind in _KINDS else dead_letter_kind(text),
        "reason": _cut_text(text, MAX_REASON_CHARS),
        "source": dict(source),
        "record": None,
        "dead_lettered_ms": now_ms,
        "truncated": len(text) > MAX_REASON_CHARS,
    }
    head = _size(dl)
    if head is None or head > MAX_DEAD_LETTER_BYTES // 4:  # a source that is not plain metadata
        dl["source"], _ = clip(source, 1024)
        head = _size(dl) or 0
    room = MAX_DEAD_LETTER_BYTES - head - 256
    # Cheap cases first: a big string or bytes is cut without serialising it whole.
    size = None
    if not (isinstance(record, str | bytes | bytearray | memoryview) and len(record) > room):
        # The letter itself is measured, not the record alone: the letter nests the record one
        # level deeper, so a record of 254 levels serialises alone and its letter does not.
        dl["record"] = record
        whole = _size(dl)
        if whole is not None and whole <= MAX_DEAD_LETTER_BYTES:
            return dl
        size = _size(record)
    dl["record"], _ = clip(record, room // 2)
    dl["truncated"] = True
    if size is not None:
        dl["record_bytes"] = size
    elif isinstance(record, str | bytes | bytearray | memoryview):
        dl["record_bytes"] = len(record)
    return _encodable(dl)


def _encodable(dl: dict[str, Any]) -> dict[str, Any]:
    """``dl`` if it serialises within :data:`MAX_DEAD_LETTER_BYTES`; else the same letter without its record.

    Not expected (:func:`clip` is conservative), but this is what makes every dead letter
    encodable by construction: the last fallback holds only short strings, ints and bools.
    """
    size = _size(dl)
    if size is not None and size <= MAX_DEAD_LETTER_BYTES:
        return dl
    dl["record"] = f"{CUT}[record dropped]"
    size = _size(dl)
    if size is not None and size <= MAX_DEAD_LETTER_BYTES:
        return dl
    return {
        "schema_version": 1,
        "kind": dl["kind"] if dl.get("kind") in _KINDS else "invalid record",
        "reason": _cut_text(str(dl.get("reason", "")), MAX_REASON_CHARS),
        "source": f"{CUT}[source dropped]",
        "record": f"{CUT}[record dropped]",
        "dead_lettered_ms": ms if type(ms := dl.get("dead_lettered_ms")) is int and _INT_MIN <= ms <= _INT_MAX else 0,
        "truncated": True,
    }
