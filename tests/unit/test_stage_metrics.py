"""The worker exports a zone window's stage latencies and their unfixable share (issue 36 item 6)."""

from __future__ import annotations

import pytest

from streams.metrics_export import WorkerMetrics


def test_a_zone_windows_stage_latencies_are_exported_in_seconds() -> None:
    m = WorkerMetrics()
    m.observe_window(
        {
            "scope": "zone",
            "model": "m",
            "zone": "az-a",
            "count": 10,
            "violation_rate": 0.5,
            "unfixable_rate": 0.4,
            "stage_unfixable_rate": 0.3,
            "network_p50_ms": 800.0,
            "network_p95_ms": 1500.0,
            "preprocess_p95_ms": 4.0,
            "decode_p50_ms": None,  # not measured: no sample
        }
    )
    get = m.registry.get_sample_value
    lab = {"model": "m", "zone": "az-a"}
    assert get("governor_slo_stage_unfixable_rate", lab) == 0.3
    assert get("governor_stage_latency_p95_seconds", {**lab, "stage": "network"}) == pytest.approx(1.5)
    assert get("governor_stage_latency_p50_seconds", {**lab, "stage": "network"}) == pytest.approx(0.8)
    assert get("governor_stage_latency_p95_seconds", {**lab, "stage": "preprocess"}) == 0.004
    assert get("governor_stage_latency_p50_seconds", {**lab, "stage": "decode"}) is None
