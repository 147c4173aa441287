"""The typed window record: what the drivers read, decoded once at the metrics boundary.

The ingest publishes each closed window as a JSON object on the metrics topic
(:func:`controllers.window_result.result` plus a header: scope, model, zone,
window bounds, SLOs).  The control loop decodes every such object once, with
:func:`decode_window`, into a frozen :class:`WindowRecord`; every driver
reads the type, never the dict.  An object that does not decode raises
:class:`WindowRecordError`, whose message names the field; the loop
dead-letters it with that reason, so no shape of record can crash a driver.

Only the header is required (``scope``, ``model``, ``zone``,
``window_end_ms``; ``node`` for a node window).  Every other field may be
absent (older producers, hand-written records) and then takes its empty
value: 0 for counts and rates, None for quantiles, means and KV fields (a
record from before the stage latencies decodes with none).  A field that is
present must have its type and range: counts are ints >= 0, rates lie in
[0, 1], latencies and means are finite numbers >= 0, and
``stage_unfixable_rate`` (a share of the unfixable) is at most ``unfixable_rate``.

Examples
--------
>>> r = decode_window({"kind": "window", "scope": "zone", "model": "m", "zone": "az-a",
...                    "window_end_ms": 20_000, "window_s": 10.0, "count": 12, "violation_rate": 0.25})
>>> r.count, r.violation_rate, r.window_start_ms, r.ttft_p95_ms
(12, 0.25, 10000, None)
>>> decode_window({"scope": "zone", "model": "m", "zone": "az-a"})
Traceback (most recent call last):
...
controllers.window_record.WindowRecordError: window_end_ms: missing
>>> decode_window({"scope": "zone", "model": "m", "zone": "a", "window_end_ms": 1, "count": -3})
Traceback (most recent call last):
...
controllers.window_record.WindowRecordError: count: must be an int >= 0, got -3
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from governor_telemetry.records import MAX_HIST_BINS, show

from controllers.window_fields import RECORD, REQUIRED, check_dataclass
from core.vocab import AGENT_PATHS

__all__ = ["METRICS_SCHEMA_VERSION", "WindowRecord", "WindowRecordError", "decode_window"]

#: The metrics record's schema version (the ingest writes it; 1 is the only one).
METRICS_SCHEMA_VERSION = 1
_MAX_INT = 2**63 - 1

Scope = Literal["zone", "node"]


class WindowRecordError(ValueError):
    """A metrics record is not a usable window; the message names the field."""


@dataclass(frozen=True, slots=True)
class WindowRecord:
    """One closed window of one (model, zone), or of one node of it.

    Field names and units are those of the JSON record (docs/architecture.md,
    Windows); see :func:`controllers.window_result.result` for how each is
    computed.  The fields, their checks and empty values are listed in
    :data:`controllers.window_fields.RECORD`; this class is checked against
    it at import (same names, same order, same empty values).
    """

    scope: Scope
    model: str
    zone: str
    window_end_ms: int
    node: str | None = None
    window_start_ms: int = -1  # -1: absent (decode fills end - window_s)
    window_s: float = 0.0
    ttft_slo_ms: float | None = None
    itl_slo_ms: float | None = None
    emitted_ms: int | None = None
    nodes: int | None = None
    count: int = 0
    rate_rps: float = 0.0
    violation_rate: float = 0.0
    # share of requests over their TTFT limit even without their wait (capacity cannot fix them);
    # a record without it (an older worker) reads 0: every violation counts as fixable
    unfixable_rate: float = 0.0
    # of those, the share that would meet the limit without its network and preprocess time too: a slow
    # stage before the replica made them miss (neither queueing nor prefill); absent (an older worker): 0
    stage_unfixable_rate: float = 0.0
    error_rate: float = 0.0
    kv_hit_rate: float = 0.0
    e2e_p50_ms: float | None = None
    e2e_p95_ms: float | None = None
    e2e_p99_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p95_ms: float | None = None
    # the stage latencies (None: no request of the window measured that stage)
    network_p50_ms: float | None = None
    network_p95_ms: float | None = None
    preprocess_p50_ms: float | None = None
    preprocess_p95_ms: float | None = None
    decode_p50_ms: float | None = None
    decode_p95_ms: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    queue_ms_mean: float | None = None
    queue_len_mean: float | None = None
    queue_len_max: float | None = None
    running_mean: float | None = None
    gpu_util_mean: float | None = None
    replicas_ready: int = 0
    replicas_starting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    largest_free_block_bytes_min: int | None = None
    agent_signals_n: int = 0
    agent_stability_mean: float | None = None
    agent_rag_score_mean: float | None = None
    agent_tool_conf_mean: float | None = None
    agent_path_counts: Mapping[str, int] = field(default_factory=dict)
    # a node window's KV allocator fields (its latest GPU sample; None: not reported)
    largest_free_block_bytes: int | None = None
    fragmentation_ratio: float | None = None
    kv_free_bytes: int | None = None
    kv_waiting_bytes: int | None = None
    kv_generation: int | None = None
    free_block_hist: tuple[int, ...] | None = None
    # a zone window's records the node cap dropped, and their share of its records (controllers.node_cap)
    node_cap_dropped: int = 0
    node_cap_dropped_rate: float = 0.0

    @property
    def key(self) -> tuple[str, str]:
        """``(model, zone)``: the key drivers keep their state under."""
        return (self.model, self.zone)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-safe record (the metrics topic's shape, ``kind`` included).

        >>> r = decode_window({"scope": "node", "model": "m", "zone": "z", "node": "n1",
        ...                    "window_end_ms": 5, "free_block_hist": [1, 0]})
        >>> decode_window(r.to_dict()) == r
        True
        """
        out: dict[str, Any] = {"schema_version": METRICS_SCHEMA_VERSION, "kind": "window"}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "agent_path_counts":
                v = dict(v)
            elif f.name == "free_block_hist" and v is not None:
                v = list(v)
            out[f.name] = v
        return out


