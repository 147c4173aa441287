"""``governor ingest scrape``: a process beside the engines that scrapes vLLM/SGLang ``/metrics``.

Every ``--interval-s`` it re-reads its targets (:mod:`adapters.scrape.targets`: a static
``--endpoint URL=zone`` list, a Prometheus HTTP SD document, or Kubernetes pods by label
selector), GETs each one's ``/metrics``, parses the exposition text
(:func:`parse_exposition`), and for each served model on each replica turns the
difference from the previous scrape into request and GPU records
(:func:`adapters.scrape.deltas.window_records`, whose docstring states the reconstruction,
its error bounds, how scrape intervals map onto windows and how counter resets are
handled).  Records go to the telemetry topic through :class:`TelemetryProducer`, or, with
``--print``, to stdout as JSON lines (``--once``: one scrape, then exit).  A replica's first
scrape counts from zero when it is new to this adapter or started after the previous round,
else it is the baseline (as ``rate()``; :meth:`Scraper._fresh_engine`); a failed scrape sends
nothing and keeps the baseline; a target discovery no longer lists has its baseline dropped
(bounded state).  A target with no series of its engine, a served model name that maps to no
configured model, and an SLO that is not a bucket edge are warned about once each and counted
in :attr:`Scraper.stats`.  With
``GOVERNOR_SCRAPE_PROMETHEUS_URL`` the same series are read from a Prometheus instead
(:mod:`adapters.scrape.promql`).  Timestamps and ``--interval-s`` are on the run's
:class:`core.clock.ScaledClock`.  Metric names and parsing: :mod:`adapters.scrape.exposition`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import socket
import sys
import urllib.request
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable
from typing import Any, Protocol

from governor_telemetry.producer import TelemetryProducer

from adapters.scrape.deltas import (
    COMBINE,
    Histogram,
    Snapshot,
    Summary,
    carry_unfinished,
    edge_advice,
    snapshot_delta,
    window_records,
)
from adapters.scrape.exposition import ENGINES, Sample, parse_exposition, snapshots_from_samples
from adapters.scrape.targets import (
    Discovery,
    Endpoint,
    HttpSdTargets,
    KubernetesTargets,
    Shard,
    StaticTargets,
    TargetSource,
    parse_endpoint,
)
from adapters.scrape.trust import HttpTrust, TrustedHttp
from adapters.source import Collector
from core.clock import ScaledClock
from core.settings import ModelSpec, Settings
from core.transport import kafka_options
from launch.processes import INGEST_SCRAPE_READY, ready_log

__all__ = ["ENGINES", "Endpoint", "Scraper", "add_parser", "parse_exposition", "run", "scrape_loop"]
__all__ += ["EndpointCollector", "Sample", "parse_endpoint", "snapshots_from_samples"]

SUMMARIES_KEPT = 1024
SCRAPED_KEPT = 65536  # target URLs remembered as scraped (first-scrape rule), oldest forgotten first
WARNED_KEPT = 4096  # misconfigurations remembered as warned about (each is logged once)

log = logging.getLogger(__name__)


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
        first_from_zero: bool = False,
    ) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine {engine!r}: choose one of {sorted(ENGINES)}")
        self.settings, self.endpoints, self.engine = settings, list(endpoints), engine
        self.model_map, self.combine = model_map or {}, combine
        self.first_from_zero = first_from_zero
        self._prev: dict[tuple[str, str], tuple[Snapshot, int]] = {}
        self.summaries: deque[tuple[str, str, Summary]] = deque(maxlen=SUMMARIES_KEPT)
        # The first, this and the previous scrape round's times (:meth:`_fresh_engine`).
        self._first_round_ms: int | None = None
        self._round_ms: int | None = None
        self._prev_round_ms: int | None = None
        self._scraped: OrderedDict[str, None] = OrderedDict()  # URLs scraped at least once
        self._warned: OrderedDict[tuple[str, ...], None] = OrderedDict()
        #: misconfigurations seen, one count per target (and served model) per scrape:
        #: ``no_engine_series``, ``unmapped_model``; ``slo_off_edge`` once per histogram layout
        self.stats: Counter[str] = Counter()
        self._check_default_edges()

    def _check_default_edges(self) -> None:
        """At start: each model's SLOs against the engine's default bucket edges (the served edges
        are checked again at the first scrape that shows them; a layout is warned about once)."""
        spec = ENGINES[self.engine]
        itl_name, per_request = spec["itl"][0]
        for model in self.settings.models:
            defaults = Snapshot(
                ttft=Histogram(spec["ttft_edges"], (), name=spec["ttft"]),
                itl=Histogram(spec["itl_edges"], (), per_request=per_request, name=itl_name),
            )
            self._check_edges(model.name, defaults, model)

    def _fresh_engine(self, ep: Endpoint, snap: Snapshot, t_ms: int) -> tuple[Snapshot, int] | None:
        """A zero baseline for a first scrape that cannot hold anything already counted, else None.

        ``rate()`` keeps a first scrape as the baseline only, which loses what a replica scaled in
        under load served before it was first scraped.  Its counters cannot hold anything this
        adapter has counted when either

        * its start time (the engine's ``process_start_time_seconds``, else discovery's: a pod's
          ``startTime``, the HTTP SD label ``__meta_start_time_s``) is after the previous round; or
        * its URL has never been scraped by this adapter (new to discovery), unless a start time
          says it started before this adapter's first round (its counts may be older than us).

        Engines in Prometheus multiprocess mode (SGLang; vLLM with ``--api-server-count`` > 1)
        export no start time: the second rule needs none.  A URL scraped before that comes back
        with no start time (a target that flapped out of discovery) is a baseline: counting it
        from zero would send its whole history again.  The adapter's first round is all
        baselines (as ``rate()``) unless :attr:`first_from_zero` (``--once``).
        """
        start_s = snap.start_time_s if snap.start_time_s is not None else ep.start_time_s
        start_ms = int(start_s * 1000) if start_s is not None else None
        zero = Snapshot(start_time_s=snap.start_time_s)
        if self._prev_round_ms is None:  # the adapter's first round
            if not self.first_from_zero:
                return None
            return zero, min(start_ms, t_ms) if start_ms is not None else self.open_from_ms(t_ms)
        if start_ms is not None and self._prev_round_ms < start_ms <= t_ms:
            return zero, start_ms
        if ep.url in self._scraped:
            return None
        first = self._first_round_ms if self._first_round_ms is not None else self._prev_round_ms
        if start_ms is not None and start_ms <= first:
            return None
        return zero, max(self._prev_round_ms, min(start_ms or 0, t_ms))

    def _warn_once(self, key: tuple[str, ...], msg: str, *args: Any) -> None:
        if key not in self._warned:
            log.warning(msg, *args)
        self._warned[key] = None
        self._warned.move_to_end(key)
        while len(self._warned) > WARNED_KEPT:
            self._warned.popitem(last=False)

    def _check_engine(self, ep: Endpoint, snaps: dict[str, Snapshot], seen: set[str]) -> None:
        """Count (and warn once about) a target that shows no series of the configured engine."""
        if self.engine in seen:
            return
        self.stats["no_engine_series"] += 1
        others = sorted(seen - {self.engine})
        hint = f"it serves {'/'.join(others)} series: --engine {others[0]}?" if others else "wrong URL or engine?"
        self._warn_once(
            ("engine", ep.url),
            "%s shows no %s series (%s; an engine that has served nothing yet may show none): "
            "no records from it while this lasts",
            ep.url,
            ENGINES[self.engine]["prefix"],
            hint,
        )

    def _check_model(self, served: str, model: str) -> ModelSpec:
        spec = self.settings.model(model)
        if spec is not None:
            return spec
        self.stats["unmapped_model"] += 1
        self._warn_once(
            ("model", served),
            "served model %r%s is not a configured model (%s): the worker will dead-letter its records; "
            "map it with --model-map %s=MODEL or GOVERNOR_SCRAPE_MODEL_MAP",
            served,
            f" (mapped to {model!r})" if model != served else "",
            ", ".join(m.name for m in self.settings.models),
            served,
        )
        return ModelSpec(model)

    def _check_edges(self, model: str, snap: Snapshot, spec: ModelSpec) -> None:
        """Warn once per histogram layout whose edges do not include the model's SLO."""
        for h, slo_ms in ((snap.ttft, spec.ttft_slo_ms), (snap.itl, spec.itl_slo_ms)):
            if h is None or not h.edges:
                continue
            key = ("edges", model, h.name, repr(h.edges), repr(slo_ms))
            if key in self._warned:
                continue
            advice = edge_advice(h.name or "the histogram", h.edges, slo_ms / 1000.0)
            if advice is not None:
                self.stats["slo_off_edge"] += 1
                self._warn_once(key, "model %s: %s", model, advice)

    def set_endpoints(self, endpoints: list[Endpoint]) -> None:
        """The targets from now on; the baselines of targets no longer listed are dropped."""
        self.endpoints = list(endpoints)
        live = {ep.url for ep in self.endpoints}
        for key in [k for k in self._prev if k[0] not in live]:
            del self._prev[key]

    def previous(self, url: str, served: str) -> Snapshot | None:
        """The snapshot a target's next delta will start from (None: no baseline yet)."""
        prev = self._prev.get((url, served))
        return prev[0] if prev is not None else None

    @property
    def baselines(self) -> int:
        """(target, served model) pairs with a previous scrape held."""
        return len(self._prev)

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
            seen: set[str] = set()
            try:
                snaps = parse_exposition(text, self.engine, seen)
            except ValueError as exc:
                log.warning("scrape of %s is not exposition text: %s", ep.url, exc)
                continue
            self._check_engine(ep, snaps, seen)
            records.extend(self.observe(ep, snaps, now_ms))
        return records

    def observe(
        self, ep: Endpoint, snaps: dict[str, Snapshot], t_ms: int, now_ms: int | None = None
    ) -> list[dict[str, Any]]:
        """One target's snapshots taken at ``t_ms`` -> records of the deltas from its previous ones.

        ``now_ms`` (default ``t_ms``) is when the records leave: a source that reads older
        samples (Prometheus) stamps them at ``t_ms`` but no earlier than the oldest window
        still open at ``now_ms``.
        """
        now_ms = t_ms if now_ms is None else now_ms
        if self._round_ms is None or t_ms > self._round_ms:
            self._prev_round_ms, self._round_ms = self._round_ms, t_ms
            if self._first_round_ms is None:
                self._first_round_ms = t_ms
        open_from = self.open_from_ms(now_ms)
        t_ms = max(t_ms, open_from)
        records: list[dict[str, Any]] = []
        for served, snap in snaps.items():
            key = (ep.url, served)
            prev = self._prev.get(key)
            self._prev[key] = (snap, t_ms)
            if prev is None:
                prev = self._fresh_engine(ep, snap, t_ms)
            model = self.model_map.get(served, served)
            spec = self._check_model(served, model)
            self._check_edges(model, snap, spec)
            if prev is None:
                continue  # the baseline
            delta = snapshot_delta(prev[0], snap)
            recs, summary = window_records(
                delta,
                model=model,
                zone=ep.zone,
                node=ep.node,
                t_prev_ms=min(prev[1], t_ms),
                t_now_ms=t_ms,
                open_from_ms=open_from,
                ttft_slo_ms=spec.ttft_slo_ms,
                itl_slo_ms=spec.itl_slo_ms,
                combine=self.combine,
            )
            self._prev[key] = (carry_unfinished(snap, delta, summary.n), t_ms)
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
        self._scraped[ep.url] = None
        self._scraped.move_to_end(ep.url)
        while len(self._scraped) > SCRAPED_KEPT:
            self._scraped.popitem(last=False)
        return records


