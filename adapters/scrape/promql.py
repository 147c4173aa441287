"""Read the engines' series from a Prometheus that already scrapes them (``GOVERNOR_SCRAPE_PROMETHEUS_URL``).

Teams that scrape vLLM/SGLang with Prometheus point ``governor ingest scrape`` at it
instead of at the engines.  The records are the same as the direct scrape's, because
the data and the code are the same:

* **What is read.**  Every poll makes one instant query (``/api/v1/query``) for the
  *raw* cumulative series the direct scrape reads (the engine's histograms' ``_bucket`` /
  ``_sum`` / ``_count``, its counters' ``_total``, its gauges, ``process_start_time_seconds``
  and ``up``), plus ``timestamp(up)``: the time of each target's last scrape.  One query
  is one consistent read (Prometheus' TSDB isolation: a scrape's samples appear
  together or not at all).  The samples of one ``instance`` become the same
  :class:`~adapters.scrape.deltas.Snapshot` the direct scrape parses
  (:func:`adapters.scrape.exposition.snapshots_from_samples`), and the delta from that
  instance's previous scrape goes through the same
  :func:`~adapters.scrape.deltas.snapshot_delta` and :func:`~adapters.scrape.deltas.window_records`.
  So the counts are exact (integers, bucket by bucket) and a counter reset is handled as
  the direct scrape and ``rate()`` handle it.  Not ``increase(x[interval])`` per poll: it
  extrapolates to the range's edges (fractional counts) and drops the increment between
  the last sample of one range and the first of the next.
* **When.**  A delta covers Prometheus' two scrapes of that target, ``(t_prev, t_now]``;
  a poll that finds no newer scrape of a target sends nothing for it (no zero-then-double
  windows when polling faster than Prometheus scrapes); ``up == 0`` or a vanished target
  sends nothing and keeps the baseline, as a failed direct scrape does.
* **Zone** per instance from a series label (``GOVERNOR_SCRAPE_ZONE_LABEL``, default
  ``zone``) that the Prometheus scrape config sets, e.g. a relabel rule copying
  ``__meta_kubernetes_pod_label_zone`` or a static target's label.  An instance without
  one, or in a zone not in ``GOVERNOR_ZONES``, is skipped with a warning.
* **Cross-check.**  Each poll also asks Prometheus for
  ``histogram_quantile(0.95, sum by (le, model_name, instance) (rate(<ttft>_bucket[R])))``
  over the range ``R`` that reaches back to the polled scrapes' previous samples, and
  compares it with the P95 of the delta it reconstructed (:func:`adapters.scrape.deltas.quantile`);
  both are logged and kept in :attr:`PromqlSource.p95_checks`.  For one delta they agree
  to within rate()'s extrapolation (well under 1 %).

**Lag.**  A record reaches the topic up to one Prometheus scrape interval (the age of
its newest sample) plus one poll interval plus the query's time after the requests it
counts: more than the direct scrape, which is one poll interval.  The records are
stamped at Prometheus' scrape time of the sample (on the run's scaled clock), spread over
``(t_prev, t_now]`` like direct scrapes, except that nothing is stamped into a window that
has closed (``GOVERNOR_WINDOW_S`` + ``GOVERNOR_LATENESS_S``): a delta older than that
moves into the oldest open window.  Keep Prometheus' scrape interval at most
``window_s / 2`` and the lateness above it, or windows are filled one scrape late.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from typing import Any

from adapters.scrape.deltas import Estimate, quantile, snapshot_delta
from adapters.scrape.exposition import ENGINES, Sample, snapshots_from_samples
from adapters.scrape.runner import Scraper
from adapters.scrape.targets import Endpoint, Shard, validate_targets
from adapters.scrape.trust import HttpTrust, TrustedHttp, TrustError
from core.clock import ScaledClock
from core.settings import Settings

__all__ = ["PromqlError", "PromqlSource", "raw_query", "series_names"]

log = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 64 * 1024 * 1024
TS_LABEL = "governor_scrape_ts"


class PromqlError(RuntimeError):
    """Prometheus did not answer a query usefully (the poll sends nothing)."""


def _histograms(engine: str) -> list[str]:
    spec = ENGINES[engine]
    names = [spec["ttft"], spec["e2e"], *(n for n, _ in spec["itl"])]
    if "queue" in spec:
        names.append(spec["queue"])
    return names


def _counters(engine: str) -> list[str]:
    spec = ENGINES[engine]
    return [spec[k] for k in ("finished", "failed", "prompt", "output") if k in spec]


def _gauges(engine: str) -> list[str]:
    spec = ENGINES[engine]
    out = [spec["running"], spec["waiting"], *spec["kv"], "process_start_time_seconds", "up"]
    if "kv_total" in spec:
        out.append(spec["kv_total"])
    if engine == "vllm":
        out.append("vllm:cache_config_info")
    return out


def series_names(engine: str) -> list[str]:
    """Every series name the direct scrape reads for ``engine`` (and ``up``).

    >>> [n for n in series_names("sglang") if "ttft" in n or "first_token" in n]
    ['sglang:time_to_first_token_seconds_bucket', 'sglang:time_to_first_token_seconds_sum', 'sglang:time_to_first_token_seconds_count']
    """
    out = [f"{h}_{suffix}" for h in _histograms(engine) for suffix in ("bucket", "sum", "count")]
    return out + [f"{c}_total" for c in _counters(engine)] + _gauges(engine)


def raw_query(engine: str) -> str:
    """The one instant query of a poll: the raw series and each target's last scrape time."""
    alts = "|".join(re.escape(n).replace("\\:", ":") for n in series_names(engine))
    return f'{{__name__=~"{alts}"}} or label_replace(timestamp(up), "{TS_LABEL}", "1", "", "")'


