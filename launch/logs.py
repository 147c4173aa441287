"""Logging of every governor process: ``--log-format text|json`` (GOVERNOR_LOG_FORMAT).

``text`` is the human line (``time LEVEL logger: message``).  ``json`` writes
one JSON object per line, for a log shipper::

    {"ts": "2025-01-01T12:00:00.123Z", "level": "INFO", "logger": "streams.agents",
     "msg": "command ab12 az-a published (scale)", "model": "llama2-70b", "zone": "az-a",
     "command_id": "ab12"}

``model``, ``zone``, ``command_id`` and ``window_end_ms`` (and any other field a
log site passes with ``extra=``) are top-level keys where the site gives them;
an exception is serialised under ``exc`` (its type and message under
``exc_type``/``exc_msg``), so a traceback never spans lines.  Child processes
inherit the format through ``Settings.to_env`` (GOVERNOR_LOG_FORMAT).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

import orjson

__all__ = ["CONTEXT_FIELDS", "LOG_FORMATS", "JsonFormatter", "TEXT_FORMAT", "setup_logging"]

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: the fields the main log sites pass with ``extra=`` (listed first when present)
CONTEXT_FIELDS = ("model", "zone", "command_id", "window_end_ms")

# Attributes every LogRecord has: anything else on a record came from ``extra=``.
_STANDARD = set(vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def _default(value: Any) -> Any:
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (module docstring).

    >>> rec = logging.LogRecord("streams.agents", logging.INFO, "f.py", 1, "cmd %s", ("c1",), None)
    >>> rec.zone = "az-a"
    >>> out = orjson.loads(JsonFormatter().format(rec))
    >>> out["level"], out["logger"], out["msg"], out["zone"]
    ('INFO', 'streams.agents', 'cmd c1', 'az-a')
    """

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in CONTEXT_FIELDS:  # first, in this order; a None (does not apply) is left out
            if record.__dict__.get(key) is not None:
                out[key] = record.__dict__[key]
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in out and key not in CONTEXT_FIELDS and not key.startswith("_"):
                out[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            out["exc_type"] = record.exc_info[0].__name__
            out["exc_msg"] = str(record.exc_info[1])
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(out, default=_default, option=orjson.OPT_NON_STR_KEYS).decode()


def _iso(created: float) -> str:
    """UTC, millisecond precision: ``2025-01-01T12:00:00.123Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1000):03d}Z"


def setup_logging(level: str = "INFO", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Configure the root logger once for the process (replaces any handlers it had)."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r}: choose one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
