"""governor.shadow: the shadow report on hand-made topics, with the answers worked out by hand."""

from __future__ import annotations

from typing import Any

import pytest

from governor.shadow import render_text, shadow_report


def _w(end_s: int, ready: int, viol: float, count: int, *, starting: int = 0, zone: str = "az-a") -> dict[str, Any]:
    return {
        "schema_version": 2,
        "kind": "window",
        "scope": "zone",
        "model": "m",
        "zone": zone,
        "window_start_ms": (end_s - 10) * 1000,
        "window_end_ms": end_s * 1000,
        "window_s": 10.0,
        "replicas_ready": ready,
        "replicas_starting": starting,
        "violation_rate": viol,
        "count": count,
        "ttft_p95_ms": 500.0,
        "ttft_slo_ms": 1000.0,
    }


def _scale(basis_s: int, target: int, zone: str = "az-a") -> dict[str, Any]:
    return {
        "kind": "scale",
        "model": "m",
        "zone": zone,
        "target_replicas": target,
        "basis_ms": basis_s * 1000,
        "issued_at_ms": basis_s * 1000 + 50,
    }


# az-a: the incumbent runs 4 throughout (3 ready + 1 starting in the last window).
WINDOWS = [
    _w(10, 4, 0.0, 100),
    _w(20, 4, 0.10, 200),
    _w(30, 4, 0.20, 100),
    _w(40, 3, 0.0, 100, starting=1),
]
# Governor: 6 decided on the window ending at 20 s, 2 decided at 35 s.
COMMANDS = [_scale(20, 6), _scale(35, 2)]
NOISE = [
    {"kind": "route", "model": "m|az-a", "zone": "az-a", "basis_ms": 1000, "payload": {}},  # not scale
    {"kind": "scale", "model": "m", "zone": "az-a", "target_replicas": "9", "basis_ms": 1000},  # malformed
    {**_w(20, 9, 0.9, 10), "scope": "node"},  # node windows are not the zone's count
    {**_w(30, 1, 0.9, 10), "window_end_ms": "soon"},  # malformed
]


def test_lag_zero_hand_computed() -> None:
    rep = shadow_report(COMMANDS + NOISE[:2], WINDOWS + NOISE[2:])
    rows = [(r["window_end_ms"], r["incumbent"], r["governor"], r["governor_wanted"]) for r in rep["windows"]]
    # 10 s: no command yet -> governor's target is the incumbent's; 20, 30 s: 6; 40 s: 2 (basis 35 <= 40).
    assert rows == [(10_000, 4, 4, "same"), (20_000, 4, 6, "more"), (30_000, 4, 6, "more"), (40_000, 4, 2, "fewer")]
    s = rep["summary"]
    assert (s["windows"], s["seconds"]) == (4, 40.0)
    assert (s["more"]["share_of_time"], s["fewer"]["share_of_time"], s["same"]["share_of_time"]) == (0.5, 0.25, 0.25)
    # Request-weighted: (0.10 x 200 + 0.20 x 100) / 300 = 0.13333.
    assert s["more"]["violation_rate"] == pytest.approx(40 / 300, abs=1e-5)
    assert s["more"]["requests"] == 300
    assert s["fewer"]["violation_rate"] == 0.0 and s["same"]["violation_rate"] == 0.0
    # Incumbent 4 x 40 s = 160; governor 4x10 + 6x10 + 6x10 + 2x10 = 180.
    assert s["gpu_seconds"] == {"incumbent": 160.0, "governor": 180.0, "governor_minus_incumbent": 20.0, "ratio": 1.125}
    assert (s["max_more"], s["max_fewer"], s["windows_before_first_command"]) == (2, 2, 1)
    assert rep["scale_commands"] == 2 and rep["applied_for_real"] == 0
    eps = [
        (e["wanted"], e["start_ms"], e["end_ms"], e["windows"], e["governor"], e["incumbent"]) for e in rep["episodes"]
    ]
    assert eps == [("more", 10_000, 30_000, 2, [6], [4]), ("fewer", 30_000, 40_000, 1, [2], [4])]
    assert rep["period"]["first_window_end_ms"] == 10_000 and rep["period"]["last_window_end_ms"] == 40_000


