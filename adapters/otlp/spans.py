"""OpenTelemetry request spans -> governor request records (pure: no I/O, no clock).

``governor ingest otlp`` (:mod:`adapters.otlp.runner`) receives OTLP/HTTP
exports from inference engines and decodes each span into a :class:`Span`
(protobuf there; OTLP JSON here, :func:`spans_from_json`).  :func:`map_span`
turns one span into a ``kind: request`` record, or into the reason it cannot.

Which spans: vLLM's per-request span (name ``llm_request``, attributes from
``vllm.tracing.SpanAttributes``), or any span that carries its latency
attributes.  SGLang exports per-stage slice spans with no per-request
latency summary; only its request id (``rid``) is read, so an SGLang span
maps when its exporter adds the ``gen_ai.latency.*`` attributes below.

Mapping (latencies arrive in seconds, records are in ms):

==============================  =====================================================
record field                    source
==============================  =====================================================
``request_id``                  ``gen_ai.request.id``, else ``rid``, else trace+span id
``ts_ms``                       span end time (ns // 1e6)
``arrival_ms``                  span start time (vLLM starts the span at arrival)
``model``                       ``gen_ai.response.model``, else ``gen_ai.request.model``,
                                else resource ``governor.model``; then ``model_map``
``zone``                        resource ``governor.zone``, else
                                ``cloud.availability_zone``, else ``default_zone``
``node``                        resource ``governor.node``, else ``k8s.pod.name``,
                                ``k8s.node.name``, ``host.name``, ``service.instance.id``
``ttft_ms``                     ``gen_ai.latency.time_to_first_token`` * 1000 (an ERROR
                                span without it: ``e2e_ms``, i.e. the whole wait)
``e2e_ms``                      ``gen_ai.latency.e2e`` * 1000, else span duration
``queue_ms``                    ``gen_ai.latency.time_in_queue`` * 1000
``decode_ms``                   ``gen_ai.latency.time_in_model_decode`` * 1000
``itl_ms``                      (e2e_ms - ttft_ms) / max(output_tokens - 1, 1), when
                                output_tokens >= 1 (the mean gap after the first token)
``prompt_tokens``               ``gen_ai.usage.prompt_tokens`` (or ``.input_tokens``)
``output_tokens``               ``gen_ai.usage.completion_tokens`` (or ``.output_tokens``)
``status``                      span status ERROR -> ``error`` (``timeout`` when
                                ``error.type`` or the status message says timeout),
                                else ``ok``
``request_class``               ``governor.request_class`` (optional)
==============================  =====================================================

A span that cannot map gives a reason ``"label: detail"``; the label (text
before the colon) is bounded, for the drop counter.

>>> span = Span(name="llm_request", trace_id="ab", span_id="cd", start_ns=10**15, end_ns=10**15 + 9 * 10**8,
...             attributes={"gen_ai.request.id": "r1", "gen_ai.response.model": "llama2-70b",
...                         "gen_ai.latency.time_to_first_token": 0.1, "gen_ai.latency.e2e": 0.9,
...                         "gen_ai.usage.completion_tokens": 5},
...             resource={"governor.zone": "az-a", "k8s.pod.name": "vllm-0"})
>>> rec, why = map_span(span, MapOptions())
>>> why, rec["ttft_ms"], rec["e2e_ms"], rec["itl_ms"], rec["node"], rec["ts_ms"]
(None, 100.0, 900.0, 200.0, 'vllm-0', 1000000900)
>>> map_span(Span(name="http.get"), MapOptions())
(None, 'not_request_span: http.get')
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from governor_telemetry.records import show, validate_record

__all__ = [
    "DROP_LABELS",
    "MapOptions",
    "OtlpFormatError",
    "Span",
    "any_value",
    "drop_label",
    "map_span",
    "spans_from_json",
]

REQUEST_SPAN_NAMES = frozenset({"llm_request"})
TTFT = "gen_ai.latency.time_to_first_token"
E2E = "gen_ai.latency.e2e"
QUEUE = "gen_ai.latency.time_in_queue"
DECODE = "gen_ai.latency.time_in_model_decode"
PROMPT_TOKENS = ("gen_ai.usage.prompt_tokens", "gen_ai.usage.input_tokens")
OUTPUT_TOKENS = ("gen_ai.usage.completion_tokens", "gen_ai.usage.output_tokens")
REQUEST_ID = ("gen_ai.request.id", "rid")
MODEL = ("gen_ai.response.model", "gen_ai.request.model")
ZONE_KEYS = ("governor.zone", "cloud.availability_zone")
NODE_KEYS = ("governor.node", "k8s.pod.name", "k8s.node.name", "host.name", "service.instance.id")
STATUS_ERROR = 2  # OTLP Status.StatusCode STATUS_CODE_ERROR
_STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}

#: Every label a drop reason starts with (the counter's label set is closed).
DROP_LABELS = (
    "not_request_span",
    "no_end_time",
    "bad_attribute",
    "no_ttft",
    "no_model",
    "unknown_model",
    "no_zone",
    "unknown_zone",
    "no_node",
    "invalid_record",
)


class OtlpFormatError(ValueError):
    """The body is not an OTLP trace export (wrong shape): the whole request is refused."""


@dataclass(frozen=True)
class Span:
    """One span, decoded from either encoding: ids in hex, times in ns since the epoch."""

    name: str
    trace_id: str = ""
    span_id: str = ""
    start_ns: int = 0
    end_ns: int = 0
    status_code: int = 0
    status_message: str = ""
    attributes: Mapping[str, Any] = field(default_factory=dict)
    resource: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MapOptions:
    """``default_zone`` for spans whose resource names none; ``model_map`` renames served
    model names to governor's; ``zones``/``models`` (when given) refuse any other."""

    default_zone: str = ""
    model_map: Mapping[str, str] = field(default_factory=dict)
    zones: frozenset[str] | None = None
    models: frozenset[str] | None = None


