"""``governor bench scrape``'s core (:func:`bench.scrape.measure`) on a tiny run."""

from __future__ import annotations

import pytest

from bench.scrape import measure, render
from core.settings import Settings

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def result() -> dict:  # type: ignore[type-arg]
    return measure(
        Settings(),
        qps=8.0,
        duration_s=90.0,
        step_at_s=30.0,
        step_factor=3.0,
        replicas=2,
        scale_to=5,
        scale_at_s=45.0,
        startup_s=10.0,
        intervals_s=(5.0, 15.0),
    )


def test_every_scraped_request_is_a_true_one_and_the_counts_match(result: dict) -> None:  # type: ignore[type-arg]
    rows = {(r["interval_s"], r["combine"]): r for r in result["rows"]}
    assert set(rows) == {(5.0, "upper"), (5.0, "lower"), (15.0, "upper"), (15.0, "lower")}
    for r in rows.values():
        # Counters are exact, except that a replica's first scrape is its baseline (as in
        # Prometheus' rate()): what it finished before that scrape is never seen.  Those are
        # few (the first interval of each replica), never more than the truth.
        assert r["requests_true"] > 200
        assert 0 <= r["requests_true"] - r["requests_scraped"] <= 0.05 * r["requests_true"]
        assert r["windows"] > 5


def test_coarser_scrapes_leave_windows_empty_and_err_more(result: dict) -> None:  # type: ignore[type-arg]
    rows = {(r["interval_s"], r["combine"]): r for r in result["rows"]}
    fine, coarse = rows[(5.0, "upper")], rows[(15.0, "upper")]
    assert fine["empty_share"] == 0.0  # two scrapes per 10 s window
    assert fine["requests_scraped"] == fine["requests_true"] - 1  # one request before the first scrape
    assert 0.2 < coarse["empty_share"] < 0.6  # 15 s scrapes: about one window in three gets none
    for r in (fine, coarse):
        assert r["p95_ttft_abs_err_ms"]["median"] is not None and r["p95_ttft_abs_err_ms"]["median"] >= 0.0
        assert 0.0 <= r["violation_abs_err_pp"]["median"] <= 100.0
    assert "interval" in render(result) and "15 s" in render(result)


def test_the_load_step_makes_violations_to_measure(result: dict) -> None:  # type: ignore[type-arg]
    assert any(r["violating_windows"] > 0 for r in result["rows"])