def fetch_text(url: str, timeout_s: float, http: TrustedHttp | None = None) -> str:
    """GET ``url`` with ``http``'s CA, client certificate and bearer token (None: none of them)."""
    with (http or _PLAIN).open(urllib.request.Request(url), timeout_s) as resp:
        body: bytes = resp.read(64 * 1024 * 1024)
        return body.decode("utf-8", errors="replace")


_PLAIN = TrustedHttp(HttpTrust("GOVERNOR_SCRAPE_TLS"))


async def _fetch_all(
    endpoints: list[Endpoint], timeout_s: float, http: TrustedHttp | None = None
) -> dict[str, str | BaseException]:
    async def one(ep: Endpoint) -> str | BaseException:
        try:
            return await asyncio.to_thread(fetch_text, ep.url, timeout_s, http)
        except Exception as exc:  # one replica down is a warning, not the end of the adapter
            return exc

    results = await asyncio.gather(*(one(ep) for ep in endpoints))
    return {ep.url: r for ep, r in zip(endpoints, results, strict=True)}


class EndpointCollector:
    """Discovery, then a GET of every target (TLS and token: ``GOVERNOR_SCRAPE_TLS_*``), then :meth:`Scraper.step`."""

    def __init__(self, scraper: Scraper, discovery: Discovery | None = None, timeout_s: float = 5.0) -> None:
        self.scraper, self.discovery, self.timeout_s = scraper, discovery, timeout_s
        self.settings = scraper.settings
        self.http = TrustedHttp(HttpTrust.for_targets(self.settings))  # TrustError: a setting unusable

    async def collect(self, now_ms: int) -> list[dict[str, Any]]:
        if self.discovery is not None:
            self.scraper.set_endpoints(await self.discovery.refresh())
        texts = await _fetch_all(self.scraper.endpoints, self.timeout_s, self.http)
        return self.scraper.step(texts, now_ms)


