"""``governor status`` rendering from a fixed snapshot, the CLI's options, and the ACL grants of its keys."""

from __future__ import annotations

from typing import Any

import pytest

from core import names
from governor.cli import build_parser
from governor.redis_acl import executor_user, operator_user, worker_user
from governor.status import COLUMNS, header_lines, render_plain, table_rows

ROW: dict[str, Any] = {
    "model": "llama2-70b",
    "zone": "az-a",
    "window_end_ms": 1_000,
    "window_age_s": 0.8,
    "rate_rps": 4.0,
    "violation_rate": 1.0,
    "ttft_p95_ms": 2500.0,
    "ttft_slo_ms": 1000.0,
    "replicas_ready": 1,
    "replicas_starting": 2,
    "target": 3,
    "ff_mode": True,
    "drift": {"signal": "latency_ms", "direction": "up", "window_end_ms": 900},
    "stale": False,
    "stale_reason": "",
    "zone_status": "up",
    "last_command": {"kind": "scale", "outcome": "applied", "reason": "", "target_replicas": 3, "age_s": 2.1},
    "breaker": "closed",
    "canary": {"state": "running", "share": 0.05},
}

SNAP: dict[str, Any] = {
    "prefix": "governor",
    "paused": False,
    "pause": None,
    "worker": {"alive": True, "age_s": 0.4},
    "executors": {"az-a": {"alive": True, "age_s": 1.2}, "az-b": {"alive": False, "age_s": None}},
    "rows": [
        ROW,
        {
            "model": "llama2-70b",
            "zone": "az-b",
            "window_age_s": 7.0,
            "stale": True,
            "stale_reason": "no_window",
            "last_command": {"kind": "scale", "outcome": "stale", "reason": "hlc older than last applied", "age_s": 9},
        },
    ],
    "kafka": {"group": "governor", "lag": {"telemetry": 12, "metrics": 0, "commands": None}, "dead_letters_60s": 3},
}


def test_a_row_shows_every_column_of_the_issue() -> None:
    rows = table_rows(SNAP)
    assert len(rows) == 2 and all(len(r) == len(COLUMNS) for r in rows)
    a = dict(zip(COLUMNS, rows[0], strict=True))
    assert a["WINDOW"] == "0.8 s ago" and a["RATE"] == "4.0/s" and a["VIOL"] == "100%"
    assert a["TTFT P95/SLO"] == "2500/1000 ms" and a["READY/START/TARGET"] == "1/2/3"
    assert a["FF"] == "on" and a["DRIFT"] == "latency_ms up" and a["STALE"] == "no" and a["ZONE ST"] == "up"
    assert a["LAST COMMAND"] == "scale->3 applied 2.1 s ago"
    assert a["BREAKER"] == "closed" and a["CANARY"] == "running 5%"
    # the share no replica count fixes (docs/model.md §23) is shown beside the violation rate
    u = dict(zip(COLUMNS, table_rows({**SNAP, "rows": [{**ROW, "unfixable_rate": 0.04}]})[0], strict=True))
    assert u["VIOL"] == "100% (4% unfix.)"


def test_missing_fields_are_dashes_and_a_refused_command_says_why() -> None:
    b = dict(zip(COLUMNS, table_rows(SNAP)[1], strict=True))
    assert b["RATE"] == "-" and b["READY/START/TARGET"] == "-/-/-" and b["FF"] == "-" and b["DRIFT"] == "-"
    assert b["STALE"] == "STALE (no_window)"
    assert b["LAST COMMAND"] == "scale stale (hlc older than last applied) 9.0 s ago"
    assert b["BREAKER"] == "-" and b["CANARY"] == "-"


def test_the_fleet_lines() -> None:
    lines = header_lines(SNAP)
    assert lines[0] == "governor status (prefix governor): loop running"
    assert lines[1] == "worker alive (beat 0.4 s ago); executors: az-a alive (1.2 s ago), az-b DOWN"
    assert (
        lines[2]
        == "kafka: dead letters in the last 60 s: 3; lag of group governor: telemetry 12, metrics 0, commands -"
    )
    paused = header_lines({**SNAP, "paused": True, "pause": {"reason": "incident 7"}, "worker": {"alive": False}})
    assert paused[0].endswith("PAUSED (incident 7)") and paused[1].startswith("worker DOWN")
    broken = header_lines({**SNAP, "kafka": {"group": "governor", "lag": None, "error": "no answer in 6 s"}})
    assert broken[2].endswith("lag of group governor: unavailable (error: no answer in 6 s)")


def test_plain_text_is_aligned_columns() -> None:
    lines = render_plain(SNAP).splitlines()
    assert len(lines) == 3 + 1 + 2
    head, a = lines[3], lines[4]
    assert head.split()[:2] == ["MODEL", "ZONE"]
    for col in ("ZONE", "RATE", "LAST COMMAND", "CANARY"):
        assert head.index(col) == a.index(str(dict(zip(COLUMNS, table_rows(SNAP)[0], strict=True))[col])), col


def test_the_cli_options() -> None:
    p = build_parser()
    assert p.parse_args(["status"]).watch is None
    assert p.parse_args(["status", "--watch"]).watch == 2.0
    args = p.parse_args(["status", "--watch", "5", "--json"])
    assert args.watch == 5.0 and args.json
    with pytest.raises(SystemExit):
        p.parse_args(["status", "--watch", "soon"])


def test_the_acl_grants_the_status_keys() -> None:
    zones = ("az-a", "az-b")
    assert names.executor_last_result("g", "az-a") in executor_user("g", "az-a", zones).keys
    assert names.executor_last_result("g", "az-b") not in executor_user("g", "az-a", zones).keys
    w = worker_user("g", zones)
    assert {names.status("g"), names.worker_heartbeat("g")} <= set(w.keys) and "hset" in w.commands
    op = operator_user("g", zones)
    expected = {names.status("g"), names.worker_heartbeat("g"), names.retune("g")}  # retune: governor status shows it
    expected |= {f("g", z) for z in zones for f in (names.executor_heartbeat, names.executor_last_result)}
    expected |= {f("g", z) for z in zones for f in (names.breaker_hash, names.desired_replicas)}
    assert set(op.read_keys) == expected and {"hgetall", "mget", "get"} <= set(op.commands)
    assert not {"hset", "xadd"} & set(op.commands)
    assert any(r.startswith("%R~g:status") for r in op.rules("0" * 64, version=(7, 0)))
