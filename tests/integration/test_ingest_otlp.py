"""``governor ingest otlp`` against the real embedded broker, fed by the real OpenTelemetry SDK.

The receiver runs in-process on a free port; a ``TracerProvider`` with the real
``OTLPSpanExporter`` (OTLP/HTTP protobuf) emits 20 spans named and attributed
like vLLM's ``llm_request`` spans; the telemetry topic then holds 20 valid
request records with the spans' numbers.  An OTLP JSON body posted with urllib
maps the same way; a malformed body is a 400, an oversized one a 413.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from governor_telemetry.records import decode_envelope, validate_record
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from adapters.otlp.runner import serving
from adapters.otlp.spans import MapOptions
from core.settings import Settings
from core.transport import kafka_options
from launch.embedded import free_port
from launch.topics import ensure_topics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SERVED = "meta-llama/Llama-2-70b-hf"
OPTS = MapOptions(model_map={SERVED: "llama2-70b"}, zones=frozenset({"az-a", "az-b"}), models=frozenset({"llama2-70b"}))


def _attrs(i: int) -> dict[str, Any]:
    """vLLM's SpanAttributes for request i: ttft (i+1)*10 ms, e2e 500 + 20 i ms, 2 i + 3 tokens."""
    return {
        "gen_ai.request.id": f"cmpl-{i}",
        "gen_ai.response.model": SERVED,
        "gen_ai.request.max_tokens": 256,
        "gen_ai.usage.prompt_tokens": 100 + i,
        "gen_ai.usage.completion_tokens": 2 * i + 3,
        "gen_ai.latency.time_to_first_token": (i + 1) * 0.01,
        "gen_ai.latency.e2e": 0.5 + 0.02 * i,
        "gen_ai.latency.time_in_queue": 0.001 * i,
        "gen_ai.latency.time_in_model_prefill": 0.005,
        "gen_ai.latency.time_in_model_decode": 0.3,
    }


