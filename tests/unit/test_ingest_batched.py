"""Batched ingest (``ControlLoop.ingest_many``, ``TelemetryProcessor.process_many``): messages taken
together give the windows and the dead letters that one message at a time gives -- each suspect row
its own dead letter with its reason, section, row index and message offset; windows closed after the
same messages, a late record late all the same -- on a mixed good/bad backlog of columnar messages,
row batches and broken envelopes, however the backlog is cut into batches."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from governor_telemetry.columnar import encode_columns, encode_typed
from governor_telemetry.records import encode_envelope
from hypothesis import example, given, settings
from hypothesis import strategies as st

from core.settings import Settings
from loop.control_loop import ControlLoop
from tests.unit import test_columnar as columnar

MODEL = columnar.MODEL
ZONES = ("az-a", "az-b")
SETTINGS = columnar.SETTINGS.replace(zones=ZONES, partitions=2, max_nodes_per_window=2)
T0 = 1_700_000_000_000
NOW = T0 + 30_000  # the clock: records up to 60 s ahead of it are admitted


def _req(i: int, ts: int, zone: str, node: str, **kw: Any) -> dict[str, Any]:
    return columnar._req(i, ts, node, zone=zone, **kw)


def _gpu(i: int, ts: int, zone: str, node: str) -> dict[str, Any]:
    return columnar._gpu(i, ts, node, zone=zone)


def _bad(t0: int) -> dict[int, dict[str, Any]]:
    """One bad row in some messages: each must be its own dead letter, with validate_record's reason or its kind."""
    return {
        3: {"ttft_ms": -1.0},
        5: {"zone": "az-nowhere"},
        8: {"status": "weird"},
        11: {"ttft_ms": "fast"},
        14: {"model": "no-such-model"},
        17: {"ts_ms": t0 + 200_000},  # beyond GOVERNOR_MAX_FUTURE_S
        20: {"node": "n" * 300},
        23: {"e2e_ms": None},  # a required field absent
        26: {"node": "az-a/n9"},  # a third node in its window: past the node cap (2), counted in one letter
    }


def backlog(t0: int = T0, now: int = NOW, encode_columns: Any = encode_columns) -> list[bytes]:
    """35 messages over ~8 s of event time in two zones: columnar (some with GPU sections, some with a bad
    row), two row batches, a broken envelope, a columnar message of old (late) records, one whose time stamps
    are no numbers, and one out of order by less than the lateness (``encode_columns``: or typed columns)."""
    out: list[bytes] = []
    bad = _bad(t0)
    for m in range(35):
        zone = ZONES[m % 2]
        ts0 = t0 + 250 * m
        if m == 12:
            out.append(b'{"kind": "columns", "request": [1, 2')  # a broken envelope
            continue
        if m == 22:  # old records: their windows closed long before (late, each its dead letter)
            out.append(encode_columns([_req(1000 + k, t0 + 10 * k, zone, f"{zone}/n0") for k in range(4)], "s", now))
            continue
        if m == 29:  # a columnar message whose time stamps are no numbers: every row a dead letter
            strings = [_req(2000 + k, ts0 + k, zone, f"{zone}/n1", ts_ms=f"{ts0}") for k in range(3)]
            out.append(encode_columns(strings, "s", now))
            continue
        if m == 31:  # a little out of order (within the lateness): windowed
            ts0 -= 150
        recs = [_req(100 * m + k, ts0 + 20 * k, zone, f"{zone}/n{(m // 2 + k) % 2}") for k in range(10)]
        if m in bad:
            recs[4] = {**recs[4], **bad[m]}
            recs[4] = {k: v for k, v in recs[4].items() if v is not None}
        if m % 4 == 1:
            recs.append(_gpu(m, ts0 + 5, zone, f"{zone}/n0"))
        if m in (9, 27):
            out.append(encode_envelope(recs, "s", now))  # a row batch among the columns
        else:
            out.append(encode_columns(recs, "s", now))
    return out


def _source(k: int, topic: str = "telemetry", partition: int = 1) -> dict[str, Any]:
    return {"topic": topic, "partition": partition, "offset": k}


