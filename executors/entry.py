"""What an executor trusts of a stream entry and of its own stored state: nothing unchecked.

Pure helpers of :class:`executors.executor.ZoneExecutor`, none of which
raises anything but :class:`~loop.commands.CommandError` (and that only
from :func:`decode_entry`):

* :func:`decode_entry` -- a stream entry's fields to ``(record, Command)``.
  Anything malformed -- no ``cmd`` field, not JSON, not an object, a
  ``detail`` / ``payload`` nested deeper than :data:`MAX_DEPTH`, or a
  decoder failure of any kind -- is a :class:`CommandError` (the executor
  reports it as ``rejected`` and acknowledges the entry);
* :func:`echo` -- the raw entry as a string for a result, capped at
  :data:`ECHO_CAP` bytes with a ``...[truncated N bytes]`` marker;
* :func:`stored_int` / :func:`valid_int` -- the ``last_basis`` /
  ``last_hlc`` hash values: only decimal ints within 64 bits are written or
  believed; anything else already stored counts as absent;
* :func:`apply_at` -- ``detail.apply_at_ms`` when it is a finite number;
* :func:`encode_result` -- a result record as bytes of at most
  :data:`RESULT_CAP`: an oversized or unencodable ``detail`` is replaced by
  ``{"truncated": true, "bytes": N}``.
"""

from __future__ import annotations

import math
import re
from typing import Any

import orjson

from core.jsonsafe import MAX_DEPTH, too_deep
from loop.commands import Command, CommandError

__all__ = [
    "ECHO_CAP",
    "MAX_DEPTH",
    "RESULT_CAP",
    "apply_at",
    "decode_entry",
    "echo",
    "encode_result",
    "stored_int",
    "valid_int",
]

#: Bytes of a malformed entry echoed in its result.
ECHO_CAP = 64 * 1024
#: Largest result record sent to the results topic (Kafka's default limit is 1 MiB).
RESULT_CAP = 256 * 1024
#: Deepest ``detail`` / ``payload`` accepted (deeper ones break asdict, signing and encoding).

_INT = re.compile(rb"-?[0-9]{1,20}")
_LIMIT = 1 << 64


def valid_int(v: Any) -> bool:
    """Whether ``v`` is an int (not a bool) within +/- 2**64: what may go into the staleness hashes.

    >>> valid_int(5), valid_int(5.0), valid_int(True), valid_int(2**70), valid_int(float("nan"))
    (True, False, False, False, False)
    """
    return isinstance(v, int) and not isinstance(v, bool) and -_LIMIT < v < _LIMIT


def stored_int(raw: Any) -> int | None:
    """A stored hash value as an int, or None when absent or not a valid int.

    >>> stored_int(b"1712"), stored_int(b"-3"), stored_int(b"1.5"), stored_int(b"nan"), stored_int(None)
    (1712, -3, None, None, None)
    """
    if isinstance(raw, str):
        raw = raw.encode()
    if not isinstance(raw, bytes) or _INT.fullmatch(raw) is None:
        return None
    v = int(raw)
    return v if valid_int(v) else None


def echo(raw: Any, cap: int = ECHO_CAP) -> str:
    """``raw`` (bytes, str or anything) as text of at most ``cap`` bytes, marked when truncated.

    >>> echo(b"abcdef", 4)
    'abcd...[truncated 2 bytes]'
    """
    data: bytes = (
        raw if isinstance(raw, bytes) else (raw if isinstance(raw, str) else repr(raw)).encode("utf-8", "replace")
    )
    if len(data) <= cap:
        return data.decode("utf-8", "replace")
    return data[:cap].decode("utf-8", "ignore") + f"...[truncated {len(data) - cap} bytes]"


def decode_entry(fields: Any) -> tuple[dict[str, Any], Command]:
    """``(record, command)`` of a stream entry's fields; :class:`CommandError` for anything malformed."""
    raw = fields.get(b"cmd") if isinstance(fields, dict) else None
    if raw is None:
        raise CommandError("stream entry has no 'cmd' field")
    try:
        obj = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError) as exc:
        raise CommandError(f"not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise CommandError("command must be a JSON object")
    for name in ("detail", "payload"):
        if too_deep(obj.get(name), MAX_DEPTH):
            raise CommandError(f"{name} nested deeper than {MAX_DEPTH} levels")
    try:
        cmd = Command.decode(obj)
        cmd.order_field  # noqa: B018 - checks a relocate payload's node now, not mid-apply
    except CommandError:
        raise
    except Exception as exc:  # noqa: BLE001 - a decoder bug must not stop the executor
        raise CommandError(f"undecodable command ({type(exc).__name__}: {echo(str(exc), 200)})") from exc
    return obj, cmd


def apply_at(cmd: Command) -> float | None:
    """``detail.apply_at_ms`` of a command, if it carries a finite number.

    >>> from loop.commands import Command
    >>> c = Command(kind="scale", zone="z", model="m", target_replicas=1, reason="", issued_at_ms=0,
    ...             expires_at_ms=1, basis_ms=0, detail={"apply_at_ms": 5})
    >>> apply_at(c)
    5.0
    """
    v = cmd.detail.get("apply_at_ms") if isinstance(cmd.detail, dict) else None
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def encode_result(result: dict[str, Any], cap: int = RESULT_CAP) -> bytes:
    """``result`` as JSON of at most ``cap`` bytes (an oversized or unencodable ``detail`` is dropped).

    >>> len(encode_result({"outcome": "x", "detail": {"raw": "a" * 5000}}, cap=1000)) < 1000
    True
    """
    try:
        out = orjson.dumps(result)
        if len(out) <= cap:
            return out
        size = len(out)
    except (orjson.JSONEncodeError, TypeError):
        size = -1
    slim = {k: v for k, v in result.items() if k != "detail"}
    slim["detail"] = {"truncated": True, "bytes": size}
    try:
        out = orjson.dumps(slim)
    except (orjson.JSONEncodeError, TypeError):
        out = b""
    if not out or len(out) > cap:
        keep = ("schema_version", "zone", "outcome", "at_ms", "backend", "entry_id", "command_id", "record")
        small = {k: echo(result[k], 256) if isinstance(result[k], str) else result[k] for k in keep if k in result}
        small["reason"] = echo(result.get("reason", ""), 1024)
        small["detail"] = {"truncated": True, "bytes": size}
        try:
            out = orjson.dumps(small)
        except (orjson.JSONEncodeError, TypeError):
            out = orjson.dumps({"outcome": "failed", "reason": "unencodable result", "detail": {"truncated": True}})
    return out
