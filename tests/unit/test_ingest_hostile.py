"""Hostile telemetry cannot blind or bloat the ingest (issue #13, items 2, 4 and 6).

A record dated years ahead is dead-lettered (``future``) and does not move
the watermark; zones and models outside the configuration are refused at
ingest; a (model, zone) window holds at most GOVERNOR_MAX_NODES_PER_WINDOW
nodes; every dead letter serialises below the cap, whatever the input; the
dead-letter counter's label stays the fixed vocabulary; and the whole
in-memory telemetry path (bytes -> ingest -> close -> decode -> decide) lets
no exception escape, fuzzed with hypothesis.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from governor_telemetry.records import encode_envelope
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.settings import ModelSpec, Settings
from core.vocab import DEAD_LETTER_KINDS
from loop.control_loop import ControlLoop
from loop.deadletters import MAX_DEAD_LETTER_BYTES, dead_letter
from streams.metrics_export import WorkerMetrics

MODEL = "m"
ZONES = ("az-a", "az-b")
NOW = 1_700_000_000_000
YEAR_MS = 365 * 86_400_000
SRC = {"topic": "telemetry", "partition": 0, "offset": 0}


def _settings(**kw: Any) -> Settings:
    return Settings(models=(ModelSpec(MODEL),), zones=ZONES, window_s=1.0, lateness_s=0.5, **kw)


def _req(i: int, ts: int, zone: str = "az-a", node: str = "n0", **kw: Any) -> dict[str, Any]:
    rec = {
        "kind": "request",
        "request_id": f"r{i}",
        "ts_ms": ts,
        "model": MODEL,
        "zone": zone,
        "node": node,
        "ttft_ms": 100.0,
        "e2e_ms": 500.0,
        "status": "ok",
    }
    rec.update(kw)
    return rec


def _gpu(ts: int, zone: str = "az-a", node: str = "n0", **kw: Any) -> dict[str, Any]:
    rec = {
        "kind": "gpu",
        "ts_ms": ts,
        "model": MODEL,
        "zone": zone,
        "node": node,
        "state": "ready",
        "gpu_util": 0.5,
        "mem_used_bytes": 1,
        "mem_total_bytes": 2,
    }
    rec.update(kw)
    return rec


def _series(metrics: WorkerMetrics) -> dict[str, int]:
    """Label sets per metric family (the Prometheus series)."""
    return {m.name: len({tuple(sorted(s.labels.items())) for s in m.samples}) for m in metrics.registry.collect()}


# -- the watermark ------------------------------------------------------------------------


def test_a_record_ten_years_ahead_is_dead_lettered_and_does_not_blind_the_loop() -> None:
    loop = ControlLoop(_settings())
    res = loop.ingest(encode_envelope([_req(0, NOW + 10 * YEAR_MS)], "evil", NOW), SRC, NOW)
    assert res.valid == 0 and [d["kind"] for d in res.dead_letters] == ["future"]
    assert res.dead_letters[0]["reason"].startswith("future: ts_ms ")
    assert loop.processor.tracker.watermark_ms is None
    # the good records after it are windowed and close by event time, none is late
    windows = []
    for k in range(1, 6):
        t = NOW + 1000 * k
        out = loop.ingest(encode_envelope([_req(k, t), _gpu(t)], "good", t), SRC, t)
        assert out.dead_letters == [] and out.valid == 2
        windows += out.windows
    assert [w["window_start_ms"] for w in windows if w["scope"] == "zone"] == [NOW + 1000, NOW + 2000, NOW + 3000]
    assert loop.processor.late_count == 0


def test_a_record_ahead_of_the_clock_within_the_allowance_never_moves_the_watermark_past_it() -> None:
    loop = ControlLoop(_settings(max_future_s=60.0))
    ahead = loop.ingest(encode_envelope([_req(0, NOW + 50_000)], "skewed", NOW), SRC, NOW)
    assert ahead.valid == 1 and ahead.windows == []
    assert loop.processor.tracker.watermark_ms == NOW
    good = loop.ingest(encode_envelope([_req(1, NOW + 100)], "good", NOW + 200), SRC, NOW + 200)
    assert good.valid == 1 and good.dead_letters == []
    # its window closes when the clock gets there, not before
    assert [w for w in loop.close_due(NOW + 40_000) if w["window_start_ms"] == NOW + 50_000] == []
    assert [w["scope"] for w in loop.close_due(NOW + 52_000) if w["window_start_ms"] == NOW + 50_000] == [
        "node",
        "zone",
    ]


@pytest.mark.parametrize("batch", [1, 5], ids=["per-record path", "column path"])
def test_unknown_zones_and_models_are_dead_lettered_at_ingest(batch: int) -> None:
    loop = ControlLoop(_settings())
    recs = [_req(i, NOW, zone="az-zz") for i in range(batch)] + [_req(9, NOW, model="gpt-x")]
    res = loop.ingest(encode_envelope(recs, "n", NOW), SRC, NOW)
    assert res.valid == 0
    kinds = [d["kind"] for d in res.dead_letters]
    assert kinds == ["unknown zone"] * batch + ["unknown model"]
    assert res.dead_letters[0]["reason"] == "unknown zone: 'az-zz' is not in GOVERNOR_ZONES"


# -- bounded state --------------------------------------------------------------------------


def _flood(loop: ControlLoop, nodes: int, zone_of: Any, per_msg: int = 500) -> int:
    dead = 0
    for first in range(0, nodes, per_msg):
        recs = [_gpu(NOW + 10, zone=zone_of(i), node=f"node-{i}") for i in range(first, first + per_msg)]
        dead += len(loop.ingest(encode_envelope(recs, "flood", NOW), SRC, NOW + 20).dead_letters)
    return dead


def test_20k_nodes_over_2000_zone_names_leave_bounded_windows_and_series() -> None:
    metrics = WorkerMetrics()
    loop = ControlLoop(_settings(max_nodes_per_window=1024), metrics)
    dead = _flood(loop, 20_000, lambda i: f"az-{i % 2000}")
    p = loop.processor
    assert dead == 20_000 and p.dead_by_kind["unknown zone"] == 20_000
    assert p.open_windows == 0 and p.tracker.open_count == 0
    for w in loop.close_due(NOW + 10_000):
        rec, dl = loop.decode(w, SRC, NOW + 10_000)
        assert rec is not None
        loop.decide(rec, NOW + 10_000)
    series = _series(metrics)
    assert series["governor_deadletter"] == len(DEAD_LETTER_KINDS)
    assert series["governor_telemetry_messages"] == 3  # rows, columns, typed: fixed, whatever comes
    fixed = ("governor_deadletter", "governor_telemetry_messages")
    assert all(n <= len(ZONES) for name, n in series.items() if name not in fixed), series


def test_20k_nodes_in_one_zone_are_capped_per_window() -> None:
    """20k new node ids: 64 get a slot (nothing known yet: NEW_NODES_FLOOR), the rest are counted and
    dead-lettered once, for the window (issue 31, item 5: before, one dead letter per record)."""
    metrics = WorkerMetrics()
    loop = ControlLoop(_settings(max_nodes_per_window=1024), metrics)
    dead = _flood(loop, 20_000, lambda i: "az-a")
    p = loop.processor
    assert p.open_windows == p.tracker.open_count == 64
    assert dead == 0 and p.dead_by_kind["too many nodes"] == 0
    assert p.open_windows <= p.max_open_windows
    zone = [w for w in loop.close_due(NOW + 10_000) if w["scope"] == "zone"]
    assert [(w["zone"], w["nodes"], w["node_cap_dropped"]) for w in zone] == [("az-a", 64, 20_000 - 64)]
    assert p._nodes_in == {} and p.node_cap.new_in == {} and p.node_cap.dropped == {}  # released at close
    (letter,) = loop.ingests.drain_dead_letters()
    assert letter["kind"] == "too many nodes" and letter["record"]["dropped_records"] == 20_000 - 64
    reasons = metrics.registry.get_sample_value("governor_deadletter_total", {"reason": "too many nodes"})
    assert reasons == 1
    labels = {"model": MODEL, "zone": "az-a"}
    assert metrics.registry.get_sample_value("governor_window_node_cap_dropped_total", labels) == 20_000 - 64


def test_the_column_path_keeps_the_node_cap() -> None:
    loop = ControlLoop(_settings(max_nodes_per_window=3))
    recs = [_req(i, NOW + 1, node=f"n{i}") for i in range(5)]
    res = loop.ingest(encode_envelope(recs, "n", NOW), SRC, NOW)
    assert res.valid == 3 and res.capped == 2 and res.dead_letters == []
    again = loop.ingest(encode_envelope(recs[:3], "n", NOW), SRC, NOW)  # the same nodes: admitted
    assert again.valid == 3 and again.dead_letters == []


def test_10k_distinct_bad_records_keep_the_label_cardinality_at_the_vocabulary() -> None:
    metrics = WorkerMetrics()
    loop = ControlLoop(_settings(), metrics)
    for k in range(100):
        recs = [{"kind": f"evil-{k}-{i}:x", "ts_ms": NOW} for i in range(50)]
        recs += [_req(i, NOW, status=f"status-{k}-{i}: no") for i in range(50)]
        loop.ingest(encode_envelope(recs, "n", NOW), SRC, NOW)
    for i in range(200):  # bad metrics records and reasons of every shape
        loop.decode(orjson.dumps({"scope": f"s{i}: x"}), SRC, NOW)
        metrics.observe_dead_letter(f"anything {i}: at all")
    deadletters = [s for m in metrics.registry.collect() if m.name == "governor_deadletter" for s in m.samples]
    labels = {s.labels["reason"] for s in deadletters if s.name == "governor_deadletter_total"}
    assert labels == set(DEAD_LETTER_KINDS)
    assert metrics.registry.get_sample_value("governor_deadletter_total", {"reason": "invalid record"}) == 10_200


def test_a_histogram_longer_than_64_bins_and_a_long_node_id_are_invalid() -> None:
    loop = ControlLoop(_settings())
    res = loop.ingest(
        encode_envelope([_gpu(NOW, free_block_hist=[1] * 65), _gpu(NOW, node="n" * 257)], "n", NOW), SRC, NOW
    )
    assert res.valid == 0 and [d["kind"] for d in res.dead_letters] == ["invalid record"] * 2


# -- bounded dead letters -------------------------------------------------------------------


def _nested(depth: int, leaf: Any = 1) -> bytes:
    return b"[" * depth + orjson.dumps(leaf) + b"]" * depth


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(_nested(1023), id="1023 levels as the message"),
        pytest.param(b'{"kind":"batch","schema_version":1,"records":[' + _nested(1020) + b"]}", id="1020-level record"),
        pytest.param(
            b'{"kind":"batch","schema_version":1,"records":[{"kind":"gpu","model":' + _nested(1000) + b"}]}",
            id="deep field",
        ),
        pytest.param(encode_envelope([_req(0, NOW, model="x" * 25_000_000)], "n", 0), id="25 MB model"),
        pytest.param(b'"' + b"x" * 25_000_000 + b'"', id="25 MB string message"),
        pytest.param(b"\xff" * 3_000_000, id="3 MB of non-UTF-8"),
        pytest.param(
            encode_envelope([{"kind": ["x" * 100_000] * 300, "ts_ms": NOW}], "n", 0), id="30 MB of wide record"
        ),
    ],
)
def test_the_dead_letter_of_any_input_serialises_below_the_cap(raw: bytes) -> None:
    loop = ControlLoop(_settings(), WorkerMetrics())
    res = loop.ingest(raw, SRC, NOW)
    assert res.valid == 0 and len(res.dead_letters) == 1
    dl = res.dead_letters[0]
    assert dl["kind"] in DEAD_LETTER_KINDS
    assert len(orjson.dumps(dl)) <= MAX_DEAD_LETTER_BYTES
    assert dl["truncated"] is True or dl["record"] == raw.decode()  # a small message stays whole, as text


def test_a_small_dead_letter_keeps_its_record_whole() -> None:
    rec = {"kind": "request", "a": [[[[1]]]]}
    dl = dead_letter("missing field 'ts_ms'", SRC, rec, NOW)
    assert dl["record"] is rec and dl["truncated"] is False and dl["kind"] == "invalid record"


def test_a_decoded_metrics_record_nested_past_orjsons_writer_is_dead_lettered_serialisably() -> None:
    loop = ControlLoop(_settings(), WorkerMetrics())
    raw = b'{"scope":"zone","model":"m","zone":"az-a","window_end_ms":1,"count":' + _nested(1000) + b"}"
    rec, dl = loop.decode(raw, SRC, NOW)
    assert rec is None and dl is not None and dl["kind"] == "bad metrics record"
    assert len(orjson.dumps(dl)) <= MAX_DEAD_LETTER_BYTES


# -- fuzz: the whole telemetry path in memory ------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
_FIELDS = sorted(set(_req(0, 0)) | set(_gpu(0)) | {"free_block_hist", "agent_path", "agent_stability", "queue_len"})
_TS = st.sampled_from([NOW - 5000, NOW - 10, NOW, NOW + 300, NOW + 59_000, NOW + 61_000, NOW + 10 * YEAR_MS])
_ZONE = st.sampled_from([*ZONES, "az-zz", ""])


@st.composite
def _record(draw: st.DrawFn) -> Any:
    base = draw(st.sampled_from(["request", "gpu", "junk"]))
    if base == "junk":
        return draw(_json)
    ts, zone, node = draw(_TS), draw(_ZONE), f"n{draw(st.integers(0, 5))}"
    rec = _req(draw(st.integers(0, 99)), ts, zone, node) if base == "request" else _gpu(ts, zone, node)
    for _ in range(draw(st.integers(0, 2))):  # a few fields replaced by anything
        rec[draw(st.sampled_from(_FIELDS))] = draw(_json)
    return rec


@st.composite
def _message(draw: st.DrawFn) -> bytes:
    shape = draw(st.sampled_from(["batch", "batch", "batch", "bare", "bytes", "json"]))
    if shape == "bytes":
        return draw(st.binary(max_size=64))
    if shape == "json":
        return orjson.dumps(draw(_json))
    if shape == "bare":
        return orjson.dumps(draw(_record()))
    return encode_envelope(draw(st.lists(_record(), max_size=8)), "fuzz", NOW)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_message(), min_size=1, max_size=6), st.integers(0, 3_000))
def test_fuzz_the_telemetry_path_lets_no_exception_escape_and_accounts_every_record(
    messages: list[bytes], step_ms: int
) -> None:
    metrics = WorkerMetrics()
    loop = ControlLoop(_settings(max_nodes_per_window=4), metrics)
    now = NOW
    records_in = valid = dead = 0
    for k, raw in enumerate(messages):
        now += step_ms
        before = loop.processor.records_in
        res = loop.ingest(raw, {**SRC, "offset": k}, now)
        # a message that is no envelope counts as one (dead) record
        n = 1 if [d["kind"] for d in res.dead_letters] == ["bad envelope"] else loop.processor.records_in - before
        records_in += n
        valid += res.valid
        dead += len(res.dead_letters)
        assert res.valid + len(res.dead_letters) + res.capped == n
        for d in res.dead_letters:
            assert d["kind"] in DEAD_LETTER_KINDS and isinstance(d["reason"], str) and d["reason"]
            assert len(orjson.dumps(d)) <= MAX_DEAD_LETTER_BYTES
        windows = res.windows + loop.close_due(now)
        for w in windows:
            value, _ = loop.sign_window(w)
            rec, dl = loop.decode(value, SRC, now)
            assert rec is not None, dl  # the ingest's own windows always decode
            loop.decide(rec, now)
    assert valid + dead == records_in
    assert metrics.registry.get_sample_value("governor_records_total") == valid + dead
    labels = {
        s.labels["reason"] for m in metrics.registry.collect() for s in m.samples if m.name == "governor_deadletter"
    }
    assert labels <= set(DEAD_LETTER_KINDS)
