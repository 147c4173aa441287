"""``governor ingest otlp``: an OTLP/HTTP trace receiver that turns engine request spans into telemetry.

vLLM (``--otlp-traces-endpoint``, ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``)
and SGLang export spans to ``POST /v1/traces``; each request span becomes a
``kind: request`` record (:mod:`adapters.otlp.spans` has the mapping table)
on the telemetry topic, produced with :class:`TelemetryProducer` like any
inference node's records.

- Bodies: ``application/x-protobuf`` (``ExportTraceServiceRequest``) or
  ``application/json`` (OTLP JSON: camelCase keys, hex ids, enums as ints),
  optionally ``Content-Encoding: gzip``.
- Answers: 200 with an ``ExportTraceServiceResponse`` in the request's
  encoding (``partial_success.rejected_spans`` counts request spans that could
  not map); 400 for a malformed body, 413 above ``--max-body-mib`` (also after
  gunzip), 415 for another content type, 503 (``Retry-After``) while the
  producer's buffer is full, so the exporter retries instead of losing spans.
- Drops never crash the receiver: each is counted by its bounded label
  (``GET /metrics``: ``governor_otlp_spans_total{result=...}``) and logged
  (the first of each label, then every 1000th).  Spans that are not request
  spans (``not_request_span``) are counted but not reported as rejected.

The receiver has no authentication: it listens on 127.0.0.1 unless ``--host``
says otherwise; expose it only on a network the engines alone can reach.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import socket
import sys
import zlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson

from adapters.otlp.spans import (
    DROP_LABELS,
    MapOptions,
    OtlpFormatError,
    Span,
    drop_label,
    map_span,
    spans_from_json,
)
from core.settings import Settings
from core.transport import kafka_options

# aiohttp, protobuf, prometheus_client and the producer load when the receiver runs, not when
# ``governor`` builds its parser (they would add ~0.15 s to every command's start).
if TYPE_CHECKING:
    from aiohttp import web
    from governor_telemetry.producer import TelemetryProducer

log = logging.getLogger(__name__)

TRACES_PATH = "/v1/traces"
DEFAULT_PORT = 4318  # the OTLP/HTTP port
DEFAULT_MAX_BODY = 4 * 1024 * 1024
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_LOG_EVERY = 1000


class BodyError(Exception):
    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def _pb_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        return getattr(value, kind)
    return None  # arrays, maps, bytes: no request field needs them


def spans_from_protobuf(body: bytes) -> list[Span]:
    """The spans of a protobuf ``ExportTraceServiceRequest`` (raises BodyError 400 when malformed)."""
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    try:
        req = ExportTraceServiceRequest.FromString(body)
    except (DecodeError, ValueError) as exc:
        raise BodyError(400, f"not an ExportTraceServiceRequest: {exc}") from exc
    spans: list[Span] = []
    for rs in req.resource_spans:
        res = {kv.key: _pb_value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for sp in ss.spans:
                spans.append(
                    Span(
                        name=sp.name,
                        trace_id=sp.trace_id.hex(),
                        span_id=sp.span_id.hex(),
                        start_ns=sp.start_time_unix_nano,
                        end_ns=sp.end_time_unix_nano,
                        status_code=sp.status.code,
                        status_message=sp.status.message,
                        attributes={kv.key: _pb_value(kv.value) for kv in sp.attributes},
                        resource=res,
                    )
                )
    return spans


def decode_body(body: bytes, content_type: str, encoding: str, max_bytes: int) -> tuple[list[Span], bool]:
    """``(spans, is_json)``; raises :class:`BodyError` with the HTTP status to answer."""
    encoding = encoding.strip().lower()
    if encoding == "gzip":
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            body = inflater.decompress(body, max_bytes + 1)
        except zlib.error as exc:
            raise BodyError(400, f"bad gzip body: {exc}") from exc
        if len(body) > max_bytes or inflater.unconsumed_tail:
            raise BodyError(413, f"body is over {max_bytes} bytes once decompressed")
    elif encoding not in ("", "identity"):
        raise BodyError(415, f"unsupported Content-Encoding {encoding!r} (gzip or none)")
    ctype = content_type.split(";", 1)[0].strip().lower()
    if ctype == PROTOBUF:
        return spans_from_protobuf(body), False
    if ctype == JSON:
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BodyError(400, f"not JSON: {exc}") from exc
        try:
            return spans_from_json(obj), True
        except OtlpFormatError as exc:
            raise BodyError(400, f"not an OTLP JSON trace export: {exc}") from exc
    raise BodyError(415, f"unsupported Content-Type {ctype!r} ({PROTOBUF} or {JSON})")


def _response(is_json: bool, rejected: int, message: str) -> web.Response:
    from aiohttp import web
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    if is_json:
        obj: dict[str, Any] = {}
        if rejected:
            obj["partialSuccess"] = {"rejectedSpans": str(rejected), "errorMessage": message}
        return web.Response(body=orjson.dumps(obj), content_type=JSON)
    resp = ExportTraceServiceResponse()
    if rejected:
        resp.partial_success.rejected_spans = rejected
        resp.partial_success.error_message = message
    return web.Response(body=resp.SerializeToString(), content_type=PROTOBUF)


class OtlpReceiver:
    """The HTTP handlers; records go to ``producer`` (a started :class:`TelemetryProducer`)."""

    def __init__(self, producer: TelemetryProducer, opts: MapOptions, max_body_bytes: int = DEFAULT_MAX_BODY) -> None:
        self.producer = producer
        self.opts = opts
        self.max_body_bytes = max_body_bytes
        from prometheus_client import CollectorRegistry
        from prometheus_client import Counter as PromCounter

        self.counts: Counter[str] = Counter()  # "record" and the drop labels
        self.registry = CollectorRegistry()
        self._spans = PromCounter(
            "governor_otlp_spans",
            "OTLP spans received, by result (record or drop label)",
            ["result"],
            registry=self.registry,
        )
        self._bodies = PromCounter(
            "governor_otlp_requests", "OTLP export requests, by HTTP status", ["status"], registry=self.registry
        )
        for label in ("record", *DROP_LABELS):
            self._spans.labels(label)

    def app(self) -> web.Application:
        from aiohttp import web

        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_post(TRACES_PATH, self.handle_traces)
        app.router.add_get("/metrics", self.handle_metrics)
        app.router.add_get("/healthz", self.handle_health)
        return app

    def _count(self, result: str, detail: str = "") -> None:
        self.counts[result] += 1
        self._spans.labels(result).inc()
        n = self.counts[result]
        if result != "record" and (n == 1 or n % _LOG_EVERY == 0):
            level = logging.DEBUG if result == "not_request_span" else logging.WARNING
            log.log(level, "OTLP span dropped (%s, %d so far): %s", result, n, detail)

    def _answer(self, status: int, why: str) -> web.Response:
        from aiohttp import web

        self._bodies.labels(str(status)).inc()
        if status >= 500:
            return web.Response(status=status, text=why, headers={"Retry-After": "1"})
        return web.Response(status=status, text=why)

    async def handle_traces(self, request: web.Request) -> web.Response:
        from aiohttp import web

        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._answer(413, f"body is over {self.max_body_bytes} bytes")
        try:
            spans, is_json = decode_body(
                body, request.content_type, request.headers.get("Content-Encoding", ""), self.max_body_bytes
            )
        except BodyError as exc:
            log.warning("OTLP export refused (%d): %s", exc.status, str(exc)[:300])
            return self._answer(exc.status, str(exc))
        records: list[dict[str, Any]] = []
        drops: list[tuple[str, str]] = []
        for span in spans:
            rec, reason = map_span(span, self.opts)
            if rec is not None:
                records.append(rec)
            else:
                drops.append((drop_label(reason or "invalid_record"), reason or ""))
        if self.producer.pending + len(records) > self.producer.max_pending:
            return self._answer(503, "telemetry producer buffer full; retry")
        for rec in records:
            try:
                self.producer.send_nowait(rec)
            except ValueError as exc:  # the producer's own record check: a drop, never a crash
                drops.append(("invalid_record", f"invalid_record: {exc}"))
                continue
            self._count("record")
        for label, reason in drops:
            self._count(label, reason)
        rejected = [reason for label, reason in drops if label != "not_request_span"]
        self._bodies.labels("200").inc()
        return _response(is_json, len(rejected), rejected[0] if rejected else "")

    async def handle_metrics(self, request: web.Request) -> web.Response:
        from aiohttp import web
        from prometheus_client import generate_latest

        return web.Response(body=generate_latest(self.registry), content_type="text/plain", charset="utf-8")

    async def handle_health(self, request: web.Request) -> web.Response:
        from aiohttp import web

        return web.Response(text="ok")


@contextlib.asynccontextmanager
async def serving(
    settings: Settings,
    opts: MapOptions,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    max_body_bytes: int = DEFAULT_MAX_BODY,
) -> AsyncIterator[OtlpReceiver]:
    """A running receiver (producer started, HTTP site listening) until the block exits."""
    from aiohttp import web
    from governor_telemetry.producer import TelemetryProducer

    producer = TelemetryProducer(
        settings.kafka_bootstrap,
        settings.topic("telemetry"),
        source=f"otlp@{socket.gethostname()}",
        kafka_options=kafka_options(settings),
        encoding=settings.telemetry_encoding,
    )
    async with producer:
        receiver = OtlpReceiver(producer, opts, max_body_bytes)
        runner = web.AppRunner(receiver.app(), access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            log.info("OTLP receiver on http://%s:%d%s -> %s", host, port, TRACES_PATH, producer.topic)
            yield receiver
        finally:
            await runner.cleanup()  # stop taking spans, then the producer flushes what it holds


def parse_model_map(raw: str) -> dict[str, str]:
    """``served=governor,...`` -> a dict (raises ValueError for an item without ``=``).

    >>> parse_model_map("meta-llama/Llama-2-70b-hf=llama2-70b, a=b")
    {'meta-llama/Llama-2-70b-hf': 'llama2-70b', 'a': 'b'}
    """
    out: dict[str, str] = {}
    for item in raw.split(","):
        item = item.strip()
        if not item:
            continue
        served, sep, ours = item.rpartition("=")
        if not sep or not served.strip() or not ours.strip():
            raise ValueError(f"--model-map item {item!r} is not served=governor")
        out[served.strip()] = ours.strip()
    return out


def add_parser(ingest_sub: Any) -> None:
    """Register ``otlp`` under the ``governor ingest`` subcommands."""
    p = ingest_sub.add_parser("otlp", help="OTLP/HTTP trace receiver: engine request spans -> telemetry records")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1; no auth: mind the network)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"listen port (default {DEFAULT_PORT})")
    p.add_argument(
        "--zone", default="", help="zone of spans whose resource names none (governor.zone, cloud.availability_zone)"
    )
    p.add_argument(
        "--model-map",
        default="",
        help="served=governor model names, comma-separated (e.g. meta-llama/Llama-2-70b-hf=llama2-70b)",
    )
    p.add_argument("--max-body-mib", type=float, default=4.0, help="largest export body accepted (default 4 MiB)")
    p.add_argument("--any-model", action="store_true", help="keep models not in GOVERNOR_MODELS (default: drop them)")


def options_from_args(settings: Settings, args: argparse.Namespace) -> MapOptions:
    return MapOptions(
        default_zone=args.zone,
        model_map=parse_model_map(args.model_map),
        zones=frozenset(settings.zones),
        models=None if args.any_model else frozenset(m.name for m in settings.models),
    )


def run(settings: Settings, args: argparse.Namespace) -> int:
    """``governor ingest otlp`` (:class:`adapters.source.Source`)."""
    try:
        opts = options_from_args(settings, args)
    except ValueError as exc:
        print(f"governor ingest otlp: {exc}", file=sys.stderr)
        return 2
    if opts.default_zone and opts.zones is not None and opts.default_zone not in opts.zones:
        print(
            f"governor ingest otlp: --zone {opts.default_zone!r} not in GOVERNOR_ZONES {settings.zones}",
            file=sys.stderr,
        )
        return 2
    max_body = int(args.max_body_mib * 1024 * 1024)
    if max_body <= 0:
        print("governor ingest otlp: --max-body-mib must be > 0", file=sys.stderr)
        return 2
    asyncio.run(_serve_forever(settings, opts, args.host, args.port, max_body))
    return 0


async def _serve_forever(settings: Settings, opts: MapOptions, host: str, port: int, max_body: int) -> None:
    from launch.topics import ensure_topics

    await ensure_topics(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with serving(settings, opts, host, port, max_body) as receiver:
        print(f"OTLP receiver listening on http://{host}:{port}{TRACES_PATH}", flush=True)
        await stop.wait()
    log.info("OTLP receiver stopped: %s", dict(receiver.counts))