def drop_label(reason: str) -> str:
    """The bounded label of a drop reason.

    >>> drop_label("no_zone: span r1")
    'no_zone'
    """
    return reason.split(":", 1)[0]


def _seconds(attrs: Mapping[str, Any], key: str) -> float | None | str:
    """The attribute as a finite number >= 0 (None: absent; str: why it is bad)."""
    value = attrs.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return f"bad_attribute: {key}={show(value)}"
    return float(value)


def _count(attrs: Mapping[str, Any], keys: tuple[str, ...]) -> int | None | str:
    for key in keys:
        value = attrs.get(key)
        if value is None:
            continue
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"bad_attribute: {key}={show(value)}"
        return value
    return None


def _first_str(attrs: Mapping[str, Any], keys: tuple[str, ...]) -> str:
    for key in keys:
        value = attrs.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, int) and not isinstance(value, bool):  # a numeric request id
            return str(value)
    return ""


def is_request_span(span: Span) -> bool:
    return span.name in REQUEST_SPAN_NAMES or TTFT in span.attributes or E2E in span.attributes


def map_span(span: Span, opts: MapOptions) -> tuple[dict[str, Any] | None, str | None]:
    """``(record, None)``, or ``(None, reason)`` when the span cannot be a request record."""
    if not is_request_span(span):
        return None, f"not_request_span: {show(span.name)[1:-1]}"
    attrs = span.attributes
    if span.end_ns <= 0:
        return None, "no_end_time: span has no end time"
    ttft_s, e2e_s, queue_s, decode_s = (_seconds(attrs, k) for k in (TTFT, E2E, QUEUE, DECODE))
    prompt, output = _count(attrs, PROMPT_TOKENS), _count(attrs, OUTPUT_TOKENS)
    for value in (ttft_s, e2e_s, queue_s, decode_s, prompt, output):
        if isinstance(value, str):
            return None, value
    error = span.status_code == STATUS_ERROR
    if isinstance(e2e_s, float):
        e2e_ms = e2e_s * 1000.0
    elif span.start_ns > 0 and span.end_ns >= span.start_ns:
        e2e_ms = (span.end_ns - span.start_ns) / 1e6
    else:
        return None, "no_ttft: no gen_ai.latency.e2e and no span duration"
    if isinstance(ttft_s, float):
        ttft_ms = ttft_s * 1000.0
    elif error:
        ttft_ms = e2e_ms  # failed before (or without) a first token: the client waited e2e
    else:
        return None, f"no_ttft: {TTFT} missing"

    model = _first_str(attrs, MODEL) or _first_str(span.resource, ("governor.model",))
    if not model:
        return None, "no_model: no gen_ai.response.model"
    model = opts.model_map.get(model, model)
    if opts.models is not None and model not in opts.models:
        return None, f"unknown_model: {show(model)}"
    zone = _first_str(span.resource, ZONE_KEYS) or opts.default_zone
    if not zone:
        return None, "no_zone: no governor.zone or cloud.availability_zone resource attribute, no --zone"
    if opts.zones is not None and zone not in opts.zones:
        return None, f"unknown_zone: {show(zone)}"
    node = _first_str(span.resource, NODE_KEYS)
    if not node:
        return None, "no_node: no governor.node, k8s.pod.name, k8s.node.name, host.name or service.instance.id"

    status = "ok"
    if error:
        why = f"{attrs.get('error.type', '')} {span.status_message}".lower()
        status = "timeout" if "timeout" in why or "timed out" in why else "error"
    rec: dict[str, Any] = {
        "kind": "request",
        "request_id": _first_str(attrs, REQUEST_ID) or f"{span.trace_id}{span.span_id}" or "otlp",
        "ts_ms": span.end_ns // 1_000_000,
        "model": model,
        "zone": zone,
        "node": node,
        "ttft_ms": ttft_ms,
        "e2e_ms": e2e_ms,
        "status": status,
    }
    if span.start_ns > 0:
        rec["arrival_ms"] = span.start_ns // 1_000_000
    if isinstance(queue_s, float):
        rec["queue_ms"] = queue_s * 1000.0
    if isinstance(decode_s, float):
        rec["decode_ms"] = decode_s * 1000.0
    if isinstance(prompt, int):
        rec["prompt_tokens"] = prompt
    if isinstance(output, int):
        rec["output_tokens"] = output
        if output >= 1:
            rec["itl_ms"] = max(e2e_ms - ttft_ms, 0.0) / max(output - 1, 1)
    request_class = attrs.get("governor.request_class")
    if isinstance(request_class, str) and request_class:
        rec["request_class"] = request_class
    reason = validate_record(rec)
    if reason is not None:
        return None, f"invalid_record: {reason}"
    return rec, None


