"""The PromQL source's pure parts: the query it sends and how it reads Prometheus' answers
(hostile ones included).  The source against a real Prometheus:
tests/integration/test_scrape_promql.py."""

from __future__ import annotations

import json

import pytest

from adapters.scrape.promql import PromqlError, _family, parse_vector, raw_query, series_names
from adapters.scrape.runner import ENGINES


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_the_query_asks_for_every_series_the_direct_scrape_reads(engine: str) -> None:
    names = series_names(engine)
    spec = ENGINES[engine]
    assert f"{spec['ttft']}_bucket" in names and f"{spec['prompt']}_total" in names
    assert spec["running"] in names and "up" in names and "process_start_time_seconds" in names
    q = raw_query(engine)
    assert q.startswith('{__name__=~"') and "timestamp(up)" in q and "\\:" not in q


@pytest.mark.parametrize(
    "name, want",
    [
        ("vllm:time_to_first_token_seconds_bucket", ("vllm:time_to_first_token_seconds", "histogram")),
        ("vllm:time_to_first_token_seconds_sum", ("vllm:time_to_first_token_seconds", "histogram")),
        ("vllm:prompt_tokens_total", ("vllm:prompt_tokens", "counter")),
        ("vllm:num_requests_running", ("vllm:num_requests_running", "gauge")),
        ("vllm:unknown_total", ("vllm:unknown_total", "gauge")),  # not a counter the engine spec names
    ],
)
def test_series_names_map_to_their_families(name: str, want: tuple[str, str]) -> None:
    hists = {"vllm:time_to_first_token_seconds"}
    assert _family(name, hists, {"vllm:prompt_tokens"}) == want


def _answer(result: list[object], status: str = "success") -> bytes:
    return json.dumps({"status": status, "data": {"resultType": "vector", "result": result}}).encode()


def test_vector_answers_keep_the_well_formed_elements() -> None:
    result = [
        {"metric": {"__name__": "up", "instance": "a:1"}, "value": [1700000000.5, "1"]},
        {"metric": {"instance": "a:1"}, "value": [1700000000.5, "NaN"]},  # not finite: dropped
        {"metric": {"instance": "a:1"}, "value": [1700000000.5, "+Inf"]},
        {"metric": {"instance": 3}, "value": [1, "1"]},  # a label that is not a string
        {"metric": {"instance": "a:1"}, "value": "1"},  # not a pair
        {"metric": {"instance": "a:1"}},  # no value
        "junk",
    ]
    assert parse_vector(_answer(result)) == [({"__name__": "up", "instance": "a:1"}, 1.0)]


@pytest.mark.parametrize(
    "body, why",
    [
        (b"<html>", "not JSON"),
        (b'{"status": "error", "errorType": "bad_data", "error": "parse error"}', "parse error"),
        (b'{"status": "success", "data": {"resultType": "matrix", "result": []}}', "instant vector"),
        (b'{"status": "success", "data": {"resultType": "vector", "result": {}}}', "instant vector"),
        (b"[]", "query failed"),
    ],
)
def test_answers_that_are_not_vectors_raise(body: bytes, why: str) -> None:
    with pytest.raises(PromqlError, match=why):
        parse_vector(body)
