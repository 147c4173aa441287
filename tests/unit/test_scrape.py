"""The scrape adapter's pure part on exposition text written with the engines' metric
definitions (tests/fixtures/engines: names, labels and bucket edges as in vLLM's
``vllm/v1/metrics/loggers.py`` and SGLang's ``srt/metrics/collector.py``).

The deltas between the fixture scrapes, worked by hand (the generator's observations):

vLLM 1 -> 2, 10 finished requests: TTFT 0.05 s x3, 0.2 s x3, 0.6 s x2, 1.5 s x2; per-request
TPOT 0.02 s x5, 0.06 s x3, 0.18 s x2; one ``abort``; e2e 2 s x4, 4 s x4, 8 s x2.
SGLang 1 -> 2, 8 requests: TTFT 0.15 s x4, 0.5 s x2, 1.5 s x2; 380 tokens of ITL, 20 of them
at 0.3 s; one aborted request.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from governor_telemetry.records import validate_record
from hypothesis import example, given, settings
from hypothesis import strategies as st

from adapters.scrape.deltas import (
    Histogram,
    Snapshot,
    Summary,
    counter_delta,
    histogram_delta,
    over_slo,
    quantile,
    snapshot_delta,
    spread,
    violation_bounds,
    window_records,
)
from adapters.scrape.runner import Endpoint, Scraper, parse_endpoint, parse_exposition, parse_model_map
from core.settings import ModelSpec, Settings

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"


def snap(name: str, engine: str) -> Snapshot:
    return parse_exposition((FIX / name).read_text(), engine)[SERVED]


def records(
    delta: Snapshot, ttft_slo_ms: float = 1000.0, itl_slo_ms: float = 150.0, combine: str = "upper"
) -> tuple[list[dict[str, Any]], Summary]:
    return window_records(
        delta,
        model="llama",
        zone="az-a",
        node="10.0.0.5:8000",
        t_prev_ms=1_000_000,
        t_now_ms=1_005_000,
        open_from_ms=1_000_000,
        ttft_slo_ms=ttft_slo_ms,
        itl_slo_ms=itl_slo_ms,
        combine=combine,
    )


def test_vllm_parse_reads_the_engine_series() -> None:
    s = snap("vllm_2.txt", "vllm")
    assert s.ttft is not None and s.ttft.edges[:3] == (0.001, 0.005, 0.01) and len(s.ttft.edges) == 22
    assert s.itl is not None and s.itl.per_request  # request_time_per_output_token preferred
    assert (s.finished, s.failed) == (110.0, 1.0)
    assert (s.running, s.waiting, s.kv_usage, s.kv_total) == (4.0, 2.0, 0.25, 8000)
    assert s.start_time_s == 1.7e9


def test_vllm_delta_counts_and_bounds_by_hand() -> None:
    d = snapshot_delta(snap("vllm_1.txt", "vllm"), snap("vllm_2.txt", "vllm"))
    assert d.ttft is not None and d.itl is not None and d.e2e is not None
    assert (d.ttft.count, d.e2e.count, d.failed, d.prompt_tokens, d.output_tokens) == (10, 10, 1, 5000, 2000)
    # SLO on a bucket edge (1.0 s; 0.15 s): exact
    assert over_slo(d.ttft, 1.0) == (2, 2)
    assert over_slo(d.itl, 0.15) == (2, 2)
    # off an edge: 0.6 s sits inside (0.5, 0.75] which holds 2 -> [2, 4]
    assert over_slo(d.ttft, 0.6) == (2, 4)
    recs, summ = records(d)
    reqs = [r for r in recs if r["kind"] == "request"]
    assert len(reqs) == 10 and all(validate_record(r) is None for r in recs)
    # failed 1, TTFT 2, ITL 2: bounds [max, min(n, sum)] = [2, 5]; the truth (3) is inside
    assert summ.bounds == (2, 5) and summ.realised == 5
    bad = [r for r in reqs if r["status"] != "ok" or r["ttft_ms"] > 1000 or r["itl_ms"] > 150]
    assert len(bad) == 5
    _, low = records(d, combine="lower")
    assert low.realised == 2
    assert sum(r["prompt_tokens"] for r in reqs) == 5000
    assert all(r["e2e_ms"] >= r["ttft_ms"] and r["queue_ms"] <= r["ttft_ms"] for r in reqs)
    gpu = recs[-1]
    assert (gpu["kind"], gpu["running"], gpu["queue_len"], gpu["kv_blocks_used"], gpu["kv_blocks_total"]) == (
        "gpu",
        4,
        2,
        2000,
        8000,
    )


def test_off_edge_slo_records_carry_the_named_end_of_the_bounds() -> None:
    d = snapshot_delta(snap("vllm_1.txt", "vllm"), snap("vllm_2.txt", "vllm"))
    for combine, want in (("upper", 4), ("lower", 2)):
        recs, summ = records(d, ttft_slo_ms=600.0, itl_slo_ms=10_000.0, combine=combine)
        slow = sum(1 for r in recs if r["kind"] == "request" and r["ttft_ms"] > 600.0)
        # the two in (0.5, 0.75] straddle the SLO: both over for upper, both at it for lower
        assert summ.ttft_over == (2, 4) and slow == want, combine
        assert all(
            0.5 * 1000 < r["ttft_ms"] <= 750.0 for r in recs if r["kind"] == "request" and 500 < r["ttft_ms"] < 1000
        )


def _itl_delta(itl_s: float, n: int, edges: tuple[float, ...], tokens_each: int = 16) -> Snapshot:
    """``n`` requests, every token ``itl_s`` apart, TTFT 50 ms; SGLang's per-token ITL histogram."""
    cum = tuple(float(n * tokens_each) if itl_s <= e else 0.0 for e in edges) + (float(n * tokens_each),)
    ttft = Histogram((0.1, 0.2), (float(n), float(n), float(n)))
    return Snapshot(ttft=ttft, itl=Histogram(edges, cum, per_request=False), e2e=ttft, finished=n)


