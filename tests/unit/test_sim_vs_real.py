"""bench.sim_vs_real: the simulator configured from a real engine's profile, on the real run's schedule.

The plumbing is checked against a known answer: a "real" run that is the simulator's own run on the
same schedule must show no gap at all (same replicas every window, P95 ratio 1, 0 points).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.sim_vs_real import _simulated, compare, perf_from_knots, render, run_sim_vs_real

REPORT: dict[str, Any] = {
    "platform": "local",
    "trace": "azure-conv",
    "base_qps": 3.0,
    "duration_s": 120.0,
    "segments": [[0.0, 1.0], [30.0, 3.0], [90.0, 0.5]],
    "seed": 0,
    "window_s": 10.0,
    "max_engines": 2,
    "max_num_seqs": 4,
    "cold_start_s": 45.0,
    "slo": {"ttft_slo_ms": 42.0, "itl_slo_ms": 7.5},
    "profile": {
        "capacity_rps": 8.0,
        "knots": {
            "prefill": [[16, 8.0], [64, 8.0], [256, 10.0], [1024, 13.4]],
            "decode": [[1, 1.5], [2, 1.6], [4, 1.7]],
        },
    },
}


def _as_client(sim_reqs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"spec": {"at_s": r["at_s"]}, "status": "ok", "ttft_s": r["ttft_ms"] / 1000, "itl_s": r["itl_ms"] / 1000}
        for r in sim_reqs
    ]


def test_the_simulator_against_itself_shows_no_gap() -> None:
    sim_reqs, sim_reps, _ = _simulated(REPORT)
    report = {**REPORT, "replica_series": [(t, "local", "tiny-llama", ready, 0, ready) for t, ready in sim_reps]}
    out = compare(report, _as_client(sim_reqs))
    assert len(out["real"]) == len(out["sim"]) == 12
    g = out["gap"]
    assert g["replicas_mean_abs"] == 0.0 and g["p95_ttft_ratio_median"] == 1.0 and g["attainment_points"] == 0.0
    assert sum(r["requests"] for r in out["sim"]) == len(sim_reqs) > 100
    text = render(out, "r.json")
    assert text.count("\n| ") == 1 + 12 and "attainment" in text  # the header and a row per window


def test_a_failed_request_is_a_miss_on_the_real_side() -> None:
    sim_reqs, sim_reps, _ = _simulated(REPORT)
    client = _as_client(sim_reqs)
    for r in client[:10]:
        r["status"], r["ttft_s"], r["itl_s"] = "failed", None, None
    report = {**REPORT, "replica_series": [(t, "local", "m", ready, 0, ready) for t, ready in sim_reps]}
    g = compare(report, client)["gap"]
    assert g["attainment_real"] < g["attainment_sim"]


def test_the_knots_are_made_monotone_and_the_kv_follows_the_cache_size() -> None:
    pm = perf_from_knots({"prefill": [(64, 9.0), (16, 8.0), (256, 7.0)], "decode": [(1, 2.0), (4, 1.5)]}, 2.0)
    assert pm.prefill_knots_ms == (8.0, 9.0, 9.0) and pm.decode_knots_ms == (2.0, 2.0)
    assert pm.kv_capacity_tokens == 2 * 524288
    with pytest.raises(ValueError, match="no measured point"):
        perf_from_knots({"prefill": [], "decode": [(1, 2.0)]})


def test_the_command_refuses_what_is_not_a_local_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    (tmp_path / "report.json").write_text(json.dumps({"platform": "sim"}))
    (tmp_path / "requests.json").write_text(json.dumps({"results": []}))
    assert run_sim_vs_real(argparse.Namespace(report=str(tmp_path / "report.json"), json="")) == 2
    assert "not a --platform local report" in capsys.readouterr().err
    assert run_sim_vs_real(argparse.Namespace(report=str(tmp_path / "missing.json"), json="")) == 2
    (tmp_path / "report.json").write_text(json.dumps({"platform": "local"}))
    assert run_sim_vs_real(argparse.Namespace(report=str(tmp_path / "report.json"), json="")) == 2
    assert "unusable report" in capsys.readouterr().err