def _family(name: str, hists: set[str], counters: set[str]) -> tuple[str, str]:
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in hists:
            return name[: -len(suffix)], "histogram"
    if name.endswith("_total") and name[: -len("_total")] in counters:
        return name[: -len("_total")], "counter"
    return name, "gauge"


def parse_vector(body: bytes) -> list[tuple[dict[str, str], float]]:
    """A ``/api/v1/query`` answer -> ``[(labels, value)]`` (PromqlError: not a vector answer)."""
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise PromqlError(f"answer is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        err = doc.get("error") if isinstance(doc, dict) else None
        raise PromqlError(f"query failed: {str(err)[:300]}")
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        raise PromqlError("answer is not an instant vector")
    out: list[tuple[dict[str, str], float]] = []
    for item in data["result"]:
        try:
            metric, (_, raw) = item["metric"], item["value"]
            value = float(raw)
        except (KeyError, TypeError, ValueError):
            continue  # a malformed element: skipped, the rest is usable
        if isinstance(metric, dict) and all(isinstance(v, str) for v in metric.values()) and math.isfinite(value):
            out.append((metric, value))
    return out


class PromqlSource:
    """Polls a Prometheus for the engines' series and turns them into the direct scrape's records."""

    def __init__(
        self,
        settings: Settings,
        base_url: str,
        engine: str,
        model_map: dict[str, str] | None = None,
        combine: str = "upper",
        *,
        interval_s: float = 5.0,
        instance_label: str = "instance",
        timeout_s: float = 10.0,
        clock: ScaledClock | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"GOVERNOR_SCRAPE_PROMETHEUS_URL={base_url!r}: want an http(s) URL")
        self.settings, self.base_url = settings, base_url.rstrip("/")
        self.engine, self.interval_s, self.timeout_s = engine, interval_s, timeout_s
        self.instance_label, self.zone_label = instance_label, settings.scrape_zone_label
        self.scraper = Scraper(settings, [], engine, model_map, combine)
        self.http = TrustedHttp(HttpTrust.for_prometheus(settings))  # TrustError (a ValueError) at start
        self.clock = clock or ScaledClock(settings.clock_speed, settings.clock_origin_s)
        self._last_ts: dict[str, float] = {}  # instance -> Prometheus scrape time (s) of the baseline
        self._reported: set[str] = set()
        self.p95_checks: deque[tuple[str, str, float, Estimate | None]] = deque(maxlen=1024)
        self.polls = 0

    def describe(self) -> str:
        return f"PromQL at {self.base_url}"

    def query(self, promql: str, at_s: float) -> list[tuple[dict[str, str], float]]:
        """One instant query (blocking)."""
        form = urllib.parse.urlencode({"query": promql, "time": f"{at_s:.3f}"}).encode()
        req = urllib.request.Request(f"{self.base_url}/api/v1/query", data=form, method="POST")
        req.add_header("Content-Type", "application/x-www-form-urlencoded")
        try:
            with self.http.open(req, self.timeout_s) as resp:
                body: bytes = resp.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:  # Prometheus answers 400/422/503 with a JSON error
            body = exc.read(64 * 1024)
        except (OSError, TrustError) as exc:  # TrustError: the token file unreadable now
            raise PromqlError(f"POST {self.base_url}/api/v1/query: {exc}") from exc
        if len(body) > MAX_RESPONSE_BYTES:
            raise PromqlError(f"answer over {MAX_RESPONSE_BYTES} bytes")
        return parse_vector(body)

    def _scaled_ms(self, sample_s: float, wall_s: float, now_ms: int) -> int:
        """A Prometheus (wall) sample time on the run's clock: now minus its age, scaled."""
        speed = self.clock.speed if self.clock.origin_s > 0 else 1.0
        return now_ms - int(max(0.0, wall_s - sample_s) * 1000.0 * speed)

    async def collect(self, now_ms: int) -> list[dict[str, Any]]:
        wall_s = time.time()
        try:
            vector = await asyncio.to_thread(self.query, raw_query(self.engine), wall_s)
        except PromqlError as exc:
            log.warning("PromQL poll failed, nothing sent this time: %s", exc)
            return []
        self.polls += 1
        hists, counters = set(_histograms(self.engine)), set(_counters(self.engine))
        by_inst: dict[str, list[Sample]] = {}
        zones: dict[str, str] = {}
        ts: dict[str, float] = {}
        up: dict[str, float] = {}
        for labels, value in vector:
            inst = labels.get(self.instance_label, "")
            if not inst:
                continue
            if labels.get(TS_LABEL) == "1" and "__name__" not in labels:
                ts[inst] = value
                continue
            name = labels.get("__name__", "")
            zones.setdefault(inst, labels.get(self.zone_label, ""))
            if name == "up":
                up[inst] = value
                continue
            fam, kind = _family(name, hists, counters)
            by_inst.setdefault(inst, []).append((fam, kind, name, labels, value))
        # Live targets: those with engine series, and known ones Prometheus still scrapes (a target
        # that is down has no series but an `up`: it keeps its baseline, as a failed direct scrape does;
        # Prometheus' other targets are not ours).
        known = {ep.node for ep in self.scraper.endpoints}
        live_insts = set(by_inst) | (set(up) & known)
        candidates = [Endpoint(f"http://{inst}/metrics", zones[inst]) for inst in sorted(live_insts)]
        endpoints, problems = validate_targets(
            candidates, self.settings.zones, self.settings.scrape_max_targets, Shard.from_settings(self.settings)
        )
        new = [p for p in problems if p not in self._reported]
        if new:
            log.warning("PromQL targets skipped: %s", "; ".join(new[:5]))
        self._reported = set(problems)
        self.scraper.set_endpoints(endpoints)  # baselines of vanished instances dropped
        live = {ep.node for ep in endpoints}
        self._last_ts = {i: t for i, t in self._last_ts.items() if i in live}
        records: list[dict[str, Any]] = []
        fresh: list[tuple[Endpoint, dict[str, Any], float]] = []
        for ep in endpoints:
            inst = ep.node
            t_s = ts.get(inst)
            if up.get(inst) != 1.0 or t_s is None or inst not in by_inst:
                continue  # the target is down: nothing sent, the baseline kept
            prev_s = self._last_ts.get(inst)
            if prev_s is not None and t_s <= prev_s:
                continue  # Prometheus has not scraped it since the last poll
            snaps = snapshots_from_samples(by_inst[inst], self.engine)
            prevs = {served: self.scraper.previous(ep.url, served) for served in snaps}
            records.extend(self.scraper.observe(ep, snaps, self._scaled_ms(t_s, wall_s, now_ms), now_ms))
            self._last_ts[inst] = t_s
            if prev_s is not None:
                fresh.append((ep, {s: (prevs[s], snaps[s]) for s in snaps if prevs[s] is not None}, prev_s))
        if fresh:
            await self._check_p95(fresh, wall_s)
        return records

    async def _check_p95(self, fresh: list[tuple[Endpoint, dict[str, Any], float]], wall_s: float) -> None:
        """Prometheus' own P95 TTFT over the same scrapes, beside the reconstruction's."""
        oldest = min(prev_s for _, _, prev_s in fresh)
        range_ms = int(math.ceil((wall_s - oldest) * 1000.0)) + 1
        ttft = ENGINES[self.engine]["ttft"]
        promql = f"histogram_quantile(0.95, sum by (le, model_name, {self.instance_label}) (rate({ttft}_bucket[{range_ms}ms])))"
        try:
            vector = await asyncio.to_thread(self.query, promql, wall_s)
        except PromqlError as exc:
            log.warning("PromQL P95 cross-check failed: %s", exc)
            return
        theirs = {(lab.get(self.instance_label, ""), lab.get("model_name", "")): v for lab, v in vector}
        for ep, pairs, _ in fresh:
            for served, (prev, cur) in pairs.items():
                delta = snapshot_delta(prev, cur)
                ours = quantile(delta.ttft, 0.95) if delta.ttft is not None else None
                p95 = theirs.get((ep.node, served))
                if p95 is None or ours is None:
                    continue
                self.p95_checks.append((ep.node, served, p95, ours))
                log.info(
                    "%s %s: TTFT P95 PromQL %.4g s, reconstructed %.4g s (true value in [%g, %g])",
                    ep.node,
                    served,
                    p95,
                    ours.value,
                    ours.lo,
                    ours.hi,
                )
