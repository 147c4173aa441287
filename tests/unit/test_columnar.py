"""Columnar telemetry (governor_telemetry.columnar, controllers.record_columns, the processor's
columnar path): the same records as rows or as columns give the same windows and the same dead
letters (each bad row alone, with validate_record's reason and its row index); a message the
columns cannot describe (ragged, wrong types, too big) is one dead letter with a clear reason."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson
import pytest
from governor_telemetry.columnar import MAX_COLUMN_ROWS, decode_message, encode_columns, encode_typed
from governor_telemetry.producer import InvalidRecord, TelemetryProducer
from governor_telemetry.records import encode_envelope, validate_record
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core.settings import ModelSpec, Settings
from loop.pipeline import TelemetryProcessor, _groups, _groups_2d

SETTINGS = Settings(
    window_s=1.0,
    lateness_s=0.2,
    models=(ModelSpec("llama2-70b", ttft_slo_ms=500.0, classes={"trading": {"ttft_slo_ms": 300.0}}),),
    max_nodes_per_window=4,
)
MODEL = "llama2-70b"
T0 = 1_700_000_000_000
NOW = T0 + 2_000  # the processor's clock: records up to 60 s ahead of it are admitted
SRC = {"topic": "t", "partition": 0, "offset": 7}


def _req(i: int, ts: int | None = None, node: str = "az-a/n0", **kw: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "kind": "request",
        "request_id": f"r{i}",
        "ts_ms": T0 + 13 * i if ts is None else ts,
        "model": MODEL,
        "zone": "az-a",
        "node": node,
        "ttft_ms": 50.0 + (i * 37) % 900,
        "itl_ms": float(i % 70),
        "e2e_ms": 2000.0 + i,
        "queue_ms": i % 5,  # an int in a float field
        "prompt_tokens": 100 + i,
        "output_tokens": i % 50,
        "kv_hit": i % 3 == 0,
        "status": ("ok", "ok", "error", "timeout")[i % 4],
        "request_class": ("trading", None, "gold", "voice")[i % 4],
    }
    if i % 5 == 1:
        rec.update(agent_stability=(i % 10) / 10, agent_rag_score=(i % 7) / 6, agent_tool_conf=(i % 3) / 2)
    if i % 6 == 2:
        rec["agent_path"] = ("rag", "tool", "llm")[i % 3]
    if i % 7 == 3:
        del rec["itl_ms"], rec["queue_ms"]  # optional fields some rows leave out
    rec.update(kw)
    return {k: v for k, v in rec.items() if v is not None}


def _gpu(i: int, ts: int | None = None, node: str = "az-a/n0", **kw: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "kind": "gpu",
        "ts_ms": T0 + 50 * i if ts is None else ts,
        "node": node,
        "zone": "az-a",
        "model": MODEL,
        "state": ("ready", "starting", "draining")[i % 3],
        "gpu_util": (i % 10) / 10,
        "mem_used_bytes": 10 + i,
        "mem_total_bytes": 1000,
        "queue_len": i % 4,
        "kv_blocks_used": i % 5,
        "kv_blocks_total": 8,
        "free_block_hist": [i % 3, 1, 0] if i % 2 else None,
        "fragmentation_ratio": 0.25 if i % 3 else None,
        "kv_free_bytes": 4096 * i if i % 4 else None,
    }
    rec.update(kw)
    return {k: v for k, v in rec.items() if v is not None}


def _run(messages: list[bytes], now: int = NOW) -> tuple[TelemetryProcessor, list[Any], list[dict[str, Any]]]:
    """Process ``messages``, close every window: (processor, dead letters, window records)."""
    p = TelemetryProcessor(SETTINGS)
    dead: list[Any] = []
    for k, raw in enumerate(messages):
        dead += p.process(raw, {**SRC, "offset": k}, now).dead_letters
    return p, dead, p.close_due(T0 + 10**6, 0)


def _both(batches: list[list[dict[str, Any]]]) -> tuple[Any, Any]:
    """The batches as rows and as columns; as typed columns too, which must give what columns give."""
    rows = _run([encode_envelope(b, "n", 0) for b in batches])
    cols = _run([encode_columns(b, "n", 0) for b in batches])
    typed = _run([encode_typed(b, "n", 0) for b in batches])
    assert _letters(typed[1]) == _letters(cols[1])
    assert _close(typed[2], cols[2])
    assert typed[0].records_in == cols[0].records_in
    return rows, cols


def _letters(dead: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Dead letters as (kind, reason, offset, index, record), in a fixed order."""
    out = [
        (
            d["kind"],
            d["reason"],
            d["source"]["offset"],
            d["source"].get("index"),
            orjson.dumps(d["record"], option=orjson.OPT_SORT_KEYS),
        )
        for d in dead
    ]
    return sorted(out)


