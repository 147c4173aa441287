"""``governor bench scrape-scale`` on a tiny run: the shipped adapter over served engines, and its shards."""

from __future__ import annotations

import dataclasses

import pytest

from bench.scrape_scale import measure, render
from core.settings import Settings

pytestmark = pytest.mark.timeout(180)


def test_one_adapter_reads_every_target_and_two_shards_split_them() -> None:
    s = Settings()
    whole = measure(s, targets=6, rounds=2, interval_s=5.0, qps=2.0)
    assert whole["targets"] == 6 and whole["rounds"] == 2
    assert whole["baseline_round"]["records"] == 0  # the adapter's first round is all baselines
    # each round after it: requests of one interval (Poisson, 10 on average a target) and a GPU record each
    assert all(r["records"] > 6 and r["bytes"] > 0 for r in whole["per_round"])
    assert 0 < whole["step_share_of_cpu"] <= 1 and whole["page_bytes"] > 1000
    assert "targets per adapter at 5 s" in render(whole, 0.5)
    halves = [
        measure(dataclasses.replace(s, scrape_shard=f"{i}/2"), targets=6, rounds=1, interval_s=5.0, qps=2.0)
        for i in range(2)
    ]
    # each run serves new ports (new URLs), so the split differs run to run; the exact cover is
    # tests/integration/test_ingest_scrape_shard.py's
    assert [h["shard"] for h in halves] == ["shard 0/2", "shard 1/2"]
    assert all(h["targets"] <= 6 for h in halves) and sum(h["targets"] for h in halves) < 12
