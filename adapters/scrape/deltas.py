"""Engine ``/metrics`` scrapes -> deltas -> window telemetry (pure: no I/O, no clock).

The scrape adapter (:mod:`adapters.scrape.runner`) reads the cumulative counters and
histograms that vLLM and SGLang expose and turns the difference between two scrapes of
one replica into the records the pipeline already windows (one ``request`` record per
finished request, one ``gpu`` record per scrape).  A histogram does not say which TTFT
belongs to which request, so the request records are *reconstructed*; what that costs:

* **Counts** are exact: one record per finished request in the delta (``n``: the e2e
  histogram's count; the TTFT histogram's only for an engine that exports no e2e one).  vLLM
  observes a TTFT at the first token, so a scrape may show TTFTs of requests that have not
  finished: the adapter keeps those pending in its baseline (:func:`carry_unfinished`) until
  the scrape that shows them finished.  A delta with finished requests and no TTFT observation
  left (they failed before a first token) takes the e2e histogram as their TTFTs.
* **Values**: a bucket ``(lo, hi]`` holding ``k`` observations gives ``k`` values spread
  evenly inside it (``lo + (hi - lo)(j + 1/2)/k``), so a quantile of the records is off
  from the true one by less than the width of the bucket it falls in
  (:func:`quantile` returns that interval).  The ``+Inf`` bucket has no upper edge: its
  values sit at twice the last edge, and a quantile there is a lower bound only.
* **TTFT over the SLO** (:func:`over_slo`): exact when the SLO is a bucket edge, else
  within ``[count above the next edge, count above the previous edge]``: "upper" counts
  everything above the largest edge at or below the SLO, "lower" only what is above the
  smallest edge at or above it.  The records carry the end that ``combine`` names
  (:func:`pin_over`: the values of the bucket that straddles the SLO are put above it
  for "upper", at it for "lower"), so "upper" never counts fewer violations than there
  were and "lower" never more.  :func:`edge_advice` says which edges to add.
* **ITL**: vLLM's ``vllm:request_time_per_output_token_seconds`` is per request (each
  request's mean), so it is treated like TTFT.  vLLM's ``vllm:inter_token_latency_seconds``
  (older: ``vllm:time_per_output_token_seconds``) and SGLang's
  ``sglang:inter_token_latency_seconds`` count *tokens*: the requests whose mean ITL is over
  the SLO are then bounded only by ``[0, min(n, tokens above the largest edge <= SLO)]``
  (``[n, n]`` when every token is surely over).  A histogram whose count differs from ``n``
  is resampled to ``n`` values (same quantiles).
* **Failed**: vLLM ``request_success_total`` with a ``finished_reason`` other than
  ``stop``/``length`` (``abort``, ``error``); SGLang ``num_aborted_requests_total``.

**Violations.**  A request violates when it failed OR its TTFT OR its ITL is over the
SLO, and each histogram gives its part alone.  The combined count lies in
``[max(parts), min(n, sum(parts))]`` (:func:`violation_bounds`): the parts may overlap
completely or not at all.  The records realise one end by how the parts are paired:
``"upper"`` (the default, and what the controller sees) takes each part's high end and puts
the slow-TTFT, slow-ITL and failed requests on different records, so the records carry
``min(n, sum of the highs)``; ``"lower"`` takes each part's low end on the same records
(``max`` of the lows).  Upper is the safe side for an SLO guard: it never reports meeting
the SLO when the fleet may not.  Both are exact when the SLOs are bucket edges and the
histograms count requests.

**Scrape interval vs windows.**  A delta's records are spread over the scrape interval
``(t_prev, t_now]`` (a low-discrepancy order, so every part of the interval gets a fair
share of slow and fast requests), except that no record is stamped into a window that
has already closed: the spread starts no earlier than ``open_from_ms`` (the start of the
oldest window still open when the records arrive).  With 10 s windows, 2 s lateness and
5 s scrapes, each window gets its two intervals pro rata (a slice of an interval that
straddles a closed window moves into the next one).  With 15 s scrapes, a whole
interval lands in one window: every window gets one interval or none, so its request
*count* and rate are 1.5x or 0 while the violation *rate* (a ratio) is unbiased; scrape
at most every ``window_s / 2``.

**Counter resets** (engine restart) follow Prometheus ``rate()``: a counter that went
down restarted from zero, so the new value is the delta.  A histogram whose count or any
bucket went down is reset as a whole; a changed ``process_start_time_seconds`` resets
every series.  A restart that served more requests than before it is, as in
Prometheus, not detectable from the counters alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["Histogram", "Snapshot", "Summary", "counter_delta", "histogram_delta", "over_slo", "quantile"]
__all__ += ["snapshot_delta", "spread", "violation_bounds", "window_records", "gpu_record", "pin_over"]
__all__ += ["edge_advice", "nearest_edges", "carry_unfinished"]

GOLDEN = 0.6180339887498949
COMBINE = ("upper", "lower")


@dataclass(frozen=True)
class Histogram:
    """Cumulative buckets: ``cumulative[i]`` observations ``<= edges[i]``; the last entry is
    the ``+Inf`` bucket (the count).  ``per_request``: one observation per request."""

    edges: tuple[float, ...]
    cumulative: tuple[float, ...]
    total: float = 0.0
    per_request: bool = True
    name: str = ""  # the engine's metric name (for messages)

    @property
    def count(self) -> float:
        return self.cumulative[-1] if self.cumulative else 0.0

    def buckets(self) -> list[tuple[float, float, float]]:
        """``(lo, hi, k)`` per bucket, non-cumulative; the ``+Inf`` bucket's hi is ``inf``.

        >>> Histogram((0.1, 0.5), (2.0, 5.0, 6.0)).buckets()
        [(0.0, 0.1, 2.0), (0.1, 0.5, 3.0), (0.5, inf, 1.0)]
        """
        out, prev, lo = [], 0.0, 0.0
        for hi, cum in zip((*self.edges, math.inf), self.cumulative, strict=True):
            out.append((lo, hi, cum - prev))
            prev, lo = cum, hi
        return out


@dataclass(frozen=True)
class Snapshot:
    """One served model's series on one replica at one scrape (counters are cumulative)."""

    ttft: Histogram | None = None
    itl: Histogram | None = None
    e2e: Histogram | None = None
    queue: Histogram | None = None
    finished: float = 0.0
    failed: float = 0.0
    prompt_tokens: float = 0.0
    output_tokens: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float | None = None  # fraction of the KV pool in use
    kv_total: int | None = None  # KV pool size (vLLM blocks, SGLang tokens)
    start_time_s: float | None = None  # process_start_time_seconds