def test_lag_shifts_the_targets() -> None:
    # lag 10 s: at window end e the target is the last command with basis <= e - 10 s.
    rep = shadow_report(COMMANDS, WINDOWS, lag_s=10)
    assert [r["governor"] for r in rep["windows"]] == [4, 4, 6, 6]  # 35 s + 10 > 40 s: the 2 is not in force
    s = rep["summary"]
    assert s["more"]["share_of_time"] == 0.5 and s["fewer"]["windows"] == 0
    assert s["more"]["violation_rate"] == pytest.approx((0.2 * 100 + 0.0 * 100) / 200)  # windows at 30, 40 s
    assert s["fewer"]["violation_rate"] is None and s["fewer"]["share_of_time"] == 0.0
    assert s["gpu_seconds"]["governor"] == 200.0  # 40 + 40 + 60 + 60
    assert s["windows_before_first_command"] == 2


def test_period_filter_keeps_the_command_in_force_from_before() -> None:
    rep = shadow_report(COMMANDS, WINDOWS, since_ms=20_000, until_ms=35_000)
    # Only the window ending at 30 s; the command of 20 s is still in force there.
    assert [(r["window_end_ms"], r["governor"], r["assumed"]) for r in rep["windows"]] == [(30_000, 6, False)]
    assert rep["summary"]["gpu_seconds"]["incumbent"] == 40.0


def test_keys_are_separate_and_a_window_without_requests_has_no_rate() -> None:
    az_b = [_w(10, 2, 0.0, 0, zone="az-b"), _w(20, 2, 0.5, 0, zone="az-b")]
    rep = shadow_report([*COMMANDS, _scale(5, 1, zone="az-b")], WINDOWS + az_b)
    keys = {k["zone"]: k for k in rep["keys"]}
    assert set(keys) == {"az-a", "az-b"}
    b = keys["az-b"]
    assert (b["fewer"]["share_of_time"], b["fewer"]["violation_rate"]) == (1.0, None)  # 0 requests: no rate
    assert b["gpu_seconds"] == {"incumbent": 40.0, "governor": 20.0, "governor_minus_incumbent": -20.0, "ratio": 0.5}
    assert keys["az-a"]["gpu_seconds"]["governor"] == 180.0
    # Totals: 60 s of windows; more 20 s, fewer 10 (az-a) + 20 (az-b) s, same 10 s.
    s = rep["summary"]
    assert s["seconds"] == 60.0 and s["fewer"]["share_of_time"] == 0.5
    assert s["gpu_seconds"]["incumbent"] == 200.0 and s["gpu_seconds"]["governor"] == 200.0


def test_duplicate_windows_count_once_and_the_last_copy_wins() -> None:
    rep = shadow_report([], [_w(10, 4, 0.0, 100), _w(10, 5, 0.0, 100)])
    assert [r["incumbent"] for r in rep["windows"]] == [5]
    assert rep["summary"]["same"]["share_of_time"] == 1.0


def test_commands_applied_by_a_real_backend_are_flagged() -> None:
    results = [
        {"kind": "scale", "outcome": "applied", "backend": "dry-run"},
        {"kind": "scale", "outcome": "advisory", "backend": "sim"},
        {"kind": "scale", "outcome": "applied", "backend": "sim"},
    ]
    rep = shadow_report(COMMANDS, WINDOWS, results=results)
    assert rep["applied_for_real"] == 1
    assert "not a shadow run" in render_text(rep)


def test_render_text_names_the_figures() -> None:
    text = render_text(shadow_report(COMMANDS, WINDOWS))
    assert "governor wanted more  50.0% of the time" in text
    assert "13.3%" in text  # violation rate when governor wanted more
    assert "GPU-seconds: incumbent 160, governor 180 (+20, x1.12)" in text
    assert "replicas x window length" in text
    assert "m/az-a: governor wanted more ([6] vs [4])" in text


def test_empty_input() -> None:
    rep = shadow_report([], [])
    assert rep["summary"]["windows"] == 0 and rep["summary"]["gpu_seconds"]["ratio"] is None
    assert "0 zone windows" in render_text(rep)


def test_the_cli_registers_the_command_and_the_demo_option() -> None:
    from governor.cli import build_parser

    args = build_parser().parse_args(["shadow-report", "--since-s", "600", "--json", "--out", "s.json"])
    assert (args.command, args.since_s, args.json, args.out, args.lag_s) == (
        "shadow-report",
        600.0,
        True,
        "s.json",
        0.0,
    )
    assert build_parser().parse_args(["demo", "--shadow"]).shadow is True
    assert build_parser().parse_args(["demo"]).shadow is False
