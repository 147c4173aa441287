"""``governor ingest scrape``: a process beside the engines that scrapes vLLM/SGLang ``/metrics``.

Every ``--interval-s`` it GETs each ``--endpoint URL=zone`` (a static list), parses the
exposition text (:func:`parse_exposition`), and for each served model on each replica turns
the difference from the previous scrape into request and GPU records
(:func:`controllers.scrape.window_records`, whose docstring states the reconstruction,
its error bounds, how scrape intervals map onto windows and how counter resets are
handled).  Records go to the telemetry topic in the usual envelope through
:class:`TelemetryProducer`.  The first scrape of a replica is its baseline (nothing is
sent, as ``rate()`` needs two samples); a failed scrape sends nothing (the replica goes
stale in the windows) and keeps the previous baseline.

Metric names and labels are the engines' own (vLLM ``vllm/v1/metrics/loggers.py``,
SGLang ``python/sglang/srt/metrics/collector.py``): series are grouped by ``model_name``
and summed over the other labels (vLLM's ``engine`` index under data parallelism).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from governor_telemetry.producer import TelemetryProducer
from prometheus_client.parser import text_string_to_metric_families

from controllers.scrape import COMBINE, Histogram, Snapshot, Summary, snapshot_delta, window_records
from core.settings import ModelSpec, Settings
from core.transport import kafka_options

__all__ = ["ENGINES", "Endpoint", "Scraper", "add_parser", "parse_exposition", "run_ingest_scrape", "scrape_loop"]

log = logging.getLogger(__name__)

# (ttft, [(itl name, per request)], e2e, queue, finished counter, failed counter or reasons,
#  prompt, generation, running, waiting, [kv usage gauges], kv total)
ENGINES: dict[str, dict[str, Any]] = {
    "vllm": {
        "ttft": "vllm:time_to_first_token_seconds",
        "itl": [
            ("vllm:request_time_per_output_token_seconds", True),
            ("vllm:inter_token_latency_seconds", False),
            ("vllm:time_per_output_token_seconds", False),
        ],
        "e2e": "vllm:e2e_request_latency_seconds",
        "queue": "vllm:request_queue_time_seconds",
        "finished": "vllm:request_success",
        "ok_reasons": ("stop", "length"),
        "prompt": "vllm:prompt_tokens",
        "output": "vllm:generation_tokens",
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "kv": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    },
    "sglang": {
        "ttft": "sglang:time_to_first_token_seconds",
        "itl": [("sglang:inter_token_latency_seconds", False)],
        "e2e": "sglang:e2e_request_latency_seconds",
        "finished": "sglang:num_requests",
        "failed": "sglang:num_aborted_requests",
        "prompt": "sglang:prompt_tokens",
        "output": "sglang:generation_tokens",
        "running": "sglang:num_running_reqs",
        "waiting": "sglang:num_queue_reqs",
        "kv": ("sglang:token_usage",),
        "kv_total": "sglang:max_total_num_tokens",
    },
}


@dataclass
class _Series:
    """The samples of one ``model_name``: scalar sums by name, histograms by name, reasons."""

    scalars: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    buckets: dict[str, dict[float, float]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))
    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    reasons: dict[str, float] = field(default_factory=lambda: defaultdict(float))


def _histogram(s: _Series, name: str, per_request: bool = True) -> Histogram | None:
    b = s.buckets.get(name)
    if not b:
        return None
    edges = sorted(e for e in b if e != float("inf"))
    cum = tuple(b[e] for e in edges) + (b.get(float("inf"), b[edges[-1]] if edges else 0.0),)
    return Histogram(tuple(edges), cum, s.sums.get(name, 0.0), per_request)


def parse_exposition(text: str, engine: str) -> dict[str, Snapshot]:
    """Exposition text -> one :class:`Snapshot` per ``model_name`` (ValueError: not exposition)."""
    spec = ENGINES[engine]
    by_model: dict[str, _Series] = defaultdict(_Series)
    start: float | None = None
    kv_blocks: int | None = None
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            name, labels, value = smp.name, smp.labels, float(smp.value)
            if name == "process_start_time_seconds":
                start = value
                continue
            if name == "vllm:cache_config_info" and labels.get("num_gpu_blocks", "").isdigit():
                kv_blocks = (kv_blocks or 0) + int(labels["num_gpu_blocks"])
                continue
            s = by_model[labels.get("model_name", "")]
            if name.endswith("_bucket") and "le" in labels:
                s.buckets[fam.name][float(labels["le"])] += value
            elif name == fam.name + "_sum" and fam.type == "histogram":
                s.sums[fam.name] += value
            elif name == fam.name + "_total" and "finished_reason" in labels:
                s.reasons[labels["finished_reason"]] += value
            elif name in (fam.name, fam.name + "_total"):
                s.scalars[fam.name] += value
                s.counts[fam.name] += 1
    out: dict[str, Snapshot] = {}
    for model, s in by_model.items():
        ttft = _histogram(s, spec["ttft"])
        if ttft is None and not any(k in s.scalars for k in (spec["running"], spec["waiting"])):
            continue  # no engine series under this label set (process_*, python_* ...)
        itl = next((h for n, per in spec["itl"] if (h := _histogram(s, n, per)) is not None), None)
        if "ok_reasons" in spec:
            finished = sum(s.reasons.values())
            failed = sum(v for r, v in s.reasons.items() if r not in spec["ok_reasons"])
        else:
            finished, failed = s.scalars.get(spec["finished"], 0.0), s.scalars.get(spec["failed"], 0.0)
        kv_name = next((k for k in spec["kv"] if k in s.scalars), None)
        kv_usage = s.scalars[kv_name] / max(1, s.counts[kv_name]) if kv_name else None
        kv_total = int(s.scalars[spec["kv_total"]]) if spec.get("kv_total") in s.scalars else kv_blocks
        out[model] = Snapshot(
            ttft=ttft,
            itl=itl,
            e2e=_histogram(s, spec["e2e"]),
            queue=_histogram(s, spec["queue"]) if "queue" in spec else None,
            finished=finished,
            failed=failed,
            prompt_tokens=s.scalars.get(spec["prompt"], 0.0),
            output_tokens=s.scalars.get(spec["output"], 0.0),
            running=s.scalars.get(spec["running"], 0.0),
            waiting=s.scalars.get(spec["waiting"], 0.0),
            kv_usage=kv_usage,
            kv_total=kv_total,
            start_time_s=start,
        )
    return out


@dataclass(frozen=True)
class Endpoint:
    url: str
    zone: str

    @property
    def node(self) -> str:
        """The replica's node id: ``host:port`` of its metrics URL."""
        parts = urlsplit(self.url)
        return parts.netloc or self.url