def counter_delta(prev: float, cur: float) -> float:
    """Increase of a counter, Prometheus ``rate()`` style: a decrease is a restart.

    >>> counter_delta(10, 14), counter_delta(10, 3)
    (4, 3)
    """
    return cur if cur < prev else cur - prev


def histogram_delta(prev: Histogram | None, cur: Histogram | None) -> Histogram | None:
    """Observations between two scrapes; a decreased bucket (or new edges) is a reset.

    >>> h = histogram_delta(Histogram((1.0,), (2.0, 3.0)), Histogram((1.0,), (5.0, 7.0)))
    >>> h.cumulative
    (3.0, 4.0)
    >>> histogram_delta(Histogram((1.0,), (5.0, 7.0)), Histogram((1.0,), (1.0, 1.0))).cumulative
    (1.0, 1.0)
    """
    if cur is None or prev is None:
        return cur
    if prev.edges != cur.edges or any(c < p for p, c in zip(prev.cumulative, cur.cumulative, strict=True)):
        return cur
    cum = tuple(c - p for p, c in zip(prev.cumulative, cur.cumulative, strict=True))
    return replace(cur, cumulative=cum, total=counter_delta(prev.total, cur.total))


def snapshot_delta(prev: Snapshot, cur: Snapshot) -> Snapshot:
    """What happened between two scrapes (gauges: the current values)."""
    if prev.start_time_s is not None and cur.start_time_s is not None and prev.start_time_s != cur.start_time_s:
        return cur  # the engine restarted: everything counted since is new
    return replace(
        cur,
        ttft=histogram_delta(prev.ttft, cur.ttft),
        itl=histogram_delta(prev.itl, cur.itl),
        e2e=histogram_delta(prev.e2e, cur.e2e),
        queue=histogram_delta(prev.queue, cur.queue),
        finished=counter_delta(prev.finished, cur.finished),
        failed=counter_delta(prev.failed, cur.failed),
        prompt_tokens=counter_delta(prev.prompt_tokens, cur.prompt_tokens),
        output_tokens=counter_delta(prev.output_tokens, cur.output_tokens),
    )