SGLANG_ITL_EDGES = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2)


def test_upper_never_counts_fewer_violations_than_there_were() -> None:
    # issue 34: every token at 180 ms against a 150 ms ITL SLO: 8 of 8 violate; the records carried 4
    recs, summ = records(_itl_delta(0.18, 8, SGLANG_ITL_EDGES), itl_slo_ms=150.0)
    assert summ.bounds == (0, 8) and summ.realised == 8
    assert sum(1 for r in recs if r["kind"] == "request" and r["itl_ms"] > 150.0) == 8
    # 120 ms tokens: none violate; upper still says 8 (it cannot tell), lower says 0
    _, low = records(_itl_delta(0.12, 8, SGLANG_ITL_EDGES), itl_slo_ms=150.0, combine="lower")
    assert low.realised == 0
    # every token above the SLO's bucket (250 ms > 200 ms): each request's mean is over, both ends say 8
    _, both = records(_itl_delta(0.25, 8, SGLANG_ITL_EDGES), itl_slo_ms=150.0, combine="lower")
    assert both.bounds == (8, 8) and both.realised == 8


def test_quantiles_carry_their_bucket() -> None:
    d = snapshot_delta(snap("vllm_1.txt", "vllm"), snap("vllm_2.txt", "vllm"))
    assert d.ttft is not None
    p50 = quantile(d.ttft, 0.5)  # rank 5: 2nd of the 3 in (0.1, 0.25]
    assert p50 is not None and (p50.lo, p50.hi) == (0.1, 0.25) and p50.value == pytest.approx(0.2)
    p99 = quantile(d.ttft, 0.99)  # rank 9.9: in (1.0, 2.5]
    assert p99 is not None and (p99.lo, p99.hi) == (1.0, 2.5)
    # the records' values sit in the same buckets: any quantile of them is within the bucket width
    vals = sorted(spread(d.ttft, 10))
    assert vals[4] > 0.1 and vals[5] <= 0.25