def parse_endpoint(raw: str) -> Endpoint:
    url, sep, zone = raw.rpartition("=")
    if not sep or not url.startswith(("http://", "https://")) or not zone:
        raise ValueError(f"--endpoint {raw!r}: want URL=zone, e.g. http://10.0.0.5:8000/metrics=az-a")
    return Endpoint(url, zone)


def parse_model_map(items: Iterable[str]) -> dict[str, str]:
    out = {}
    for item in items:
        served, sep, ours = item.rpartition("=")
        if not sep or not served or not ours:
            raise ValueError(f"--model-map {item!r}: want served_name=model")
        out[served] = ours
    return out


class Scraper:
    """Scrape state per (endpoint, served model) -> records (no I/O: :meth:`step` takes the texts)."""

    def __init__(
        self,
        settings: Settings,
        endpoints: list[Endpoint],
        engine: str,
        model_map: dict[str, str] | None = None,
        combine: str = "upper",
    ) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine {engine!r}: choose one of {sorted(ENGINES)}")
        self.settings, self.endpoints, self.engine = settings, endpoints, engine
        self.model_map, self.combine = model_map or {}, combine
        self._prev: dict[tuple[str, str], tuple[Snapshot, int]] = {}
        self.summaries: list[tuple[str, str, Summary]] = []

    def open_from_ms(self, now_ms: int) -> int:
        """Start of the oldest window still open once the records arrive (0.5 s for the trip)."""
        w = int(self.settings.window_s * 1000)
        t = now_ms - max(0, int(self.settings.lateness_s * 1000) - 500)
        return t - t % w

    def step(self, texts: dict[str, str | BaseException], now_ms: int) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        for ep in self.endpoints:
            text = texts.get(ep.url)
            if not isinstance(text, str):
                log.warning("scrape of %s failed: %s", ep.url, text)
                continue
            try:
                snaps = parse_exposition(text, self.engine)
            except ValueError as exc:
                log.warning("scrape of %s is not exposition text: %s", ep.url, exc)
                continue
            for served, snap in snaps.items():
                key = (ep.url, served)
                prev = self._prev.get(key)
                self._prev[key] = (snap, now_ms)
                if prev is None:
                    continue  # the baseline
                model = self.model_map.get(served, served)
                spec = self.settings.model(model) or ModelSpec(model)
                recs, summary = window_records(
                    snapshot_delta(prev[0], snap),
                    model=model,
                    zone=ep.zone,
                    node=ep.node,
                    t_prev_ms=prev[1],
                    t_now_ms=now_ms,
                    open_from_ms=self.open_from_ms(now_ms),
                    ttft_slo_ms=spec.ttft_slo_ms,
                    itl_slo_ms=spec.itl_slo_ms,
                    combine=self.combine,
                )
                self.summaries.append((ep.node, model, summary))
                log.info(
                    "%s %s: %d requests, violations in [%g, %g], records carry %d (%s)",
                    ep.node,
                    model,
                    summary.n,
                    *summary.bounds,
                    summary.realised,
                    summary.combine,
                )
                records.extend(recs)
        return records


