"""The otlp path of ``governor demo --platform local``: the span sink that holds the receiver's port
while the demo profiles the first engine (bench.local_demo._SpanSink).

The real OpenTelemetry SDK and OTLP/HTTP exporter (as vLLM sets them up) export to the sink: the
export succeeds (so nothing queues in the engine's exporter to reach ``governor ingest otlp`` later
as late records), and once stopped the sink leaves the port free for the receiver."""

from __future__ import annotations

import asyncio
import socket

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench.local_demo import _SpanSink
from engines.pool import free_port as _free_port


def _export(port: int) -> bool:
    """Three llm_request spans through the real exporter; True when it reported success."""
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=5)
    provider = TracerProvider(resource=Resource.create({"governor.zone": "az-a"}))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("vllm.llm_engine")
    for i in range(3):
        tracer.start_span("llm_request", attributes={"gen_ai.latency.e2e": 0.1 * (i + 1)}).end()
    ok = exporter.export(memory.get_finished_spans()).name == "SUCCESS"
    exporter.shutdown()  # type: ignore[no-untyped-call]
    provider.shutdown()
    return ok


async def test_the_sink_takes_the_engines_exports_and_frees_the_port_when_stopped() -> None:
    port = _free_port()
    sink = _SpanSink(port)
    await sink.start()
    try:
        assert await asyncio.to_thread(_export, port)
        assert sink.spans_bytes > 0
    finally:
        await sink.stop()
    with socket.socket() as s:  # the receiver can bind it now
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
    await sink.stop()  # stopping twice is harmless (the demo's finally stops it again)