class RecordSink(Protocol):
    """Where scraped records go: :class:`TelemetryProducer` (Kafka) or :class:`PrintProducer` (``--print``)."""

    async def send(self, record: dict[str, Any]) -> None: ...

    async def flush(self) -> None: ...


async def scrape_loop(
    scraper: Scraper | Collector,
    producer: RecordSink,
    interval_s: float,
    *,
    scrapes: int | None = None,
    stop: asyncio.Event | None = None,
    discovery: Discovery | None = None,
    clock: ScaledClock | None = None,
) -> int:
    """Collect every ``interval_s`` of ``clock`` (``scrapes`` times, or until ``stop``); returns records sent."""
    collector: Collector
    if isinstance(scraper, Scraper):
        timeout_s = max(1.0, min(10.0, interval_s))
        collector = EndpointCollector(scraper, discovery, timeout_s)
    else:
        collector = scraper
    s = collector.settings
    clock = clock or ScaledClock(s.clock_speed, s.clock_origin_s)
    stop = stop or asyncio.Event()
    sent, done = 0, 0
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while scrapes is None or done < scrapes:
        records = await collector.collect(clock.now_ms())
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
        next_at += clock.to_wall_s(interval_s * 1000.0)
        try:
            await asyncio.wait_for(stop.wait(), timeout=max(0.0, next_at - loop.time()))
            break
        except TimeoutError:
            pass
    return sent