def _emit_spans(port: int, n: int) -> None:
    """The real SDK and OTLP/HTTP exporter, as vLLM sets them up (runs in a thread: it blocks)."""
    provider = TracerProvider(
        resource=Resource.create({"service.name": "vllm", "governor.zone": "az-b", "k8s.pod.name": "vllm-0"})
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces")))
    tracer = provider.get_tracer("vllm.v1.engine.output_processor")
    now = time.time_ns()
    for i in range(n):
        start = now - 2_000_000_000 + i * 1_000_000
        span = tracer.start_span("llm_request", kind=SpanKind.SERVER, start_time=start, attributes=_attrs(i))
        if i == n - 1:
            span.set_status(Status(StatusCode.ERROR, "engine error"))
        span.end(end_time=start + int((0.5 + 0.02 * i) * 1e9))
    # a span that is not a request (an HTTP server span from an instrumented front end): counted, not a record
    tracer.start_span("POST /v1/completions").end()
    assert provider.force_flush(10_000)
    provider.shutdown()


def _post(port: int, body: bytes, ctype: str) -> tuple[int, bytes]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/traces", data=body, method="POST", headers={"Content-Type": ctype}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _json_body(i: int) -> bytes:
    def kv(key: str, value: Any) -> dict[str, Any]:
        if isinstance(value, str):
            return {"key": key, "value": {"stringValue": value}}
        if isinstance(value, int):
            return {"key": key, "value": {"intValue": str(value)}}
        return {"key": key, "value": {"doubleValue": value}}

    end = time.time_ns()
    span = {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": "eee19b7ec3c1b174",
        "name": "llm_request",
        "kind": 2,
        "startTimeUnixNano": str(end - 700_000_000),
        "endTimeUnixNano": str(end),
        "attributes": [kv(k, v) for k, v in _attrs(i).items()],
        "status": {"code": 0},
    }
    resource = {"attributes": [kv("governor.zone", "az-a"), kv("host.name", "gpu-node-9")]}
    return json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": [span]}]}]}).encode()


async def _read_records(settings: Settings, want: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    consumer = AIOKafkaConsumer(
        settings.topic("telemetry"),
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=100,
        **kafka_options(settings),
    )
    await consumer.start()
    records: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(records) < want and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for messages in batches.values():
                for msg in messages:
                    records.extend(decode_envelope(msg.value))
    finally:
        await consumer.stop()
    return records


async def test_sdk_spans_and_json_bodies_become_valid_request_records(settings: Settings) -> None:
    await ensure_topics(settings)
    port = free_port()
    async with serving(settings, OPTS, "127.0.0.1", port, max_body_bytes=1 << 20) as receiver:
        t0 = time.monotonic()
        await asyncio.to_thread(_emit_spans, port, 20)
        sdk_s = time.monotonic() - t0

        status, body = await asyncio.to_thread(_post, port, _json_body(42), "application/json")
        assert (status, json.loads(body)) == (200, {})
        status, body = await asyncio.to_thread(
            _post, port, b'{"resourceSpans": [{"scopeSpans": 7}]}', "application/json"
        )
        assert status == 400, body
        status, _ = await asyncio.to_thread(_post, port, b"\x0a\xff\x01", "application/x-protobuf")
        assert status == 400
        status, _ = await asyncio.to_thread(_post, port, b"{" + b" " * ((1 << 20) + 1024) + b"}", "application/json")
        assert status == 413
        # a request span that cannot map (no model) is rejected in the answer, not produced
        bad = _json_body(7).replace(b"gen_ai.response.model", b"gen_ai.other.model")
        status, body = await asyncio.to_thread(_post, port, bad, "application/json")
        assert status == 200 and json.loads(body)["partialSuccess"]["rejectedSpans"] == "1"
        counts = dict(receiver.counts)
    assert counts == {"record": 21, "not_request_span": 1, "no_model": 1}, counts

    records = await _read_records(settings, 21)
    print(f"20 SDK spans exported in {sdk_s:.2f} s; {len(records)} records read back")
    assert len(records) == 21
    assert all(validate_record(r) is None for r in records), [validate_record(r) for r in records]
    by_id = {r["request_id"]: r for r in records}
    for i in range(20):
        r = by_id[f"cmpl-{i}"]
        assert (r["model"], r["zone"], r["node"]) == ("llama2-70b", "az-b", "vllm-0")
        assert r["ttft_ms"] == pytest.approx((i + 1) * 10.0)
        assert r["e2e_ms"] == pytest.approx(500.0 + 20.0 * i)
        assert r["itl_ms"] == pytest.approx((500.0 + 20.0 * i - (i + 1) * 10.0) / (2 * i + 2))
        assert r["queue_ms"] == pytest.approx(1.0 * i) and r["decode_ms"] == pytest.approx(300.0)
        assert (r["prompt_tokens"], r["output_tokens"]) == (100 + i, 2 * i + 3)
        assert r["status"] == ("error" if i == 19 else "ok")
        assert r["ts_ms"] - r["arrival_ms"] == pytest.approx(500 + 20 * i, abs=1)
    j = by_id["cmpl-42"]
    assert (j["zone"], j["node"], j["ttft_ms"], j["status"]) == ("az-a", "gpu-node-9", pytest.approx(430.0), "ok")


async def test_the_simulated_fleets_spans_reach_the_receiver_whole(settings: Settings) -> None:
    """``governor demo --telemetry otlp``'s exporter (sim/otlp_export.py) against the real receiver: each finished
    request of the simulated fleet becomes one span and comes back as the same request record."""
    from sim.otlp_export import OtlpExporter

    await ensure_topics(settings)
    port = free_port()
    now = int(time.time() * 1000)
    finished = [
        {
            "kind": "request",
            "request_id": f"sim-{i}",
            "ts_ms": now + i,
            "model": "llama2-70b",
            "zone": "az-a" if i % 2 else "az-b",
            "node": f"az-a/llama2-70b/r{i % 3}",
            "ttft_ms": 100.0 + i,
            "itl_ms": 20.0,
            "e2e_ms": 100.0 + i + 20.0 * 9,
            "queue_ms": 5.0,
            "prompt_tokens": 200 + i,
            "output_tokens": 10,
            "status": "ok",
        }
        for i in range(30)
    ]
    opts = MapOptions(model_map={}, zones=frozenset({"az-a", "az-b"}), models=frozenset({"llama2-70b"}))
    async with serving(settings, opts, "127.0.0.1", port) as receiver:
        exporter = OtlpExporter(f"http://127.0.0.1:{port}/v1/traces", max_batch=8)
        exporter.add(finished)
        assert await exporter.flush()
        await exporter.close()
        assert (exporter.exported, exporter.dropped) == (30, 0)
        assert dict(receiver.counts) == {"record": 30}
    records = {r["request_id"]: r for r in await _read_records(settings, 30)}
    assert set(records) == {f"sim-{i}" for i in range(30)}
    for rec in finished:
        got = records[rec["request_id"]]
        assert validate_record(got) is None
        assert (got["zone"], got["model"], got["prompt_tokens"], got["output_tokens"]) == (
            rec["zone"],
            rec["model"],
            rec["prompt_tokens"],
            rec["output_tokens"],
        )
        assert got["ttft_ms"] == pytest.approx(rec["ttft_ms"], abs=0.01)
        assert got["e2e_ms"] == pytest.approx(rec["e2e_ms"], abs=0.01)
