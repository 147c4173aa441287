"""Typed messages (governor_telemetry.typed): the layout checked whole, the values row by row.

What breaks a typed message's layout is one ``bad envelope`` dead letter; a value that breaks a
record rule is its row's own dead letter with the reason validate_record gives the same row sent
as a record, and every other row is windowed as if it had come as a record.
"""

from __future__ import annotations

import struct
from array import array
from typing import Any

import orjson
import pytest
from governor_telemetry.columnar import decode_message, encode_typed
from governor_telemetry.records import validate_record
from governor_telemetry.typed import MAGIC, TypedColumn
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from loop.pipeline import TelemetryProcessor
from tests.unit.test_columnar import MODEL, NOW, SETTINGS, SRC, T0, _close, _gpu, _req

FIXED = {"model": MODEL, "zone": "az-a", "node": "az-a/n0"}


def frame(header: dict[str, Any], payload: bytes) -> bytes:
    head = orjson.dumps({"schema_version": 1, "kind": "columns", "source": "n", "sent_ms": 0, **header})
    return MAGIC + struct.pack("<I", len(head)) + head + payload


class Payload:
    """A payload under construction: each column's arrays appended, 8-byte aligned."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def put(self, raw: bytes) -> int:
        self.buf += bytes(-len(self.buf) % 8)
        at = len(self.buf)
        self.buf += raw
        return at

    def col(self, t: str, values: list[Any], absent: list[bool] | None = None, vocab: list[Any] | None = None) -> Any:
        code = {"f8": "d", "f4": "f", "i8": "q", "i4": "i", "b1": "B", "str": "H"}[t]
        spec: dict[str, Any] = {"t": t, "n": len(values), "at": self.put(array(code, values).tobytes())}
        if absent is not None:
            spec["absent"] = self.put(bytes(absent))
        if vocab is not None:
            spec["vocab"] = vocab
        return spec


def requests(n: int, p: Payload, **override: Any) -> dict[str, Any]:
    """A request section of ``n`` good rows, typed, with ``override`` columns in place."""
    cols = {
        "request_id": [f"r{i}" for i in range(n)],
        "ts_ms": p.col("i8", [T0 + 10 * i for i in range(n)]),
        "model": p.col("str", [0] * n, vocab=[MODEL]),
        "zone": p.col("str", [0] * n, vocab=["az-a"]),
        "node": p.col("str", [0] * n, vocab=["az-a/n0"]),
        "ttft_ms": p.col("f8", [100.0 + i for i in range(n)]),
        "e2e_ms": p.col("f8", [900.5 + i for i in range(n)]),
        "prompt_tokens": p.col("i4", [100] * n),
        "status": p.col("str", [0] * n, vocab=["ok"]),
    }
    cols.update(override)
    return cols


def _process(raw: Any) -> tuple[TelemetryProcessor, Any]:
    p = TelemetryProcessor(SETTINGS)
    return p, p.process(raw, SRC, NOW)


def _as_rows(raw: bytes) -> tuple[TelemetryProcessor, Any]:
    """The same rows as a row batch of records (decoded: a NaN survives), the oracle."""
    batch = decode_message(raw)
    assert not isinstance(batch, list)
    recs = [s.row(i) for s in batch.sections.values() for i in range(s.n)]
    return _process({"schema_version": 1, "kind": "batch", "source": "n", "sent_ms": 0, "records": recs})


# -- the layout: one dead letter for the message ------------------------------------------------
def _layouts() -> list[tuple[str, Any, str]]:
    p = Payload()
    good = requests(3, p)
    payload = bytes(p.buf)
    cases: list[tuple[str, Any, str]] = [
        ("short", MAGIC + b"\x01", "shorter than its frame"),
        ("header past the end", MAGIC + struct.pack("<I", 999) + b"{}", "a header of 999 bytes"),
        ("header not JSON", MAGIC + struct.pack("<I", 3) + b"{x}", "not JSON"),
        ("header not columns", frame({"kind": "batch"}, payload), "kind: columns envelope"),
    ]

    def case(name: str, col: str, spec: Any, says: str) -> None:
        cases.append((name, frame({"request": {**good, col: spec}}, payload), says))

    case("unknown type", "ttft_ms", {**good["ttft_ms"], "t": "f16"}, "has type 'f16'")
    case("unknown key", "ttft_ms", {**good["ttft_ms"], "scale": 2}, "unknown key 'scale'")
    case("offset past the payload", "ttft_ms", {**good["ttft_ms"], "at": len(payload) - 8}, "offset in the payload")
    case("negative offset", "ttft_ms", {**good["ttft_ms"], "at": -8}, "offset in the payload")
    case("offset no int", "ttft_ms", {**good["ttft_ms"], "at": "0"}, "offset in the payload")
    case("rows no int", "ttft_ms", {**good["ttft_ms"], "n": 2.0}, "n must be a row count")
    case("rows past the limit", "ttft_ms", {**good["ttft_ms"], "n": 70_000}, "n must be a row count")
    case("rows disagree", "ttft_ms", {**good["ttft_ms"], "n": 2}, "has 2 values")
    case("absent past the payload", "ttft_ms", {**good["ttft_ms"], "absent": len(payload)}, "offset in the payload")
    case("absent byte 100", "ttft_ms", {**good["ttft_ms"], "absent": good["prompt_tokens"]["at"]}, "must be 0 or 1")
    case("code past the vocab", "status", {**good["status"], "vocab": []}, "past its 0 values")
    case("vocab not a list", "status", {**good["status"], "vocab": "ok"}, "vocab must be an array")
    case("vocab of a list", "status", {**good["status"], "vocab": [["ok"]]}, "no JSON scalar")
    case("vocab repeats", "status", {**good["status"], "vocab": ["ok", "ok"]}, "distinct")
    case("vocab 1 and true", "status", {**good["status"], "vocab": [1, True]}, "distinct")
    case("vocab on a number", "ttft_ms", {**good["ttft_ms"], "vocab": ["x"]}, "vocab is for type str")
    case("a column no array", "request_id", 5, "must be an array or a typed column, got int")
    return cases


@pytest.mark.parametrize(("raw", "says"), [(raw, says) for _, raw, says in _layouts()], ids=[c[0] for c in _layouts()])
def test_a_broken_layout_is_one_dead_letter_for_the_message(raw: bytes, says: str) -> None:
    _, res = _process(raw)
    assert res.valid == 0 and len(res.dead_letters) == 1
    dl = res.dead_letters[0]
    assert dl["kind"] == "bad envelope" and says in dl["reason"], dl["reason"]


def test_a_typed_column_in_a_json_message_is_refused() -> None:
    raw = orjson.dumps({"schema_version": 1, "kind": "columns", "request": {"ts_ms": {"t": "i8", "n": 1, "at": 0}}})
    _, res = _process(raw)
    assert "must be an array, got dict" in res.dead_letters[0]["reason"]


# -- values: a row's own dead letter ------------------------------------------------------------
def _value_cases() -> list[tuple[str, Any]]:
    nan, inf = float("nan"), float("inf")
    return [
        ("ttft NaN", lambda p: {"ttft_ms": p.col("f8", [100.0, nan, 102.0, 103.0])}),
        ("ttft inf", lambda p: {"ttft_ms": p.col("f8", [100.0, inf, 102.0, 103.0])}),
        ("ttft negative", lambda p: {"ttft_ms": p.col("f4", [100.0, -1.0, 102.0, 103.0])}),
        ("ttft absent", lambda p: {"ttft_ms": p.col("f8", [100.0] * 4, absent=[0, 1, 0, 0])}),
        ("ttft as ints", lambda p: {"ttft_ms": p.col("i4", [100, 5, 102, 103])}),  # valid: ints are numbers
        ("ttft as bools", lambda p: {"ttft_ms": p.col("b1", [1, 0, 1, 1])}),
        ("e2e below ttft", lambda p: {"e2e_ms": p.col("f8", [900.5, 50.0, 902.5, 903.5])}),
        ("ts as floats", lambda p: {"ts_ms": p.col("f8", [T0 + 0.0, T0 + 10.5, T0 + 20.0, T0 + 30.0])}),
        ("ts past int64 floats", lambda p: {"ts_ms": p.col("i8", [T0, 2**62, T0 + 20, T0 + 30])}),
        ("tokens past 2**53", lambda p: {"prompt_tokens": p.col("i8", [100, 2**60, 100, 100])}),
        ("tokens as floats", lambda p: {"prompt_tokens": p.col("f8", [100.0, 7.5, 100.0, 100.0])}),
        ("kv_hit byte 2", lambda p: {"kv_hit": p.col("b1", [1, 2, 0, 1])}),
        ("kv_hit as ints", lambda p: {"kv_hit": p.col("i4", [1, 0, 0, 1])}),
        ("status unknown", lambda p: {"status": p.col("str", [0, 1, 0, 0], vocab=["ok", "fine"])}),
        ("status no str", lambda p: {"status": p.col("str", [0, 1, 0, 0], vocab=["ok", 5])}),
        ("status absent", lambda p: {"status": p.col("str", [0, 0, 0, 0], absent=[0, 1, 0, 0], vocab=["ok"])}),
        ("status as ints", lambda p: {"status": p.col("i4", [0, 0, 0, 0])}),
        ("model empty", lambda p: {"model": p.col("str", [0, 1, 0, 0], vocab=[MODEL, ""])}),
        ("node too long", lambda p: {"node": p.col("str", [0, 1, 0, 0], vocab=["az-a/n0", "n" * 300])}),
        ("zone unknown", lambda p: {"zone": p.col("str", [0, 1, 0, 0], vocab=["az-a", "az-nowhere"])}),
        ("request_id typed", lambda p: {"request_id": p.col("str", [0, 1, 2, 3], vocab=["a", "b", "", "d"])}),
        ("class unknown", lambda p: {"request_class": p.col("str", [0, 1, 0, 0], vocab=["rag", "nope"])}),
        ("class no str", lambda p: {"request_class": p.col("str", [0, 1, 0, 0], vocab=["rag", 3])}),
        ("agent path unknown", lambda p: _agent(p, path=["rag", "search"])),
        ("agent signal past 1", lambda p: _agent(p, stability=[0.5, 1.5, 0.5, 0.5])),
        ("agent signal missing", lambda p: _agent(p, absent_tool=[0, 1, 0, 0])),
    ]


def _agent(
    p: Payload, path: list[str] | None = None, stability: list[float] | None = None, absent_tool: Any = None
) -> dict[str, Any]:
    return {
        "agent_stability": p.col("f8", stability or [0.5] * 4),
        "agent_rag_score": p.col("f8", [0.5] * 4),
        "agent_tool_conf": p.col("f8", [0.5] * 4, absent=absent_tool),
        "agent_path": p.col("str", [0, 1, 0, 0], vocab=path or ["rag", "tool"]),
    }


@pytest.mark.parametrize("make", [m for _, m in _value_cases()], ids=[n for n, _ in _value_cases()])
def test_a_bad_value_is_its_rows_own_dead_letter_with_the_reason_of_the_row(make: Any) -> None:
    p = Payload()
    raw = frame({"request": requests(4, p, **make(p))}, bytes(p.buf))
    proc, res = _process(raw)
    rows, want = _as_rows(raw)
    batch = decode_message(raw)
    assert not isinstance(batch, list)
    section = batch.sections["request"]
    reasons = {i: validate_record(section.row(i)) for i in range(4)}
    # Each invalid row: its dead letter, its index in the section, validate_record's reason.
    got = [(d["source"]["index"], d["reason"]) for d in res.dead_letters if d["kind"] == "invalid record"]
    assert got == [(i, r) for i, r in reasons.items() if r is not None]
    # Everything (admission letters too) as the row batch of the same records, and the same windows.
    assert sorted((d["kind"], d["reason"]) for d in res.dead_letters) == sorted(
        (d["kind"], d["reason"]) for d in want.dead_letters
    )
    assert res.valid == want.valid
    assert _close(proc.close_due(T0 + 10**6, 0), rows.close_due(T0 + 10**6, 0))


# -- any typed section: the rows' oracle ---------------------------------------------------------
_T = st.sampled_from(["f8", "f4", "i8", "i4", "b1", "str"])
_NUM = st.one_of(
    st.integers(-3, 3),
    st.integers(T0 - 100, T0 + 20_000),
    st.integers(2**53 - 2, 2**53 + 2),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
)
_VOCAB = st.lists(
    st.one_of(st.sampled_from(["ok", "error", "", "az-a", "az-b", MODEL, "rag", "az-a/n1"]), st.integers(0, 2)),
    min_size=1,
    max_size=4,
    unique_by=lambda v: (v, type(v)),
).filter(lambda v: len(set(v)) == len(v))
_FIELDS = ["ts_ms", "ttft_ms", "e2e_ms", "queue_ms", "prompt_tokens", "kv_hit", "status", "zone", "node", "gpu_util"]


def _column(draw: Any, t: str, n: int) -> tuple[str, list[Any], list[bool] | None, list[Any] | None]:
    absent = draw(st.one_of(st.none(), st.lists(st.booleans(), min_size=n, max_size=n)))
    if t == "str":
        vocab = draw(_VOCAB)
        return t, draw(st.lists(st.integers(0, len(vocab) - 1), min_size=n, max_size=n)), absent, vocab
    if t == "b1":
        return t, draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)), absent, None
    values = draw(st.lists(_NUM, min_size=n, max_size=n))
    if t in ("i8", "i4"):
        bound = 2**31 if t == "i4" else 2**63
        values = [int(v) if isinstance(v, int) and -bound <= v < bound else 7 for v in values]
    else:
        values = [float(v) for v in values]
    return t, values, absent, None


@st.composite
def typed_sections(draw: Any) -> bytes:
    p = Payload()
    sections = {}
    for kind, make in (("request", _req), ("gpu", _gpu)):
        n = draw(st.integers(0, 6))
        if not n:
            continue
        rows = [make(i, ts=T0 + 37 * i, node=f"az-a/n{i % 2}") for i in range(n)]
        cols = {k: [r.get(k) for r in rows] for k in dict.fromkeys(k for r in rows for k in r if k != "kind")}
        for name in draw(st.lists(st.sampled_from(_FIELDS), max_size=3, unique=True)):
            t, values, absent, vocab = _column(draw, draw(_T), n)
            cols[name] = p.col(t, values, absent, vocab)  # type: ignore[assignment]
        for name, col in list(cols.items()):  # the rest typed too where the encoder would type them
            if isinstance(col, list) and draw(st.booleans()):
                from governor_telemetry.typed import typed_column

                spec = typed_column(col, p.buf)
                if spec is not None:
                    cols[name] = spec  # type: ignore[assignment]
        sections[kind] = cols
    return frame(sections, bytes(p.buf))


@settings(derandomize=True, max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(typed_sections())
@example(frame({}, b""))
def test_any_typed_message_gives_what_its_rows_give_as_records(raw: bytes) -> None:
    proc, res = _process(raw)
    rows, want = _as_rows(raw)
    assert sorted(
        (d["kind"], d["reason"], orjson.dumps(d["record"], option=orjson.OPT_SORT_KEYS)) for d in res.dead_letters
    ) == sorted(
        (d["kind"], d["reason"], orjson.dumps(d["record"], option=orjson.OPT_SORT_KEYS)) for d in want.dead_letters
    )
    assert res.valid == want.valid
    assert _close(proc.close_due(T0 + 10**6, 0), rows.close_due(T0 + 10**6, 0))


def test_the_producer_encoding_round_trips_every_record_and_keeps_odd_columns_as_arrays() -> None:
    recs = [
        *(_req(i, ts=T0 + i, node=f"az-a/n{i % 3}", request_class="rag") for i in range(40)),
        *(_gpu(i, ts=T0 + i) for i in range(5)),
        _req(99, ts=T0 + 99, ttft_ms=123.456789, prompt_tokens=2**40),
    ]
    raw = encode_typed(recs, "node-1", 7)
    batch = decode_message(raw)
    assert not isinstance(batch, list)
    back = [s.row(i) for s in batch.sections.values() for i in range(s.n)]
    assert sorted(map(orjson.dumps, back)) == sorted(map(orjson.dumps, recs))
    req = batch.sections["request"].cols
    assert type(req["ttft_ms"]) is TypedColumn and req["ttft_ms"].t == "f8"  # 123.456789 is no float32
    assert type(req["prompt_tokens"]) is TypedColumn and req["prompt_tokens"].t == "i8"
    assert isinstance(req["request_id"], list)  # mostly distinct: an array
    assert type(req["node"]) is TypedColumn and req["node"].vocab == ("az-a/n0", "az-a/n1", "az-a/n2")
    assert len(raw) < len(orjson.dumps(recs)) / 2


def test_the_worker_counts_messages_by_encoding_in_one_message_and_in_batches() -> None:
    from governor_telemetry.columnar import encode_columns
    from governor_telemetry.records import encode_envelope

    from loop.control_loop import ControlLoop
    from streams.metrics_export import WorkerMetrics

    metrics = WorkerMetrics()
    loop = ControlLoop(SETTINGS, metrics)
    recs = [_req(i, ts=T0 + i) for i in range(3)]
    msgs = [encode_typed(recs, "n", 0), encode_columns(recs, "n", 0), encode_envelope(recs, "n", 0), b"{broken"]
    loop.ingest(msgs[0], SRC, NOW)
    loop.ingest_many(msgs, [{**SRC, "offset": k} for k in range(4)], NOW)

    def count(encoding: str) -> float | None:
        return metrics.registry.get_sample_value("governor_telemetry_messages_total", {"encoding": encoding})

    assert (count("typed"), count("columns"), count("rows")) == (2.0, 1.0, 1.0)  # the broken one: a dead letter