def add_parser(ingest_sub: Any) -> None:
    """Register ``scrape`` under the ``governor ingest`` subcommands (flags override GOVERNOR_SCRAPE_*)."""
    p = ingest_sub.add_parser("scrape", help="scrape vLLM/SGLang /metrics: histogram deltas -> telemetry records")
    p.add_argument(
        "--endpoint",
        action="append",
        default=[],
        help="URL=zone of an engine's /metrics (repeatable; added to GOVERNOR_SCRAPE_ENDPOINTS)",
    )
    p.add_argument("--engine", choices=sorted(ENGINES), default=None, help="default GOVERNOR_SCRAPE_ENGINE")
    p.add_argument(
        "--interval-s",
        type=float,
        default=None,
        help="seconds between scrapes, at most window_s / 2 (default GOVERNOR_SCRAPE_INTERVAL_S)",
    )
    p.add_argument(
        "--model-map", action="append", default=[], help="served_name=model (repeatable; added to the setting's)"
    )
    p.add_argument(
        "--violations",
        choices=COMBINE,
        default=None,
        help="which end of the violation bounds the records carry (upper: parts disjoint, the safe side)",
    )
    p.add_argument("--http-sd", default=None, help="URL of a Prometheus HTTP SD document (GOVERNOR_SCRAPE_HTTP_SD)")
    p.add_argument("--k8s-selector", default=None, help="label selector of engine pods (GOVERNOR_SCRAPE_K8S_SELECTOR)")
    p.add_argument("--prometheus-url", default=None, help="read via PromQL (GOVERNOR_SCRAPE_PROMETHEUS_URL)")
    p.add_argument(
        "--once",
        action="store_true",
        help="scrape once and exit; each target's counts so far are its records (no baseline round)",
    )
    p.add_argument(
        "--print",
        dest="print_records",
        action="store_true",
        help="print the records as JSON lines on stdout instead of producing them (no Kafka): check a setup",
    )