def fetch_text(url: str, timeout_s: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (operator-given URLs)
        body: bytes = resp.read(64 * 1024 * 1024)
        return body.decode("utf-8", errors="replace")


async def _fetch_all(endpoints: list[Endpoint], timeout_s: float) -> dict[str, str | BaseException]:
    async def one(ep: Endpoint) -> str | BaseException:
        try:
            return await asyncio.to_thread(fetch_text, ep.url, timeout_s)
        except Exception as exc:  # one replica down is a warning, not the end of the adapter
            return exc

    results = await asyncio.gather(*(one(ep) for ep in endpoints))
    return {ep.url: r for ep, r in zip(endpoints, results, strict=True)}


async def scrape_loop(
    scraper: Scraper,
    producer: TelemetryProducer,
    interval_s: float,
    *,
    scrapes: int | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Scrape every ``interval_s`` (``scrapes`` times, or until ``stop``); returns records sent."""
    stop = stop or asyncio.Event()
    sent, done = 0, 0
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while scrapes is None or done < scrapes:
        texts = await _fetch_all(scraper.endpoints, timeout_s=max(1.0, min(10.0, interval_s)))
        records = scraper.step(texts, int(time.time() * 1000))
        for rec in records:
            try:
                await producer.send(rec)
            except ValueError as exc:  # InvalidRecord: a mapping bug must not stop the adapter
                log.error("scraped record refused by the producer: %s", exc)
                continue
            sent += 1
        await producer.flush()
        done += 1
        if scrapes is not None and done >= scrapes:
            break
        next_at += interval_s
        try:
            await asyncio.wait_for(stop.wait(), timeout=max(0.0, next_at - loop.time()))
            break
        except TimeoutError:
            pass
    return sent


def add_parser(ingest_sub: Any) -> None:
    """Register ``scrape`` under the ``governor ingest`` subcommands."""
    p = ingest_sub.add_parser("scrape", help="scrape vLLM/SGLang /metrics: histogram deltas -> telemetry records")
    p.add_argument("--endpoint", action="append", default=[], help="URL=zone of an engine's /metrics (repeatable)")
    p.add_argument("--engine", choices=sorted(ENGINES), default="vllm")
    p.add_argument("--interval-s", type=float, default=5.0, help="seconds between scrapes (at most window_s / 2)")
    p.add_argument("--model-map", action="append", default=[], help="served_name=model (repeatable)")
    p.add_argument(
        "--violations",
        choices=COMBINE,
        default="upper",
        help="which end of the violation bounds the records carry (upper: parts disjoint, the safe side)",
    )


def run_ingest_scrape(settings: Settings, args: argparse.Namespace) -> int:
    try:
        endpoints = [parse_endpoint(e) for e in args.endpoint]
        model_map = parse_model_map(args.model_map)
    except ValueError as exc:
        print(f"governor ingest scrape: {exc}", file=sys.stderr)
        return 2
    bad = [ep.zone for ep in endpoints if ep.zone not in settings.zones]
    if not endpoints or bad or not args.interval_s > 0:
        why = f"zones {bad} not in GOVERNOR_ZONES {settings.zones}" if bad else "need --endpoint and --interval-s > 0"
        print(f"governor ingest scrape: {why}", file=sys.stderr)
        return 2
    if args.interval_s > settings.window_s / 2:
        log.warning("--interval-s %g > window_s/2: some windows get no requests", args.interval_s)
    scraper = Scraper(settings, endpoints, args.engine, model_map, args.violations)
    asyncio.run(_run_forever(settings, scraper, args.interval_s))
    return 0


async def _run_forever(settings: Settings, scraper: Scraper, interval_s: float) -> None:
    from governor.topics import ensure_topics

    await ensure_topics(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with TelemetryProducer(
        settings.kafka_bootstrap,
        settings.topic("telemetry"),
        source=f"scrape@{socket.gethostname()}",
        kafka_options=kafka_options(settings),
    ) as producer:
        sent = await scrape_loop(scraper, producer, interval_s, stop=stop)
    log.info("scrape adapter stopped after %d records", sent)