@dataclass(frozen=True)
class Estimate:
    value: float
    lo: float
    hi: float


def quantile(h: Histogram, q: float) -> Estimate | None:
    """``histogram_quantile`` (linear inside the bucket) and the bucket that holds the truth.

    >>> quantile(Histogram((0.1, 0.5, 1.0), (2.0, 6.0, 10.0, 10.0)), 0.5)
    Estimate(value=0.4, lo=0.1, hi=0.5)
    """
    if h.count <= 0 or not 0.0 <= q <= 1.0:
        return None
    rank = q * h.count
    for lo, hi, k in h.buckets():
        if k > 0 and rank <= k:
            if math.isinf(hi):
                return Estimate(lo, lo, math.inf)  # Prometheus answers the last finite edge
            return Estimate(lo + (hi - lo) * rank / k, lo, hi)
        rank -= k
    lo = h.edges[-1] if h.edges else 0.0
    return Estimate(lo, lo, math.inf)


def over_slo(h: Histogram, slo_s: float) -> tuple[float, float]:
    """Observations above ``slo_s``: (low, high); equal when the SLO is a bucket edge.

    >>> h = Histogram((0.25, 0.5, 1.0), (4.0, 7.0, 9.0, 10.0))
    >>> over_slo(h, 0.5), over_slo(h, 0.6)
    ((3.0, 3.0), (1.0, 3.0))
    """
    below_lo, below_hi = 0.0, h.count  # observations surely <= slo, surely <= the next edge
    for edge, cum in zip(h.edges, h.cumulative, strict=False):
        if edge <= slo_s:
            below_lo = cum
        if edge >= slo_s:
            below_hi = cum
            break
    return h.count - below_hi, h.count - below_lo


