"""Simulated replicas export one OTLP span per finished request, as vLLM does with ``--otlp-traces-endpoint``.

:func:`export_request` builds the protobuf ``ExportTraceServiceRequest`` (OTLP/HTTP,
``POST /v1/traces``, ``Content-Type: application/x-protobuf``) of a batch of simulated
request records: one resource per replica (``service.name=vllm``, ``governor.zone``,
``governor.node``), one span ``llm_request`` per request with vLLM's attribute names
(``vllm.tracing.SpanAttributes``, read back by :mod:`adapters.otlp.spans`):

==========================================  ====================================
span attribute                              simulated request record
==========================================  ====================================
``gen_ai.request.id``                       ``request_id``
``gen_ai.response.model``                   ``model``
``gen_ai.latency.time_to_first_token``      ``ttft_ms / 1000``
``gen_ai.latency.e2e``                      ``e2e_ms / 1000``
``gen_ai.latency.time_in_queue``            ``queue_ms / 1000``
``gen_ai.latency.time_in_model_decode``     ``decode_ms / 1000``
``gen_ai.usage.prompt_tokens``              ``prompt_tokens``
``gen_ai.usage.completion_tokens``          ``output_tokens``
span start / end                            ``arrival_ms`` / ``ts_ms`` (trace time)
status                                      ERROR when ``status`` is not ``ok``
                                            (``error.type=timeout`` for timeouts)
==========================================  ====================================

The receiver derives ITL as ``(e2e - ttft) / (output_tokens - 1)``; the simulator's
own ``itl_ms`` is ``decode_ms / output_tokens``, so OTLP-mode ITL runs slightly
higher than the native one (by ``output / (output - 1)``).

vLLM's spans carry no GPU state, so in OTLP mode the fleet keeps sending its native
GPU records (:class:`OtlpEngines` passes them through): a real deployment pairs the
spans with a node exporter or the scrape adapter's GPU records.

:class:`OtlpExporter` batches (at most ``max_batch`` spans a POST) and holds at most
``max_pending`` spans while the receiver is away; beyond that the oldest are
dropped and counted, as the OpenTelemetry SDK's batch processor does.

>>> body = export_request([{"request_id": "r1", "model": "m", "zone": "az-a", "node": "n0", "ts_ms": 2000,
...                         "arrival_ms": 1000, "ttft_ms": 100.0, "e2e_ms": 900.0, "output_tokens": 5,
...                         "status": "ok"}])
>>> from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
>>> sp = ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans[0]
>>> sp.name, sp.end_time_unix_nano, {a.key: a.value.double_value for a in sp.attributes}["gen_ai.latency.e2e"]
('llm_request', 2000000000, 0.9)
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span, Status

__all__ = ["OtlpEngines", "OtlpExporter", "export_request"]

log = logging.getLogger(__name__)

PROTOBUF = "application/x-protobuf"
_SECONDS = (
    ("gen_ai.latency.time_to_first_token", "ttft_ms"),
    ("gen_ai.latency.e2e", "e2e_ms"),
    ("gen_ai.latency.time_in_queue", "queue_ms"),
    ("gen_ai.latency.time_in_model_decode", "decode_ms"),
)
_COUNTS = (("gen_ai.usage.prompt_tokens", "prompt_tokens"), ("gen_ai.usage.completion_tokens", "output_tokens"))


def _kv(key: str, value: str | int | float) -> KeyValue:
    kv = KeyValue(key=key)
    if isinstance(value, str):
        kv.value.string_value = value
    elif isinstance(value, int):
        kv.value.int_value = value
    else:
        kv.value.double_value = value
    return kv


def _span(rec: Mapping[str, Any]) -> Span:
    rid = str(rec.get("request_id", ""))
    digest = hashlib.blake2b(rid.encode(), digest_size=24).digest()
    end_ms = int(rec["ts_ms"])
    start_ms = int(rec.get("arrival_ms", end_ms - float(rec.get("e2e_ms", 0.0))))
    sp = Span(
        trace_id=digest[:16],
        span_id=digest[16:],
        name="llm_request",
        kind=Span.SPAN_KIND_SERVER,
        start_time_unix_nano=max(0, start_ms) * 1_000_000,
        end_time_unix_nano=end_ms * 1_000_000,
    )
    attrs = [_kv("gen_ai.request.id", rid), _kv("gen_ai.response.model", str(rec["model"]))]
    for key, field in _SECONDS:
        v = rec.get(field)
        if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0:
            attrs.append(_kv(key, float(v) / 1000.0))
    for key, field in _COUNTS:
        v = rec.get(field)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            attrs.append(_kv(key, v))
    status = rec.get("status", "ok")
    if status != "ok":
        attrs.append(_kv("error.type", str(status)))
        sp.status.CopyFrom(Status(code=Status.STATUS_CODE_ERROR, message=str(status)))
    sp.attributes.extend(attrs)
    return sp


def export_request(records: Iterable[Mapping[str, Any]]) -> bytes:
    """The serialised ``ExportTraceServiceRequest`` of these request records (one resource per node)."""
    by_node: dict[tuple[str, str], list[Span]] = {}
    for rec in records:
        by_node.setdefault((str(rec["zone"]), str(rec["node"])), []).append(_span(rec))
    req = ExportTraceServiceRequest()
    for (zone, node), spans in by_node.items():
        rs = ResourceSpans()
        rs.resource.attributes.extend(
            [_kv("service.name", "vllm"), _kv("governor.zone", zone), _kv("governor.node", node)]
        )
        ss = rs.scope_spans.add()
        ss.scope.name = "vllm.sim"
        ss.spans.extend(spans)
        req.resource_spans.append(rs)
    return bytes(req.SerializeToString())


class OtlpExporter:
    """Batched OTLP/HTTP export of request records to ``url`` (``.../v1/traces``)."""

    def __init__(self, url: str, *, max_batch: int = 512, max_pending: int = 50_000, timeout_s: float = 5.0) -> None:
        self.url = url
        self.max_batch = max_batch
        self.pending: deque[Mapping[str, Any]] = deque(maxlen=max_pending)
        self.timeout_s = timeout_s
        self.exported = 0
        self.dropped = 0
        self.failed_posts = 0
        self._session: aiohttp.ClientSession | None = None

    def add(self, records: Iterable[Mapping[str, Any]]) -> None:
        for rec in records:
            if len(self.pending) == self.pending.maxlen:
                self.dropped += 1  # the deque drops the oldest
            self.pending.append(rec)

    async def flush(self) -> bool:
        """POST everything pending; False (and the batch kept) when the receiver refuses or is away."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        while self.pending:
            batch = [self.pending[i] for i in range(min(self.max_batch, len(self.pending)))]
            try:
                async with self._session.post(
                    self.url, data=export_request(batch), headers={"Content-Type": PROTOBUF}
                ) as resp:
                    await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                self.failed_posts += 1
                log.warning("OTLP export to %s failed: %s", self.url, exc)
                return False
            if status >= 500 or status == 429:  # retryable: keep the batch
                self.failed_posts += 1
                return False
            if status >= 400:  # the receiver refused the body: retrying cannot help
                log.warning("OTLP export refused (%d): %d spans dropped", status, len(batch))
                self.dropped += len(batch)
            else:
                self.exported += len(batch)
            for _ in batch:
                self.pending.popleft()
        return True

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class OtlpEngines:
    """LiveFleet sink for OTLP mode: requests become spans, GPU records stay native."""

    mode = "otlp"

    def __init__(self, exporter: OtlpExporter, flush_every_s: float = 1.0) -> None:
        self.exporter = exporter
        self.flush_every_s = flush_every_s  # trace seconds between exports
        self._last = -1e9

    def finished(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.exporter.add(records)
        return []

    def gpu(self, snaps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return snaps

    async def sync(self, t_s: float) -> None:
        if t_s - self._last >= self.flush_every_s or len(self.exporter.pending) >= self.exporter.max_batch:
            self._last = t_s
            await self.exporter.flush()

    async def finish(self) -> None:
        """Export what is left, with a short retry."""
        for _ in range(3):
            if await self.exporter.flush():
                break
            await asyncio.sleep(0.5)

    async def close(self) -> None:
        await self.exporter.close()

    def stats(self) -> Mapping[str, Any]:
        e = self.exporter
        return {"spans_exported": e.exported, "spans_dropped": e.dropped, "failed_posts": e.failed_posts}