# -- OTLP JSON (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding) ----------


def any_value(value: Any) -> Any:
    """An OTLP JSON ``AnyValue`` as a Python scalar (None: empty or not a scalar).

    int64 arrives as a decimal string or a number; a double may be "NaN"/"Infinity".

    >>> any_value({"intValue": "42"}), any_value({"doubleValue": 0.5}), any_value({"stringValue": "x"})
    (42, 0.5, 'x')
    >>> any_value({"arrayValue": {"values": []}}) is None
    True
    """
    if not isinstance(value, Mapping):
        return None
    if "stringValue" in value:
        s = value["stringValue"]
        return s if isinstance(s, str) else None
    if "boolValue" in value:
        b = value["boolValue"]
        return b if isinstance(b, bool) else None
    if "intValue" in value:
        i = value["intValue"]
        if isinstance(i, bool):
            return None
        if isinstance(i, int):
            return i
        try:
            return int(i) if isinstance(i, str) else None
        except ValueError:
            return None
    if "doubleValue" in value:
        d = value["doubleValue"]
        if isinstance(d, bool):
            return None
        if isinstance(d, int | float):
            return float(d)
        try:
            return float(d) if isinstance(d, str) else None
        except ValueError:
            return None
    return None


def _attributes(items: Any) -> dict[str, Any]:
    if items is None:
        return {}
    if not isinstance(items, list):
        raise OtlpFormatError("attributes must be a list")
    out: dict[str, Any] = {}
    for kv in items:
        if not isinstance(kv, Mapping) or not isinstance(kv.get("key"), str):
            raise OtlpFormatError("an attribute must be an object with a string key")
        out[kv["key"]] = any_value(kv.get("value"))
    return out


def _nanos(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return 0


def _hex_id(value: Any) -> str:
    """OTLP JSON ids are hex; accept base64 (protobuf's canonical JSON) too."""
    if not isinstance(value, str):
        return ""
    if all(c in "0123456789abcdefABCDEF" for c in value):
        return value.lower()
    try:
        return base64.b64decode(value, validate=True).hex()
    except ValueError:
        return ""


def _list(obj: Mapping[str, Any], key: str) -> list[Any]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise OtlpFormatError(f"{key} must be a list")
    for item in value:
        if not isinstance(item, Mapping):
            raise OtlpFormatError(f"an item of {key} must be an object")
    return value


def spans_from_json(obj: Any) -> list[Span]:
    """The spans of a decoded OTLP JSON ``ExportTraceServiceRequest``.

    Raises :class:`OtlpFormatError` for a body of the wrong shape; a span with
    a bad field decodes with that field empty (and :func:`map_span` drops it).

    >>> body = {"resourceSpans": [{"resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "h"}}]},
    ...          "scopeSpans": [{"spans": [{"name": "llm_request", "endTimeUnixNano": "5", "status": {"code": 2}}]}]}]}
    >>> s = spans_from_json(body)[0]
    >>> s.name, s.end_ns, s.status_code, s.resource
    ('llm_request', 5, 2, {'host.name': 'h'})
    """
    if not isinstance(obj, Mapping):
        raise OtlpFormatError("body must be a JSON object")
    spans: list[Span] = []
    for rs in _list(obj, "resourceSpans"):
        resource = rs.get("resource") or {}
        if not isinstance(resource, Mapping):
            raise OtlpFormatError("resource must be an object")
        res_attrs = _attributes(resource.get("attributes"))
        for ss in _list(rs, "scopeSpans"):
            for sp in _list(ss, "spans"):
                status = sp.get("status") or {}
                if not isinstance(status, Mapping):
                    raise OtlpFormatError("status must be an object")
                code = status.get("code", 0)
                code = _STATUS_NAMES.get(code, 0) if isinstance(code, str) else code
                message = status.get("message", "")
                name = sp.get("name", "")
                spans.append(
                    Span(
                        name=name if isinstance(name, str) else "",
                        trace_id=_hex_id(sp.get("traceId")),
                        span_id=_hex_id(sp.get("spanId")),
                        start_ns=_nanos(sp.get("startTimeUnixNano")),
                        end_ns=_nanos(sp.get("endTimeUnixNano")),
                        status_code=code if isinstance(code, int) and not isinstance(code, bool) else 0,
                        status_message=message if isinstance(message, str) else "",
                        attributes=_attributes(sp.get("attributes")),
                        resource=res_attrs,
                    )
                )
    return spans