def violation_bounds(n: float, parts: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Requests violating in any part: at least the largest part, at most all parts disjoint.

    >>> violation_bounds(100, [(5, 5), (3, 7), (2, 2)])
    (5, 14)
    >>> violation_bounds(10, [(6, 6), (7, 7)])
    (7, 10)
    """
    if not parts:
        return 0, 0
    return max(lo for lo, _ in parts), min(n, sum(hi for _, hi in parts))


def spread(h: Histogram, n: int) -> list[float]:
    """``n`` values with ``h``'s distribution, largest first (one per observation when
    ``h.count == n``, each strictly inside its bucket).

    >>> spread(Histogram((1.0, 2.0), (2.0, 3.0, 3.0)), 3)
    [1.5, 0.75, 0.25]
    """
    if n <= 0 or h.count <= 0:
        return []
    buckets = h.buckets()
    last_edge = h.edges[-1] if h.edges else 1.0
    out, bi, before = [], 0, 0.0
    for i in range(n):
        rank = (i + 0.5) * h.count / n
        while bi < len(buckets) - 1 and rank > before + buckets[bi][2]:
            before += buckets[bi][2]
            bi += 1
        lo, hi, k = buckets[bi]
        if math.isinf(hi):
            hi = 2.0 * last_edge
        out.append(lo + (hi - lo) * (rank - before) / k if k > 0 else hi)
    out.reverse()
    return out


@dataclass(frozen=True)
class Summary:
    """What one delta said: counts, the parts over the SLO (low, high), their combination."""

    n: int
    ttft_over: tuple[float, float]
    itl_over: tuple[float, float]
    failed: int
    bounds: tuple[float, float]
    realised: int  # violations the records carry (one end of the bounds, see module doc)
    combine: str
    ttft_p50: Estimate | None
    ttft_p99: Estimate | None


def _realised(values: list[float], slo: float) -> int:
    return sum(1 for v in values if v > slo)


def nearest_edges(edges: Sequence[float], x: float) -> tuple[float | None, float | None]:
    """The largest edge ``<= x`` and the smallest ``>= x`` (None: there is none).

    >>> nearest_edges((0.1, 0.2, 0.4), 0.15), nearest_edges((0.1, 0.2), 0.2), nearest_edges((0.1,), 5)
    ((0.1, 0.2), (0.2, 0.2), (0.1, None))
    """
    below = max((e for e in edges if e <= x), default=None)
    above = min((e for e in edges if e >= x), default=None)
    return below, above


def pin_over(values: list[float], slo: float, k: int, edges_ms: Sequence[float] = ()) -> list[float]:
    """``values`` (largest first) with exactly ``k`` of them over ``slo``, largest first.

    Values missing above the SLO are raised to the edge above it (the top of the bucket that
    straddles the SLO; just over the SLO when there is none); values over the SLO beyond ``k``
    are lowered to the SLO itself (not over).  The histogram allows both: it only says the
    straddling bucket's values are somewhere in it.

    >>> pin_over([300.0, 160.0, 120.0, 90.0], 150.0, 3, (100.0, 200.0, 400.0))
    [300.0, 200.0, 160.0, 90.0]
    >>> pin_over([300.0, 160.0, 120.0], 150.0, 1)
    [300.0, 150.0, 120.0]
    """
    k = max(0, min(k, len(values)))
    out = sorted(values, reverse=True)
    over = _realised(out, slo)
    if over < k:
        _, above = nearest_edges(edges_ms, slo)
        lift = above if above is not None and above > slo else math.nextafter(slo, math.inf)
        for i in range(over, k):
            out[i] = max(out[i], lift)
    for i in range(k, over):
        out[i] = slo
    return sorted(out, reverse=True)


def edge_advice(metric: str, edges: Sequence[float], slo_s: float) -> str | None:
    """None when ``slo_s`` is a bucket edge of ``metric``; else what the two bounds are and how
    to add the edge (the engine's own flag).

    >>> edge_advice("vllm:time_to_first_token_seconds", (0.5, 1.0), 1.0) is None
    True
    >>> print(edge_advice("sglang:inter_token_latency_seconds", (0.1, 0.2), 0.15))  # doctest: +ELLIPSIS
    SLO 150 ms is not a bucket edge of sglang:inter_token_latency_seconds (nearest edges 100 ms and 200 ms): ...
    """
    if any(math.isclose(e, slo_s, rel_tol=1e-9, abs_tol=1e-12) for e in edges):
        return None
    below, above = nearest_edges(edges, slo_s)

    def ms(x: float | None) -> str:
        return "none" if x is None else f"{x * 1000:g} ms"

    family = "time_to_first_token" if "first_token" in metric else "inter_token_latency"
    if metric.startswith("sglang:"):
        flag = "--bucket-time-to-first-token" if family == "time_to_first_token" else "--bucket-inter-token-latency"
        how = f"start SGLang with {flag} listing {slo_s:g} among the edges"
    else:
        how = f"start vLLM with --custom-histogram-buckets '{{\"{family}\": [..., {slo_s:g}, ...]}}'"
        if family != "time_to_first_token":
            how += " (its request_time_per_output_token histogram shares that family)"
    return (
        f"SLO {slo_s * 1000:g} ms is not a bucket edge of {metric} (nearest edges {ms(below)} and {ms(above)}): "
        f"violations are known only within [above {ms(above)}, above {ms(below)}]; upper counts the latter, "
        f"lower the former; to count exactly, {how}"
    )


def _scaled(part: tuple[float, float], h: Histogram, n: int) -> tuple[float, float]:
    """A part counted in ``h``'s population, in requests."""
    lo, hi = part
    if not h.per_request:  # tokens: all surely over -> every request's mean is over
        return (float(n) if h.count > 0 and lo >= h.count else 0.0), min(float(n), hi)
    f = n / h.count if h.count > 0 else 0.0
    return min(float(n), lo * f), min(float(n), hi * f)


def window_records(
    delta: Snapshot,
    *,
    model: str,
    zone: str,
    node: str,
    t_prev_ms: int,
    t_now_ms: int,
    open_from_ms: int,
    ttft_slo_ms: float,
    itl_slo_ms: float,
    combine: str = "upper",
) -> tuple[list[dict[str, Any]], Summary]:
    """The request records and the GPU record of one replica's delta, and its summary."""
    if combine not in COMBINE:
        raise ValueError(f"combine={combine!r}: choose one of {COMBINE}")
    # Finished requests only: vLLM observes a TTFT at the first token, long before the request
    # finishes, so a TTFT count holds requests that a later e2e count holds again.
    base = delta.e2e if delta.e2e is not None else delta.ttft
    n = int(round(base.count)) if base is not None else 0
    ttft_h = delta.ttft if delta.ttft is not None and delta.ttft.count > 0 else delta.e2e
    ttft = spread(ttft_h, n) if ttft_h is not None else []
    n = n if ttft else 0
    itl = spread(delta.itl, n) if delta.itl is not None else []
    e2e = spread(delta.e2e, n) if delta.e2e is not None else []
    queue = spread(delta.queue, n) if delta.queue is not None else []
    failed = min(n, int(round(delta.failed)))
    ttft_ms = [v * 1000.0 for v in ttft]
    itl_ms = [v * 1000.0 for v in itl]
    parts = [(float(failed), float(failed))]
    ttft_part = itl_part = (0.0, 0.0)
    if ttft_h is not None and n:
        ttft_part = _scaled(over_slo(ttft_h, ttft_slo_ms / 1000.0), ttft_h, n)
        parts.append(ttft_part)
        ttft_ms = pin_over(ttft_ms, ttft_slo_ms, _end(ttft_part, combine), [e * 1000.0 for e in ttft_h.edges])
    if delta.itl is not None and n and itl_ms:
        itl_part = _scaled(over_slo(delta.itl, itl_slo_ms / 1000.0), delta.itl, n)
        parts.append(itl_part)
        itl_ms = pin_over(itl_ms, itl_slo_ms, _end(itl_part, combine), [e * 1000.0 for e in delta.itl.edges])
    a, b = _realised(ttft_ms, ttft_slo_ms), _realised(itl_ms, itl_slo_ms)
    bounds = violation_bounds(n, parts)
    # Pairing: record i gets the i-th largest TTFT; ITL and failures start at an offset.
    off_itl, off_fail = (a, (a + b)) if combine == "upper" else (0, 0)
    itl_at = [0.0] * n
    for i, v in enumerate(itl_ms):
        itl_at[(off_itl + i) % n] = v
    fail_at = [False] * n
    for i in range(failed):
        fail_at[(off_fail + i) % n] = True
    prompt = _split(delta.prompt_tokens, n)
    output = _split(delta.output_tokens, n)
    start = min(max(t_prev_ms, open_from_ms), t_now_ms)
    span = t_now_ms - start
    records: list[dict[str, Any]] = []
    realised = 0
    for i in range(n):
        t = ttft_ms[i]
        e = max(e2e[i] * 1000.0 if e2e else t, t)
        rec: dict[str, Any] = {
            "kind": "request",
            "request_id": f"{node}/{t_now_ms}/{i}",
            "ts_ms": t_now_ms - int(span * (((i + 0.5) * GOLDEN) % 1.0)),
            "model": model,
            "zone": zone,
            "node": node,
            "ttft_ms": t,
            "e2e_ms": e,
            "prompt_tokens": prompt[i],
            "output_tokens": output[i],
            "status": "error" if fail_at[i] else "ok",
        }
        if itl_ms:
            rec["itl_ms"] = itl_at[i]
        if queue:
            rec["queue_ms"] = min(queue[i] * 1000.0, t)
        realised += fail_at[i] or t > ttft_slo_ms or (bool(itl_ms) and itl_at[i] > itl_slo_ms)
        records.append(rec)
    records.append(gpu_record(delta, model=model, zone=zone, node=node, ts_ms=t_now_ms))
    summary = Summary(
        n=n,
        ttft_over=ttft_part,
        itl_over=itl_part,
        failed=failed,
        bounds=bounds,
        realised=realised,
        combine=combine,
        ttft_p50=quantile(ttft_h, 0.5) if ttft_h is not None else None,
        ttft_p99=quantile(ttft_h, 0.99) if ttft_h is not None else None,
    )
    return records, summary


def carry_unfinished(cur: Snapshot, delta: Snapshot, n: int) -> Snapshot:
    """The baseline for the next delta after ``delta`` gave ``n`` records: ``cur`` less the TTFT
    observations of requests not finished yet (more TTFTs than finished requests), so those
    reach the records of the scrape where their requests finish.  Which observations are still
    pending is unknown: each bucket keeps the same share of them.

    >>> cur = Snapshot(ttft=Histogram((1.0,), (4.0, 6.0), total=6.0))
    >>> carry_unfinished(cur, cur, 3).ttft.cumulative  # 3 of 6 TTFTs belong to finished requests
    (2.0, 3.0)
    >>> carry_unfinished(cur, cur, 6) is cur
    True
    """
    h, base = delta.ttft, cur.ttft
    if h is None or base is None or h.count <= n or h.edges != base.edges:
        return cur
    keep = 1.0 - n / h.count
    cum = tuple(c - keep * d for c, d in zip(base.cumulative, h.cumulative, strict=True))
    return replace(cur, ttft=replace(base, cumulative=cum, total=base.total - keep * h.total))


def _end(part: tuple[float, float], combine: str) -> int:
    """The count of one part the records carry: its high end for upper, its low end for lower."""
    return math.ceil(part[1] - 1e-9) if combine == "upper" else math.floor(part[0] + 1e-9)


def _split(total: float, n: int) -> list[int]:
    """``total`` as ``n`` non-negative ints that add up to it.

    >>> _split(10, 3)
    [4, 3, 3]
    """
    if n <= 0:
        return []
    q, r = divmod(max(0, int(round(total))), n)
    return [q + (1 if i < r else 0) for i in range(n)]


def gpu_record(snap: Snapshot, *, model: str, zone: str, node: str, ts_ms: int) -> dict[str, Any]:
    """The replica's gauges as a ``gpu`` record.

    Engines export no GPU utilisation or memory: ``gpu_util`` carries the KV pool's
    occupancy (the engine's own measure of how full it is; 0 when not exported) and the
    memory fields are 0 (not reported).  ``kv_blocks_*`` are the pool in the engine's
    units (vLLM blocks from ``vllm:cache_config_info``; SGLang tokens).

    >>> r = gpu_record(Snapshot(running=3, waiting=2, kv_usage=0.5, kv_total=100), model="m", zone="z", node="n", ts_ms=1)
    >>> r["running"], r["queue_len"], r["gpu_util"], r["kv_blocks_used"]
    (3, 2, 0.5, 50)
    """
    usage = min(1.0, max(0.0, snap.kv_usage or 0.0))
    rec: dict[str, Any] = {
        "kind": "gpu",
        "ts_ms": ts_ms,
        "node": node,
        "zone": zone,
        "model": model,
        "state": "ready",
        "gpu_util": usage,
        "mem_used_bytes": 0,
        "mem_total_bytes": 0,
        "queue_len": max(0, int(round(snap.waiting))),
        "running": max(0, int(round(snap.running))),
    }
    if snap.kv_total:
        rec["kv_blocks_total"] = int(snap.kv_total)
        rec["kv_blocks_used"] = min(int(snap.kv_total), int(round(usage * snap.kv_total)))
    return rec