def test_counter_reset_takes_the_new_value_as_the_delta() -> None:
    before, restarted = snap("vllm_2.txt", "vllm"), snap("vllm_3_restart.txt", "vllm")
    d = snapshot_delta(before, restarted)  # process_start_time_seconds changed
    assert d.ttft is not None and d.ttft.count == 3 and d.failed == 0 and d.prompt_tokens == 300
    # without the start time, each series' decrease says the same (rate() semantics)
    from dataclasses import replace

    d2 = snapshot_delta(replace(before, start_time_s=None), replace(restarted, start_time_s=None))
    assert d2.ttft == restarted.ttft and d2.prompt_tokens == 300 and d2.failed == 0
    assert counter_delta(5, 7) == 2 and counter_delta(7, 5) == 5
    # a histogram with one bucket down but the count up is reset whole
    h = histogram_delta(Histogram((1.0,), (4.0, 5.0)), Histogram((1.0,), (3.0, 6.0)))
    assert h is not None and h.cumulative == (3.0, 6.0)


def test_sglang_per_token_itl_is_bounded_not_exact() -> None:
    d = snapshot_delta(snap("sglang_1.txt", "sglang"), snap("sglang_2.txt", "sglang"))
    assert d.ttft is not None and d.itl is not None and not d.itl.per_request
    assert (d.ttft.count, d.itl.count, d.failed) == (8, 380, 1)
    assert over_slo(d.ttft, 1.0) == (2, 2)  # on SGLang's edge 1
    assert over_slo(d.ttft, 0.5) == (2, 4)  # inside (0.4, 0.6]
    assert over_slo(d.itl, 0.15) == (20, 20)  # tokens, not requests
    recs, summ = records(d)
    assert summ.itl_over == (0, 8)  # 20 slow tokens: 0 to min(8, 20) requests
    assert summ.bounds == (2, 8) and summ.realised == 8  # upper: TTFT 2 + failed 1 + ITL up to 8, at most 8
    assert records(d, combine="lower")[1].realised == 2  # lower: the largest part (TTFT 2; failed among them)
    assert all(validate_record(r) is None for r in recs)
    gpu = recs[-1]
    assert (gpu["running"], gpu["queue_len"], gpu["kv_blocks_total"], gpu["kv_blocks_used"]) == (7, 3, 400000, 200000)


def test_violation_bounds_by_hand() -> None:
    assert violation_bounds(10, [(1, 1), (2, 2), (2, 2)]) == (2, 5)
    assert violation_bounds(4, [(3, 3), (3, 3)]) == (3, 4)
    assert violation_bounds(0, []) == (0, 0)


def test_records_are_spread_over_the_open_part_of_the_interval() -> None:
    d = snapshot_delta(snap("vllm_1.txt", "vllm"), snap("vllm_2.txt", "vllm"))
    recs, _ = window_records(
        d,
        model="m",
        zone="z",
        node="n",
        t_prev_ms=0,
        t_now_ms=15_000,
        open_from_ms=10_000,
        ttft_slo_ms=1000.0,
        itl_slo_ms=150.0,
    )
    ts = [r["ts_ms"] for r in recs if r["kind"] == "request"]
    assert min(ts) > 10_000 and max(ts) <= 15_000
    # the slow ones are not bunched at one end: the first and second halves both get some
    slow = [r["ts_ms"] for r in recs if r["kind"] == "request" and r["ttft_ms"] > 1000]
    assert len(slow) == 2 and min(slow) < 12_500 < max(slow)


def test_spread_keeps_each_value_inside_its_bucket() -> None:
    h = Histogram((0.5, 1.0), (3.0, 3.0, 5.0))
    vals = spread(h, 5)
    assert vals[:2] == [2.0 - 0.25, 1.0 + 0.25] and all(0 < v < 0.5 for v in vals[2:])
    assert math.isinf(h.buckets()[-1][1])


def test_scraper_baseline_then_delta_and_model_map() -> None:
    settings = Settings(models=(ModelSpec("llama", ttft_slo_ms=1000.0, itl_slo_ms=150.0),))
    ep = Endpoint("http://10.0.0.5:8000/metrics", "az-a")
    s = Scraper(settings, [ep], "vllm", {SERVED: "llama"})
    assert s.step({ep.url: (FIX / "vllm_1.txt").read_text()}, 1_000_000) == []
    assert s.step({ep.url: OSError("refused")}, 1_005_000) == []  # a failed scrape keeps the baseline
    recs = s.step({ep.url: (FIX / "vllm_2.txt").read_text()}, 1_010_000)
    assert len(recs) == 11 and {r["model"] for r in recs} == {"llama"} and {r["node"] for r in recs} == {ep.node}
    assert s.summaries[-1][2].bounds == (2, 5)


