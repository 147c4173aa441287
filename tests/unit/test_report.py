"""The demo report counts command results only; probes and relocation outcomes are apart."""

from __future__ import annotations

from bench.report import build_report, render_text


def test_relocation_outcomes_and_timing_probes_are_not_command_results() -> None:
    results = [
        {"outcome": "applied", "latency_ms": 120.0, "command_id": "a"},
        {"outcome": "duplicate", "command_id": "a"},
        {"outcome": "timing", "rtt_ms": 0.8},
        {"record": "relocation_outcome", "outcome": "relocation_applied", "applied": True},
        {"record": "relocation_outcome", "outcome": "relocation_refused", "applied": False},
        {"record": "relocation_outcome", "outcome": "relocation_applied", "applied": True},
    ]
    finished = [{"ttft_ms": 100.0, "itl_ms": 10.0, "e2e_ms": 500.0, "status": "ok"}]
    rep = build_report(
        finished=finished,
        replicas=[(0.0, "az-a", "m", 1, 0, 1)],
        results=results,
        windows=[],
        dead_letters=[],
        ttft_slo_ms=1000.0,
        itl_slo_ms=150.0,
        extra={},
    )
    assert rep["commands"]["outcomes"] == {"applied": 1, "duplicate": 1}
    assert rep["commands"]["issue_to_apply_ms"]["p50"] == 120.0
    assert rep["relocations"] == {"applied": 2, "refused": 1}
    assert "KV relocations        applied 2, refused 1" in render_text(rep)