def _pick(flag: Any, setting: Any) -> Any:
    return setting if flag is None else flag


def build_sources(settings: Settings, args: argparse.Namespace, k8s_client: Any = None) -> list[TargetSource]:
    """The target sources the settings and flags name (ValueError: one is misconfigured)."""
    static = [parse_endpoint(e) for e in (*settings.scrape_endpoints, *args.endpoint)]
    sources: list[TargetSource] = []
    if static:
        sources.append(StaticTargets(static))
    http_sd = _pick(getattr(args, "http_sd", None), settings.scrape_http_sd)
    if http_sd:
        sources.append(HttpSdTargets(http_sd, settings.scrape_zone_label))
    selector = _pick(getattr(args, "k8s_selector", None), settings.scrape_k8s_selector)
    if selector:
        src = KubernetesTargets(
            selector,
            settings.scrape_k8s_namespace,
            settings.scrape_k8s_port,
            settings.scrape_zone_label,
            api_client=k8s_client,
        )
        src._api()  # load the in-cluster config or kubeconfig now: a missing one is a usage error
        sources.append(src)
    return sources


def run(settings: Settings, args: argparse.Namespace) -> int:
    """``governor ingest scrape`` (:class:`adapters.source.Source`)."""
    engine = _pick(args.engine, settings.scrape_engine)
    interval_s = _pick(args.interval_s, settings.scrape_interval_s)
    combine = _pick(args.violations, settings.scrape_violations)
    prom_url = _pick(getattr(args, "prometheus_url", None), settings.scrape_prometheus_url)
    try:
        model_map = parse_model_map([*settings.scrape_model_map, *args.model_map])
        sources = [] if prom_url else build_sources(settings, args)
    except Exception as exc:  # a bad flag, setting or kubeconfig: say which and stop
        print(f"governor ingest scrape: {exc}", file=sys.stderr)
        return 2
    if not interval_s > 0 or not (sources or prom_url):
        why = "need --interval-s > 0" if not interval_s > 0 else "no targets"
        print(
            f"governor ingest scrape: {why}: give --endpoint URL=zone, GOVERNOR_SCRAPE_ENDPOINTS, "
            "GOVERNOR_SCRAPE_HTTP_SD, GOVERNOR_SCRAPE_K8S_SELECTOR or GOVERNOR_SCRAPE_PROMETHEUS_URL",
            file=sys.stderr,
        )
        return 2
    static = [ep for src in sources if isinstance(src, StaticTargets) for ep in src.endpoints]
    bad = [ep.zone for ep in static if ep.zone not in settings.zones]
    if bad:
        print(f"governor ingest scrape: zones {bad} not in GOVERNOR_ZONES {settings.zones}", file=sys.stderr)
        return 2
    if interval_s > settings.window_s / 2:
        log.warning("--interval-s %g > window_s/2: some windows get no requests", interval_s)
    collector: Collector
    if prom_url:
        from adapters.scrape.promql import PromqlSource

        try:
            collector = PromqlSource(settings, prom_url, engine, model_map, combine, interval_s=interval_s)
        except ValueError as exc:
            print(f"governor ingest scrape: {exc}", file=sys.stderr)
            return 2
    else:
        once = bool(getattr(args, "once", False))
        scraper = Scraper(settings, [], engine, model_map, combine, first_from_zero=once)
        discovery = Discovery(sources, settings.zones, settings.scrape_max_targets, Shard.from_settings(settings))
        try:
            collector = EndpointCollector(scraper, discovery, timeout_s=max(1.0, min(10.0, interval_s)))
        except ValueError as exc:  # adapters.scrape.trust.TrustError: a CA, certificate or token file
            print(f"governor ingest scrape: {exc}", file=sys.stderr)
            return 2
    scrapes = 1 if getattr(args, "once", False) else None
    if getattr(args, "print_records", False):
        return asyncio.run(_print_records(collector, interval_s, scrapes))
    asyncio.run(_run_forever(settings, collector, interval_s, scrapes))
    return 0