def test_cli_values_parse() -> None:
    assert parse_endpoint("http://h:8000/metrics=az-b") == Endpoint("http://h:8000/metrics", "az-b")
    assert parse_model_map(["a/b=c"]) == {"a/b": "c"}
    for bad in ("h:8000=az-a", "http://h:8000/metrics"):
        with pytest.raises(ValueError):
            parse_endpoint(bad)


def _histogram(edges: tuple[float, ...], values: list[float], per_request: bool = True) -> Histogram:
    cum = tuple(float(sum(1 for v in values if v <= e)) for e in edges) + (float(len(values)),)
    return Histogram(edges, cum, per_request=per_request)


VLLM_TTFT_EDGES = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0)
VLLM_ITL_EDGES = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0)


@settings(derandomize=True, max_examples=150, deadline=None)
@given(
    ttft=st.lists(st.floats(0.005, 4.0), min_size=1, max_size=30),
    gaps=st.lists(st.lists(st.floats(0.005, 0.6), min_size=1, max_size=6), min_size=30, max_size=30),
    ttft_slo=st.sampled_from([0.1, 0.3, 0.5, 0.7, 1.0]),
    itl_slo=st.sampled_from([0.05, 0.12, 0.15, 0.18]),
    per_token=st.booleans(),
    failed=st.integers(0, 3),
)
@example(ttft=[0.05] * 8, gaps=[[0.18] * 4] * 30, ttft_slo=1.0, itl_slo=0.15, per_token=True, failed=0)  # issue 34
def test_the_bounds_hold_the_true_violation_count(
    ttft: list[float],
    gaps: list[list[float]],
    ttft_slo: float,
    itl_slo: float,
    per_token: bool,
    failed: int,
) -> None:
    """Requests with known TTFT and token gaps -> histograms -> records: lower <= truth <= upper,
    on and off bucket edges, per-request (vLLM TPOT) and per-token (SGLang, vLLM ITL) histograms."""
    n = len(ttft)
    gaps = gaps[:n]
    failed = min(failed, n)
    means = [sum(g) / len(g) for g in gaps]
    truth = sum(1 for i in range(n) if i < failed or ttft[i] > ttft_slo or means[i] > itl_slo)
    itl = (
        _histogram(SGLANG_ITL_EDGES, [x for g in gaps for x in g], per_request=False)
        if per_token
        else _histogram(VLLM_ITL_EDGES, means)
    )
    h = _histogram(VLLM_TTFT_EDGES, ttft)
    d = Snapshot(ttft=h, itl=itl, e2e=h, finished=n, failed=failed)
    _, upper = records(d, ttft_slo_ms=ttft_slo * 1000, itl_slo_ms=itl_slo * 1000, combine="upper")
    _, lower = records(d, ttft_slo_ms=ttft_slo * 1000, itl_slo_ms=itl_slo * 1000, combine="lower")
    assert lower.realised <= truth <= upper.realised
    assert upper.bounds[0] <= lower.realised and upper.realised <= upper.bounds[1] + 1e-9


def test_a_delta_counts_finished_requests_not_first_tokens() -> None:
    # issue 34: 2 first tokens in a scrape interval, 0 finished, gave 2 records, and the e2e
    # histogram counted the same 2 again when they finished
    edges = (0.1, 0.2)
    two = Histogram(edges, (0.0, 2.0, 2.0))
    recs, summ = records(Snapshot(ttft=two, e2e=Histogram(edges, (0.0, 0.0, 0.0))), ttft_slo_ms=100.0)
    assert summ.n == 0 and [r["kind"] for r in recs] == ["gpu"]
    # they finish in a delta with no TTFT left (the adapter carried theirs, or they failed before
    # a first token): counted, their e2e standing for the TTFT (over the 100 ms SLO here)
    recs, summ = records(Snapshot(ttft=Histogram(edges, (0.0, 0.0, 0.0)), e2e=two, failed=0), ttft_slo_ms=100.0)
    assert summ.n == 2 and all(r["ttft_ms"] > 100.0 for r in recs if r["kind"] == "request")
