"""launch.logs: the JSON line format of every process (--log-format json)."""

from __future__ import annotations

import io
import logging

import orjson
import pytest

from launch.logs import JsonFormatter, setup_logging


def _record(msg: str = "command %s published", *args: object, exc: bool = False, **extra: object) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("bad\nvalue")
        except ValueError:
            import sys

            exc_info = sys.exc_info()
    rec = logging.LogRecord("streams.agents", logging.INFO, __file__, 7, msg, args or ("c1",), exc_info)
    for k, v in extra.items():
        setattr(rec, k, v)
    return rec


def test_fields_and_context() -> None:
    line = JsonFormatter().format(
        _record(model="llama2-70b", zone="az-a", command_id="scale-1", window_end_ms=1_700_000_000_000)
    )
    out = orjson.loads(line)
    assert list(out)[:8] == ["ts", "level", "logger", "msg", "model", "zone", "command_id", "window_end_ms"]
    assert out["level"] == "INFO" and out["logger"] == "streams.agents"
    assert out["msg"] == "command c1 published"
    assert out["window_end_ms"] == 1_700_000_000_000
    assert out["ts"].endswith("Z") and out["ts"][10] == "T" and len(out["ts"]) == 24


def test_context_that_does_not_apply_is_left_out_and_other_extras_kept() -> None:
    out = orjson.loads(JsonFormatter().format(_record(model=None, zone="az-b", outcome="expired", blob=b"\x00")))
    assert "model" not in out and out["zone"] == "az-b" and out["outcome"] == "expired"
    assert out["blob"] == str(b"\x00")  # not JSON-able: its str, never a failure


def test_one_line_even_with_newlines_and_an_exception() -> None:
    line = JsonFormatter().format(_record("two\nlines %s", "x", exc=True))
    assert "\n" not in line
    out = orjson.loads(line)
    assert out["msg"] == "two\nlines x"
    assert out["exc_type"] == "ValueError" and out["exc_msg"] == "bad\nvalue"
    assert out["exc"].startswith("Traceback") and "ValueError: bad" in out["exc"]


def test_setup_logging_json_through_a_logger() -> None:
    buf = io.StringIO()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        setup_logging("DEBUG", "json", stream=buf)
        logging.getLogger("executors.executor").info("outcome %s", "applied", extra={"zone": "az-a"})
        logging.getLogger("x").debug("quiet")
        setup_logging("WARNING", "json", stream=buf)
        logging.getLogger("x").info("dropped")
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2, lines
    first = orjson.loads(lines[0])
    assert (first["logger"], first["msg"], first["zone"]) == ("executors.executor", "outcome applied", "az-a")


def test_text_format_and_bad_format() -> None:
    buf = io.StringIO()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        setup_logging("INFO", "text", stream=buf)
        logging.getLogger("governor").info("hello")
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
    assert buf.getvalue().rstrip().endswith("INFO governor: hello")
    with pytest.raises(ValueError, match="log format"):
        setup_logging("INFO", "xml")


def test_cli_log_format_reaches_children_through_settings() -> None:
    from core.settings import Settings

    s = Settings.from_env({"GOVERNOR_LOG_FORMAT": "json"})
    assert s.log_format == "json" and s.to_env()["GOVERNOR_LOG_FORMAT"] == "json"