def _close(a: Any, b: Any) -> bool:
    """Equal, floats to 1e-9 relative (a bad row in a batch reaches the window by the
    per-record path, so the float sums may add in another order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool):
        # (ints too: a window sums its token counts in float64, so past 2**53 the order shows)
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) or (math.isnan(a) and math.isnan(b))
    return bool(a == b)


def test_the_same_records_as_rows_or_columns_give_identical_windows() -> None:
    # Several messages, several nodes and windows per message, requests and GPU samples mixed.
    batches = [
        [
            *(_req(100 * m + i, node=f"az-a/n{i % 3}", ts=T0 + 700 * m + 37 * i) for i in range(60)),
            *(_gpu(100 * m + i, node=f"az-a/n{i % 3}", ts=T0 + 700 * m + 90 * i) for i in range(9)),
        ]
        for m in range(6)
    ]
    batches.append([_req(900, ts=T0 + 5_000)])  # a batch of one request
    batches.append([_req(901 + i, node="az-a/n1", ts=T0 + 5_001 + i) for i in range(300)])  # one window
    (p_rows, dead_rows, win_rows), (p_cols, dead_cols, win_cols) = _both(batches)
    assert dead_rows == dead_cols == []
    assert p_cols.records_in == p_rows.records_in == sum(map(len, batches))
    assert win_cols == win_rows  # identical, not close: every row took the columnar path
    zone = [w for w in win_cols if w["scope"] == "zone"]
    assert sum(w["count"] for w in zone) == 60 * 6 + 301
    assert any(w["agent_signals_n"] for w in zone) and any(w["nodes"] == 3 for w in zone)


# One bad field per case: every rule of validate_record, for requests and GPU samples.
BAD_REQUEST = [
    {"request_id": None},
    {"request_id": ""},
    {"request_id": 5},
    {"ts_ms": -1},
    {"ts_ms": 1.5},
    {"ts_ms": "now"},
    {"ts_ms": True},
    {"ts_ms": 2**63},
    {"ts_ms": 10**400},
    {"model": None},
    {"model": ["m"]},
    {"node": "n" * 300},
    {"ttft_ms": None},
    {"ttft_ms": -0.5},
    {"ttft_ms": float("nan")},
    {"ttft_ms": float("inf")},
    {"ttft_ms": False},
    {"itl_ms": "5"},
    {"itl_ms": -1},
    {"e2e_ms": 10.0},  # below ttft_ms
    {"prompt_tokens": 1.5},
    {"prompt_tokens": -3},
    {"prompt_tokens": 2**64},
    {"kv_hit": 1},
    {"status": "fine"},
    {"status": None},
    {"status": {"a": 1}},
    {"request_class": 3},
    {"agent_stability": 0.5},  # the other two signals missing
    {"agent_stability": 1.5, "agent_rag_score": 0.5, "agent_tool_conf": 0.5},
    {"agent_stability": 0.5, "agent_rag_score": None, "agent_tool_conf": 0.5},
    {"agent_path": "search"},
    {"agent_path": 2},
    {"agent_tool_conf": -0.1, "agent_stability": 0.1, "agent_rag_score": 0.1},
]
BAD_GPU = [
    {"state": "gone"},
    {"state": None},
    {"gpu_util": 1.5},
    {"gpu_util": None},
    {"mem_used_bytes": 2000},
    {"mem_total_bytes": 5.5},
    {"kv_blocks_used": 9},
    {"fragmentation_ratio": 1.5},
    {"free_block_hist": [1, -1]},
    {"free_block_hist": "x"},
    {"free_block_hist": list(range(100))},
    {"queue_len": -2},
    {"node": 7},
]


def _bad(make: Any, i: int, change: dict[str, Any]) -> dict[str, Any]:
    rec = make(i, node="az-a/n0")
    for k, v in change.items():
        if v is None:
            rec.pop(k, None)
        else:
            rec[k] = v
    return rec


@pytest.mark.parametrize(
    ("make", "change"),
    [(_req, c) for c in BAD_REQUEST] + [(_gpu, c) for c in BAD_GPU],
    ids=[f"request-{next(iter(c))}-{i}" for i, c in enumerate(BAD_REQUEST)]
    + [f"gpu-{next(iter(c))}-{i}" for i, c in enumerate(BAD_GPU)],
)
def test_a_bad_row_is_dead_lettered_alone_with_the_row_reason_and_its_index(make: Any, change: dict[str, Any]) -> None:
    good = [make(i, node="az-a/n0") for i in range(4)]
    bad = _bad(make, 4, change)
    reason = validate_record(bad)
    assert reason is not None, bad
    batch = [*good[:2], bad, *good[2:]]
    message: Any = _decoded(batch, make(0)["kind"])
    if "nan" not in str(change) and "inf" not in str(change):
        # NaN, inf and ints past 64 bits cannot travel as JSON: those cases hand the decoded message
        # over, as a caller may; the others go as bytes.
        try:
            message = orjson.dumps(message)
        except TypeError:
            pass
    p = TelemetryProcessor(SETTINGS)
    res = p.process(message, SRC, NOW)
    assert [(d["kind"], d["reason"], d["source"]) for d in res.dead_letters] == [
        ("invalid record", reason, {**SRC, "index": 2, "section": make(0)["kind"]})
    ]
    assert res.valid == 4
    # The row batch of the same records: the same dead letter (reason and record), and the same windows.
    p_rows = TelemetryProcessor(SETTINGS)
    rows_dead = p_rows.process(_decoded_rows(batch), SRC, NOW).dead_letters
    assert [(d["reason"], d["record"]) for d in rows_dead] == [(reason, res.dead_letters[0]["record"])]
    assert _close(p.close_due(T0 + 10**6, 0), p_rows.close_due(T0 + 10**6, 0))


def _pivot(batch: list[dict[str, Any]]) -> dict[str, list[Any]]:
    names = dict.fromkeys(k for r in batch for k in r if k != "kind")
    return {k: [r.get(k) for r in batch] for k in names}


def _decoded(batch: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return {"schema_version": 1, "kind": "columns", "source": "n", "sent_ms": 0, kind: _pivot(batch)}


def _decoded_rows(batch: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schema_version": 1, "kind": "batch", "source": "n", "sent_ms": 0, "records": batch}


def test_an_integral_float_in_an_int_field_is_taken_as_in_a_row() -> None:
    batch = [_req(0, prompt_tokens=5.0), _req(1, ts_ms=float(T0 + 1)), _req(2)]
    (p_rows, dead_rows, win_rows), (p_cols, dead_cols, win_cols) = _both([batch])
    assert dead_rows == dead_cols == []
    assert _close(win_cols, win_rows)


def test_admission_dead_letters_are_those_of_rows() -> None:
    batch = [
        _req(0),
        _req(1, model="gpt-x"),
        _req(2, zone="az-z"),
        _req(3, ts=NOW + 61_000),  # past GOVERNOR_MAX_FUTURE_S
        *(_req(10 + k, node=f"az-a/n{k}") for k in range(1, 6)),  # nodes 5 and 6 of a 4-node cap
        _gpu(0, model="gpt-x"),
        _gpu(1),
    ]
    (p_rows, dead_rows, win_rows), (p_cols, dead_cols, win_cols) = _both([batch])
    kinds = sorted(d["kind"] for d in dead_cols)
    assert kinds == ["future", "unknown model", "unknown model", "unknown zone"]
    assert [t[:2] for t in _letters(dead_cols)] == [t[:2] for t in _letters(dead_rows)]
    assert _close(win_cols, win_rows)
    # the nodes beyond the cap: counted, one dead letter for the window (issue 31, item 5)
    capped = [[d["record"]["dropped_records"] for d in p.drain_dead_letters()] for p in (p_rows, p_cols)]
    assert capped == [[2], [2]]
    # Late: a window that closed before the columns arrived.
    p = TelemetryProcessor(SETTINGS)
    p.process(encode_columns([_req(0, ts=T0 + 5_000)], "n", 0), SRC, NOW)
    p.close_due(None, 0)
    late = p.process(encode_columns([_req(1, ts=T0 + 100), _req(2, ts=T0 + 5_100)], "n", 0), SRC, NOW)
    assert [(d["kind"], d["source"]["index"]) for d in late.dead_letters] == [("late", 0)] and late.valid == 1


@pytest.mark.parametrize(
    ("envelope", "says"),
    [
        ({"request": {"ts_ms": [1, 2], "model": ["m"]}}, "request column 'model' has 1 values, 'ts_ms' has 2"),
        ({"request": {"ts_ms": 5}}, "request column 'ts_ms' must be an array, got int"),
        ({"request": [[1, 2]]}, "section 'request' must be an object of arrays, got list"),
        ({"gpu": {"kind": ["gpu"]}}, "gpu column 'kind' is not allowed"),
        ({"gpu": {"schema_version": [2]}}, "gpu column 'schema_version' is not allowed"),
        ({"metrics": {"ts_ms": [1]}}, "unknown section 'metrics'"),
        ({"request": {"ts_ms": [0] * 40_000}, "gpu": {"ts_ms": [0] * 30_000}}, f"more than {MAX_COLUMN_ROWS} rows"),
        ({"schema_version": 2, "request": {}}, "unsupported envelope schema_version 2"),
        ({"schema_version": True, "request": {}}, "unsupported envelope schema_version True"),
    ],
)
def test_a_message_the_columns_cannot_describe_is_one_dead_letter(envelope: dict[str, Any], says: str) -> None:
    raw = orjson.dumps({"schema_version": 1, "kind": "columns", "source": "n", "sent_ms": 0, **envelope})
    res = TelemetryProcessor(SETTINGS).process(raw, SRC, NOW)
    assert res.valid == 0 and len(res.dead_letters) == 1
    dl = res.dead_letters[0]
    assert dl["kind"] == "bad envelope" and says in dl["reason"], dl["reason"]
    assert dl["source"] == SRC


def test_empty_and_missing_sections_are_no_records_and_a_missing_required_column_fails_every_row() -> None:
    p = TelemetryProcessor(SETTINGS)
    res = p.process(orjson.dumps({"schema_version": 1, "kind": "columns", "request": {"ts_ms": []}}), SRC, NOW)
    assert (res.valid, res.dead_letters) == (0, [])
    cols = _pivot([_req(i) for i in range(3)])
    del cols["ttft_ms"]
    res = p.process(orjson.dumps({"schema_version": 1, "kind": "columns", "request": cols}), SRC, NOW)
    assert [(d["reason"], d["source"]["index"]) for d in res.dead_letters] == [
        ("missing field 'ttft_ms'", i) for i in range(3)
    ]


def test_the_row_format_is_still_accepted_beside_columns() -> None:
    p = TelemetryProcessor(SETTINGS)
    assert p.process(encode_envelope([_req(0), _req(1)], "n", 0), SRC, NOW).valid == 2
    assert p.process(orjson.dumps(_req(2)), SRC, NOW).valid == 1
    assert p.process(encode_columns([_req(3), _gpu(0)], "n", 0), SRC, NOW).valid == 2
    assert isinstance(decode_message(encode_envelope([_req(0)], "n", 0)), list)


def test_encode_columns_refuses_what_the_columns_cannot_carry_and_the_producer_says_so() -> None:
    with pytest.raises(ValueError, match="not kind 'metric'"):
        encode_columns([{"kind": "metric"}], "n", 0)
    with pytest.raises(ValueError, match="a record says 2"):
        encode_columns([_req(0, schema_version=2)], "n", 0)
    with pytest.raises(ValueError, match="encoding must be one of rows, columns"):
        TelemetryProducer("x:1", "t", source="n", encoding="arrow")
    producer = TelemetryProducer("x:1", "t", source="n", encoding="columns", validate=False)
    with pytest.raises(InvalidRecord, match="not kind"):
        producer.send_nowait({"kind": "metric"})
    producer.send_nowait({"kind": "request", "ttft_ms": -1})  # unchecked: the worker dead-letters it
    assert producer.pending == 1


_value = st.one_of(
    st.none(),
    st.integers(min_value=-5, max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-10.0, max_value=1e20),
    st.booleans(),
    st.sampled_from(["", "ok", "error", "ready", "rag", "trading", "az-a", MODEL, "x"]),
    st.lists(st.integers(min_value=-1, max_value=3), max_size=3),
)
# Not node: a section is windowed after the other, so past the node cap which nodes are taken
# depends on the encoding (the cap itself is tested above).
_FIELDS = [
    "ts_ms",
    "ttft_ms",
    "e2e_ms",
    "itl_ms",
    "prompt_tokens",
    "kv_hit",
    "status",
    "zone",
    "model",
    "agent_stability",
    "agent_path",
    "request_class",
    "gpu_util",
    "state",
    "mem_used_bytes",
    "free_block_hist",
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    changes=st.lists(st.dictionaries(st.sampled_from(_FIELDS), _value, max_size=2), min_size=1, max_size=12),
    kinds=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_rows_and_columns_agree_on_any_mix_of_good_and_bad_rows(
    changes: list[dict[str, Any]], kinds: list[bool]
) -> None:
    batch = []
    for i, change in enumerate(changes):
        rec = (_req if kinds[i] else _gpu)(i, node=f"az-a/n{i % 2}")
        rec.update(change)
        batch.append({k: v for k, v in rec.items() if v is not None})
    (p_rows, dead_rows, win_rows), (p_cols, dead_cols, win_cols) = _both([batch])

    # Row indices differ (a columnar row's index is within its section): compare the rest.
    def letters(dead: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted((k, r, rec) for k, r, _, _, rec in _letters(dead))

    assert letters(dead_cols) == letters(dead_rows)
    assert _close(win_cols, win_rows)


_CODES = st.lists(st.tuples(*[st.integers(0, 3)] * 3, st.sampled_from([0, 1_000, 2_000, 2**61])), max_size=40)


@settings(max_examples=80, deadline=None)
@given(rows=_CODES, drop=st.sets(st.integers(0, 39)))
@example(rows=[(0, 0, 1, 0), (0, 0, 3, 2**61), (0, 0, 1, 0)], drop=set())  # starts far apart: the 2-D unique
@example(rows=[(0, 1, 2, 1_000), (1, 0, 0, 0), (0, 1, 2, 1_000), (1, 0, 0, 0)], drop={2})
def test_grouping_by_one_sorted_key_is_the_2d_unique(rows: list[tuple[int, ...]], drop: set[int]) -> None:
    # The processor groups a message's rows by (model, zone, node, window) codes: one mixed-radix key and a
    # stable sort give the groups, their keys, their rows and their order that a 2-D unique gives.
    good = np.array([i for i in range(len(rows)) if i not in drop], np.int64)
    if not good.size:
        return
    keys = [np.array([r[c] for r in rows], np.int64) for c in range(4)]
    got = _groups(good, *keys)
    want = _groups_2d(good, [k[good] for k in keys])
    assert [k for k, _ in got] == [k for k, _ in want]
    assert [idx.tolist() for _, idx in got] == [idx.tolist() for _, idx in want]
