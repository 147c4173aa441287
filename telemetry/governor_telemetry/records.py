"""Versioned telemetry records, their validation, and the batch envelope.

A Kafka message on the telemetry topic is an *envelope* that carries a batch
of records (an inference node's producer flushes e.g. every 100 ms).  Faust's
per-message overhead is ~50x a raw consumer's, so batching is what makes the
pipeline fast; the records inside stay individually addressable so that a bad
one is dead-lettered alone.

Envelope (JSON, orjson-encoded)::

    {"schema_version": 1, "kind": "batch", "source": "node-17",
     "sent_ms": 1700000000000, "records": [ {...}, {...} ]}

Record kinds: ``request`` (one finished inference request) and ``gpu`` (one
replica/GPU sample).  Field tables below are the contract with producers on
inference nodes; ``validate_record`` returns a reason string for the first
problem it finds, or ``None``.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from governor_telemetry.bounds import FLOAT_MAX, MAXIMA
from governor_telemetry.vocab import AGENT_PATHS, AGENT_SIGNALS, GPU_STATES, REQUEST_STATUSES

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})


# field -> (types, required, minimum)
_NUM = (int, float)
REQUEST_FIELDS: dict[str, tuple[tuple[type, ...], bool, float | None]] = {
    "request_id": ((str,), True, None),
    "ts_ms": ((int,), True, 0),
    "arrival_ms": ((int,), False, 0),
    "model": ((str,), True, None),
    "zone": ((str,), True, None),
    "node": ((str,), True, None),
    "request_class": ((str,), False, None),
    "queue_ms": (_NUM, False, 0),
    "network_ms": (_NUM, False, 0),
    "preprocess_ms": (_NUM, False, 0),
    "ttft_ms": (_NUM, True, 0),
    "itl_ms": (_NUM, False, 0),
    "decode_ms": (_NUM, False, 0),
    "e2e_ms": (_NUM, True, 0),
    "prompt_tokens": ((int,), False, 0),
    "output_tokens": ((int,), False, 0),
    "kv_hit": ((bool,), False, None),
    "kv_hit_blocks": ((int,), False, 0),
    "status": ((str,), True, None),
    # Mixed agent load (docs/model.md §15 (agents)), optional: the turn's conversation stability, RAG
    # relevance score and tool-call confidence (each in [0, 1], all three or none) and
    # the path the turn took.  controllers.windows aggregates them per window.
    "agent_stability": (_NUM, False, 0),
    "agent_rag_score": (_NUM, False, 0),
    "agent_tool_conf": (_NUM, False, 0),
    "agent_path": ((str,), False, None),
}
_AGENT_PATH_SET = frozenset(AGENT_PATHS)

GPU_FIELDS: dict[str, tuple[tuple[type, ...], bool, float | None]] = {
    "ts_ms": ((int,), True, 0),
    "node": ((str,), True, None),
    "zone": ((str,), True, None),
    "model": ((str,), True, None),
    "state": ((str,), True, None),
    "gpu_util": (_NUM, True, 0),
    "mem_used_bytes": ((int,), True, 0),
    "mem_total_bytes": ((int,), True, 0),
    "kv_blocks_used": ((int,), False, 0),
    "kv_blocks_total": ((int,), False, 0),
    "largest_free_block_bytes": ((int,), False, 0),
    "queue_len": ((int,), False, 0),
    "running": ((int,), False, 0),
    # KV allocator telemetry (simulator's contiguous/paged allocators, engines that expose it)
    "fragmentation_ratio": (_NUM, False, 0),
    "kv_generation": ((int,), False, 0),
    "kv_free_bytes": ((int,), False, 0),
    "kv_waiting_bytes": ((int,), False, 0),
}

FIELDS_BY_KIND = {"request": REQUEST_FIELDS, "gpu": GPU_FIELDS}

# Integer fields must fit the int64 columns the windows aggregate.
INT_MAX = 2**63 - 1
# A node id is a window key and goes into the node's window record (at most 256 characters there).
MAX_NODE_CHARS = 256
# Bins of a GPU sample's free_block_hist (the window record keeps at most as many).
MAX_HIST_BINS = 64

# Reasons quote bad values through this: short, and safe for any value (the
# builtin repr of a 1000-deep list raises RecursionError; of a 25 MB string, is 25 MB).
_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxstring, _repr.maxother, _repr.maxlist, _repr.maxdict = 2, 80, 80, 6, 4


def show(value: Any) -> str:
    """A short ``repr`` of any value, for reasons (never raises).

    >>> show("az-a"), show([[[[1]]]]), len(show("x" * 10**6)) <= 80
    ("'az-a'", '[[[...]]]', True)
    """
    try:
        return _repr.repr(value)
    except Exception:  # a hostile __repr__: only the type then
        return f"<{type(value).__name__}>"


class EnvelopeError(ValueError):
    """A whole message is unusable (not JSON, wrong shape, unknown version)."""


# The tables above compiled for the per-record hot path (~100k records/s per
# worker): (name, required, fast check).  A fast check accepts the common,
# well-typed value with one ``type(v) is ...`` test and a comparison; any value
# it does not accept goes to ``_field_reason``, which gives the reason.
_STR, _INT, _NUMBER, _BOOL = range(4)


def _compile(
    table: Mapping[str, tuple[tuple[type, ...], bool, float | None]], maxima: Mapping[str, float]
) -> tuple[tuple[str, bool, int, float | None, float], ...]:
    def check(types: tuple[type, ...]) -> int:
        return {(str,): _STR, (int,): _INT, _NUM: _NUMBER, (bool,): _BOOL}[types]

    def top(name: str, types: tuple[type, ...]) -> float:  # the field's bound, else its type's
        return maxima.get(name, INT_MAX if types == (int,) else FLOAT_MAX)

    return tuple(
        (name, required, check(types), minimum, top(name, types)) for name, (types, required, minimum) in table.items()
    )


_COMPILED = {kind: _compile(table, MAXIMA[kind]) for kind, table in FIELDS_BY_KIND.items()}


def _field_reason(name: str, value: Any, types: tuple[type, ...], minimum: float | None, maximum: float) -> str | None:
    """Why ``value`` is not valid for a field of ``types`` (None: it is)."""
    # bool is an int subclass: keep it out of numeric fields and vice versa.
    if isinstance(value, bool) and bool not in types:
        return f"field {name!r} must be {types[0].__name__}, got bool"
    if not isinstance(value, types):
        # An integral float is accepted where an int is expected (some JSON encoders
        # write 5.0 for 5); its minimum still applies.
        if not (types == (int,) and isinstance(value, float) and value.is_integer()):
            return f"field {name!r} must be {'/'.join(t.__name__ for t in types)}, got {type(value).__name__}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"field {name!r} is not finite"
    if isinstance(value, str) and not value:
        return f"field {name!r} is empty"
    if minimum is not None and value < minimum:
        return f"field {name!r}={value} is below {minimum}"
    for limit in (INT_MAX if types == (int,) or type(value) is int else math.inf, maximum):
        if value > limit:
            return f"field {name!r}={value} exceeds {limit}"
    return None


def _check_fields(rec: Mapping[str, Any], kind: str) -> str | None:
    table = FIELDS_BY_KIND[kind]
    get = rec.get
    for name, required, check, minimum, maximum in _COMPILED[kind]:
        value = get(name)
        if value is None:
            if required:
                return f"missing field {name!r}"
            continue
        t = type(value)
        if check is _STR:
            if t is str and value:
                continue
        elif check is _NUMBER:
            # NaN fails both comparisons, inf the second (maximum is finite).
            if t is float:
                if minimum <= value <= maximum:
                    continue
            elif t is int and minimum <= value <= maximum and value <= INT_MAX:
                continue
        elif check is _INT:
            if t is int and minimum <= value <= maximum:
                continue
        elif t is bool:
            continue
        reason = _field_reason(name, value, table[name][0], minimum, maximum)
        if reason is not None:
            return reason
    return None


def _supported(version: Any) -> bool:
    if isinstance(version, bool):  # JSON true is not version 1, although True == 1 in Python
        return False
    try:
        return version in SUPPORTED_VERSIONS
    except TypeError:  # unhashable (a list or an object)
        return False


def validate_record(rec: Any) -> str | None:
    """Return why ``rec`` is invalid, or ``None`` when it is a valid record.

    >>> validate_record({"kind": "gpu"}) is not None
    True
    """
    if type(rec) is not dict and not isinstance(rec, Mapping):
        return f"record must be an object, got {type(rec).__name__}"
    version = rec.get("schema_version", SCHEMA_VERSION)
    if (version != SCHEMA_VERSION or isinstance(version, bool)) and not _supported(version):
        return f"unsupported schema_version {show(version)}"
    kind = rec.get("kind")
    if kind != "request" and kind != "gpu":
        return f"unknown record kind {show(kind)}"
    reason = _check_fields(rec, kind)
    if reason:
        return reason
    if len(rec["node"]) > MAX_NODE_CHARS:
        return f"field 'node' is longer than {MAX_NODE_CHARS} characters"
    if kind == "request":
        if rec["status"] not in REQUEST_STATUSES:
            return f"status {show(rec['status'])} not in {sorted(REQUEST_STATUSES)}"
        if rec["e2e_ms"] + 1e-6 < rec["ttft_ms"]:
            return f"e2e_ms ({rec['e2e_ms']}) is smaller than ttft_ms ({rec['ttft_ms']})"
        if (
            rec.get("agent_stability") is None
            and rec.get("agent_rag_score") is None
            and rec.get("agent_tool_conf") is None
            and rec.get("agent_path") is None
        ):
            return None
        return _agent_reason(rec)
    else:
        if rec["state"] not in GPU_STATES:
            return f"state {show(rec['state'])} not in {sorted(GPU_STATES)}"
        if not 0.0 <= rec["gpu_util"] <= 1.0:
            return f"gpu_util={rec['gpu_util']} outside [0, 1]"
        if rec["mem_used_bytes"] > rec["mem_total_bytes"]:
            return "mem_used_bytes exceeds mem_total_bytes"
        if (rec.get("kv_blocks_used") or 0) > (rec.get("kv_blocks_total") or 0) > 0:
            return "kv_blocks_used exceeds kv_blocks_total"
        if (rec.get("fragmentation_ratio") or 0.0) > 1.0:
            return f"fragmentation_ratio={rec['fragmentation_ratio']} above 1"
        hist = rec.get("free_block_hist")
        if hist is not None and not (
            isinstance(hist, list)
            and len(hist) <= MAX_HIST_BINS
            and all((type(v) is int or (type(v) is float and v.is_integer())) and 0 <= v <= INT_MAX for v in hist)
        ):
            return f"free_block_hist must be a list of at most {MAX_HIST_BINS} non-negative ints"
    return None


def _agent_reason(rec: Mapping[str, Any]) -> str | None:
    """Why a request's agent fields (types already checked) are invalid, or None.

    The value goes after the colon so that the dead-letter counter's label
    (the text before it) stays bounded.
    """
    signals = [rec.get(name) for name in AGENT_SIGNALS]
    if signals != [None, None, None]:
        for name, value in zip(AGENT_SIGNALS, signals, strict=True):
            if value is None:
                return f"agent signals incomplete: {name!r} missing (send all three or none)"
            if value > 1.0:
                return f"field {name!r} outside [0, 1]: {value}"
    path = rec.get("agent_path")
    if path is not None and path not in _AGENT_PATH_SET:
        return f"agent_path not in {sorted(AGENT_PATHS)}: {show(path)}"
    return None


def _agent_columns_ok(cols: Mapping[str, list[Any]]) -> bool:
    """:func:`_agent_reason` a column at a time (types and minimums already checked)."""
    s, r, t = (cols[name] for name in AGENT_SIGNALS)
    n = len(s)
    if not s.count(None) == r.count(None) == t.count(None) == n:
        absent = [v is None for v in s]
        if absent != [v is None for v in r] or absent != [v is None for v in t]:
            return False
        if max(v for col in (s, r, t) for v in col if v is not None) > 1.0:
            return False
    path = cols["agent_path"]
    return path.count(None) == n or set(path) - {None} <= _AGENT_PATH_SET


_NONE = type(None)


def request_columns(records: list[Any]) -> dict[str, list[Any]] | None:
    """The request fields of ``records`` as columns, if every record is a valid
    request record; otherwise None (then validate them one by one for reasons).

    The same rules as :func:`validate_record`, checked a column at a time with
    C-speed builtins (``set(map(type, col))``, ``min``, ``sum``), which is what
    makes a batch of well-formed records cheap.  Integral floats in int fields
    and huge floats are left to the per-record path.
    """
    n = len(records)
    if set(map(type, records)) != {dict}:
        return None
    if [r.get("kind") for r in records].count("request") != n:
        return None
    versions = [r.get("schema_version", SCHEMA_VERSION) for r in records]
    if versions.count(SCHEMA_VERSION) != n or any(v is True for v in versions):
        return None  # (JSON true is not version 1, although True == 1 in Python)
    cols: dict[str, list[Any]] = {}
    for name, required, check, minimum, maximum in _COMPILED["request"]:
        col = [r.get(name) for r in records]
        types = set(map(type, col))
        values = col
        if _NONE in types:
            if required:
                return None
            cols[name] = col
            if len(types) == 1:  # an optional field no record carries
                continue
            types.discard(_NONE)
            values = [v for v in col if v is not None]
        cols[name] = col
        if not types:
            continue
        if check is _STR:
            if types != {str} or "" in values:
                return None
        elif check is _BOOL:
            if types != {bool}:
                return None
        else:
            if types != {int} and (check is _INT or types - {int, float}):
                return None
            if float in types and not math.isfinite(sum(values)):  # NaN or inf (or overflow)
                return None
            if min(values) < minimum or max(values) > maximum or max(values) > INT_MAX:
                return None
    if not set(cols["status"]) <= REQUEST_STATUSES:
        return None
    if max(map(len, cols["node"])) > MAX_NODE_CHARS:
        return None
    if any(e + 1e-6 < t for e, t in zip(cols["e2e_ms"], cols["ttft_ms"], strict=True)):
        return None
    if not _agent_columns_ok(cols):
        return None
    return cols


def encode_envelope(records: Sequence[Mapping[str, Any]], source: str, sent_ms: int) -> bytes:
    return orjson.dumps(
        {"schema_version": SCHEMA_VERSION, "kind": "batch", "source": source, "sent_ms": sent_ms, "records": records}
    )


def parse_message(raw: bytes | str | Any) -> Any:
    """A message's JSON value: bytes or text parsed, anything else taken as parsed already.

    Raises :class:`EnvelopeError` when the text is not JSON.
    """
    if not isinstance(raw, bytes | bytearray | memoryview | str):
        return raw
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise EnvelopeError(f"not JSON: {exc}") from exc


def decode_envelope(raw: bytes | str | Any) -> list[Any]:
    """Decode a telemetry message into its list of (unvalidated) records.

    A single bare record (``kind`` request/gpu) is accepted as a batch of one,
    so simple producers need not batch.  Raises :class:`EnvelopeError`.
    """
    obj = parse_message(raw)
    if not isinstance(obj, dict):
        raise EnvelopeError(f"message must be a JSON object, got {type(obj).__name__}")
    kind = obj.get("kind")
    if kind == "request" or kind == "gpu":
        return [obj]
    if kind != "batch":
        raise EnvelopeError(f"unknown message kind {show(kind)}")
    version = obj.get("schema_version")
    if not _supported(version):
        raise EnvelopeError(f"unsupported envelope schema_version {show(version)}")
    records = obj.get("records")
    if not isinstance(records, list):
        raise EnvelopeError("envelope field 'records' must be a list")
    return records


def partition_key(model: str, zone: str) -> bytes:
    """Telemetry, metrics and commands for one (model, zone) share a partition.

    >>> partition_key("llama2-70b", "az-a")
    b'llama2-70b|az-a'
    """
    return f"{model}|{zone}".encode()