def one_at_a_time(
    msgs: list[bytes], settings: Settings = SETTINGS, now: int = NOW, topic: str = "telemetry", partition: int = 1
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """(dead letters, windows, valid records) of ``msgs`` ingested one at a time, then every window closed."""
    loop = ControlLoop(settings)
    loop.ingests.partitioned = True
    dead, windows, valid = [], [], 0
    for k, raw in enumerate(msgs):
        res = loop.ingest(raw, _source(k, topic, partition), now)
        dead += res.dead_letters
        windows += res.windows
        valid += res.valid
    windows += loop.close_due(now + 120_000)
    return dead + loop.ingests.drain_dead_letters(), windows, valid


def _batched(msgs: list[bytes], cuts: list[int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    loop = ControlLoop(SETTINGS)
    loop.ingests.partitioned = True
    dead, windows, valid = [], [], 0
    bounds = [0, *sorted(c for c in set(cuts) if 0 < c < len(msgs)), len(msgs)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        res = loop.ingest_many(msgs[a:b], [_source(k) for k in range(a, b)], NOW)
        dead += res.dead_letters
        windows += res.windows
        valid += res.valid
    windows += loop.close_due(NOW + 120_000)
    return dead + loop.ingests.drain_dead_letters(), windows, valid


def by_place(dead: list[dict[str, Any]]) -> list[bytes]:
    """The dead letters in the order of their message, section and row (a batch sends a run's request rows'
    letters before its GPU rows')."""
    place = {"request": 0, "gpu": 1}
    keyed = [
        ((d["source"].get("offset", -1), place.get(d["source"].get("section", ""), 2), d["source"].get("index", -1)), d)
        for d in dead
    ]
    return [orjson.dumps(d, option=orjson.OPT_SORT_KEYS) for _, d in sorted(keyed, key=lambda kd: kd[0])]


REFERENCE = one_at_a_time(backlog())


def test_the_backlog_holds_what_batches_must_keep() -> None:
    dead, windows, valid = REFERENCE
    kinds = {d["kind"] for d in dead}
    assert {"invalid record", "unknown zone", "unknown model", "future", "late", "bad envelope"} <= kinds
    assert sum(d["kind"] == "late" for d in dead) == 4
    assert {d["source"]["offset"] for d in dead if d["kind"] == "invalid record"} >= {3, 8, 11, 20, 23, 29}
    assert len({w["window_start_ms"] for w in windows}) >= 8 and valid > 300
    assert sum(d["kind"] == "too many nodes" for d in dead) == 1


@pytest.mark.parametrize("cuts", [[], [7, 14, 21, 28], list(range(0, 35, 2)), [1, 13, 22, 23, 30]])
def test_batches_give_the_windows_and_dead_letters_of_one_message_at_a_time(cuts: list[int]) -> None:
    dead, windows, valid = REFERENCE
    b_dead, b_windows, b_valid = _batched(backlog(), cuts)
    assert b_valid == valid
    assert b_windows == windows  # the same windows, closed after the same messages, in the same order
    assert by_place(b_dead) == by_place(dead)


@settings(derandomize=True, max_examples=25, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=34), max_size=12))
@example([22])  # the late message first in its batch
@example([23])  # the late message last in its batch, after the records that made it late
def test_any_cut_of_the_backlog_into_batches_gives_the_same(cuts: list[int]) -> None:
    dead, windows, valid = REFERENCE
    b_dead, b_windows, b_valid = _batched(backlog(), cuts)
    assert (b_valid, b_windows, by_place(b_dead)) == (valid, windows, by_place(dead))


@settings(derandomize=True, max_examples=10, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=34), max_size=12))
@example([])  # every message in one batch: typed columns joined across vocabularies and absent rows
def test_typed_columns_give_what_columns_give_one_at_a_time_and_in_any_batches(cuts: list[int]) -> None:
    msgs = backlog(encode_columns=encode_typed)
    assert sum(b'"t":"' in m for m in msgs) >= 30  # typed columns on the wire (the bad rows' columns stay arrays)
    dead, windows, valid = REFERENCE
    assert one_at_a_time(msgs)[1:] == (windows, valid)
    assert by_place(one_at_a_time(msgs)[0]) == by_place(dead)
    b_dead, b_windows, b_valid = _batched(msgs, cuts)
    assert (b_valid, b_windows, by_place(b_dead)) == (valid, windows, by_place(dead))


def test_a_batch_is_checked_together() -> None:
    # Ten columnar messages taken together: one column check of their rows (after a first message: the
    # very first is taken alone, since a watermark where none was could close anything).
    import controllers.record_columns as rc

    calls = []
    check = rc.check_requests

    def counting(cols: Any, n: int) -> Any:
        calls.append(n)
        return check(cols, n)

    msgs = [
        encode_columns([_req(10 * m + k, T0 + 10 * m + k, "az-a", "az-a/n0") for k in range(10)], "s", NOW)
        for m in range(11)
    ]
    loop = ControlLoop(SETTINGS)
    loop.ingest(msgs.pop(0), _source(0), NOW)
    mp = pytest.MonkeyPatch()
    mp.setattr("loop.pipeline.check_requests", counting)
    try:
        res = loop.ingest_many(msgs, [_source(k) for k in range(1, 11)], NOW)
    finally:
        mp.undo()
    assert res.valid == 100 and not res.dead_letters and calls == [100]