class PrintProducer:
    """What :class:`TelemetryProducer` would send, as JSON lines on a stream (``--print``): the same
    validation (a record the worker would dead-letter raises ``ValueError``), no Kafka."""

    def __init__(self, out: Any = None) -> None:
        self.out = out if out is not None else sys.stdout
        self.sent = 0

    async def send(self, record: dict[str, Any]) -> None:
        from governor_telemetry.records import validate_record

        reason = validate_record(record)
        if reason is not None:
            raise ValueError(f"{reason}: {record.get('kind')} record of {record.get('model')!r}")
        self.out.write(json.dumps(record, sort_keys=True) + "\n")
        self.sent += 1

    async def flush(self) -> None:
        self.out.flush()


async def _print_records(collector: Collector, interval_s: float, scrapes: int | None) -> int:
    """``--print``: the records on stdout, a summary of what was seen on stderr."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    producer = PrintProducer()
    sent = await scrape_loop(collector, producer, interval_s, scrapes=scrapes, stop=stop)
    scraper = collector.scraper if isinstance(collector, EndpointCollector) else getattr(collector, "scraper", None)
    stats = dict(scraper.stats) if isinstance(scraper, Scraper) else {}
    targets = len(scraper.endpoints) if isinstance(scraper, Scraper) else 0
    print(
        f"governor ingest scrape: {sent} records from {targets} targets; misconfigurations seen: "
        + (", ".join(f"{k} {v}" for k, v in sorted(stats.items())) or "none"),
        file=sys.stderr,
    )
    return 0


async def _run_forever(settings: Settings, collector: Collector, interval_s: float, scrapes: int | None = None) -> None:
    from launch.topics import ensure_topics

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
        encoding=settings.telemetry_encoding,
    ) as producer:
        where = getattr(collector, "describe", lambda: "")() or _describe(collector)
        ready_log().info(
            "%s: %s, every %g s, telemetry as %s", INGEST_SCRAPE_READY, where, interval_s, settings.telemetry_encoding
        )
        sent = await scrape_loop(collector, producer, interval_s, scrapes=scrapes, stop=stop)
    log.info("scrape adapter stopped after %d records", sent)


def _describe(collector: Collector) -> str:
    if isinstance(collector, EndpointCollector) and collector.discovery is not None:
        shard = collector.discovery.shard
        return (
            "targets from "
            + "+".join(s.name for s in collector.discovery.sources)
            + (f" ({shard})" if shard != Shard() else "")
        )
    return type(collector).__name__