check_dataclass(WindowRecord, RECORD, ordered=True)
# the fields decode_window checks one by one, by kind (the header and the two containers: by hand)
_KINDS = {f.name: f.kind for f in RECORD if f.default is not REQUIRED and f.kind not in ("text", "counts", "hist")}


def _is_num(v: Any) -> bool:
    """A finite number that converts to float (an int beyond int64 does not count)."""
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return -_MAX_INT <= v <= _MAX_INT
    return isinstance(v, float) and math.isfinite(v)


def _check(name: str, kind: str, v: Any) -> Any:
    """The value of a present field, checked (``WindowRecordError`` names it)."""
    if kind in ("int", "opt_int", "time"):
        ok = not isinstance(v, bool) and isinstance(v, int) and 0 <= v <= _MAX_INT
        if not ok and isinstance(v, float) and v.is_integer() and 0 <= v <= _MAX_INT:
            return int(v)  # JSON encoders may write 5.0 for 5
        if not ok:
            raise WindowRecordError(f"{name}: must be an int >= 0, got {show(v)}")
        return v
    if not _is_num(v) or v < 0:
        raise WindowRecordError(f"{name}: must be a finite number >= 0, got {show(v)}")
    if kind in ("rate", "opt_rate") and v > 1.0:
        raise WindowRecordError(f"{name}: must lie in [0, 1], got {show(v)}")
    return float(v)


def _text(obj: Mapping[str, Any], name: str) -> str:
    v = obj.get(name)
    if v is None:
        raise WindowRecordError(f"{name}: missing")
    if not isinstance(v, str) or not v or len(v) > 256:
        raise WindowRecordError(f"{name}: must be a non-empty string of at most 256 characters, got {show(v)}")
    return v


def decode_window(obj: Any) -> WindowRecord:
    """Decode one metrics record (a JSON object) into a :class:`WindowRecord`.

    Raises :class:`WindowRecordError` for anything that is not a window
    record of a known schema version, with the field in the message.
    """
    if not isinstance(obj, Mapping):
        raise WindowRecordError(f"record: must be a JSON object, got {type(obj).__name__}")
    version = obj.get("schema_version", METRICS_SCHEMA_VERSION)
    if version != METRICS_SCHEMA_VERSION or isinstance(version, bool):
        raise WindowRecordError(f"schema_version: {show(version)} is not {METRICS_SCHEMA_VERSION}")
    if obj.get("kind", "window") != "window":
        raise WindowRecordError(f"kind: {show(obj.get('kind'))} is not 'window'")
    scope = obj.get("scope")
    if scope not in ("zone", "node"):
        raise WindowRecordError(f"scope: must be 'zone' or 'node', got {show(scope)}")
    values: dict[str, Any] = {"scope": scope, "model": _text(obj, "model"), "zone": _text(obj, "zone")}
    if "window_end_ms" not in obj or obj["window_end_ms"] is None:
        raise WindowRecordError("window_end_ms: missing")
    values["window_end_ms"] = _check("window_end_ms", "time", obj["window_end_ms"])
    if scope == "node":
        values["node"] = _text(obj, "node")
    for name, kind in _KINDS.items():
        v = obj.get(name)
        if v is None:
            if not kind.startswith("opt_") and name in obj:
                raise WindowRecordError(f"{name}: must not be null")
            continue
        values[name] = _check(name, kind, v)
    counts = obj.get("agent_path_counts")
    if counts is not None:
        if not isinstance(counts, Mapping) or not all(
            p in AGENT_PATHS and not isinstance(c, bool) and isinstance(c, int) and 0 <= c <= _MAX_INT
            for p, c in counts.items()
        ):
            raise WindowRecordError(f"agent_path_counts: must map {AGENT_PATHS} to ints >= 0, got {show(counts)}")
        values["agent_path_counts"] = {p: int(c) for p, c in counts.items()}
    hist = obj.get("free_block_hist")
    if hist is not None:
        if (
            not isinstance(hist, list)
            or len(hist) > MAX_HIST_BINS
            or not all(not isinstance(c, bool) and isinstance(c, int) and 0 <= c <= _MAX_INT for c in hist)
        ):
            raise WindowRecordError(f"free_block_hist: must be a list of at most {MAX_HIST_BINS} ints >= 0")
        values["free_block_hist"] = tuple(hist)
    if "window_start_ms" not in values:
        span_ms = values.get("window_s", 0.0) * 1000.0
        if not math.isfinite(span_ms):  # a finite window_s past ~1.8e305 s overflows in ms
            raise WindowRecordError(f"window_s: {values['window_s']!r} s does not fit in milliseconds")
        values["window_start_ms"] = max(0, values["window_end_ms"] - round(span_ms))
    if values["window_start_ms"] > values["window_end_ms"]:
        raise WindowRecordError("window_start_ms: after window_end_ms")
    if values.get("stage_unfixable_rate", 0.0) > values.get("unfixable_rate", 0.0):
        raise WindowRecordError("stage_unfixable_rate: above unfixable_rate (a share of it)")
    return WindowRecord(**values)
