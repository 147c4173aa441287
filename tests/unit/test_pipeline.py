"""TelemetryProcessor: buffered/blocked aggregation gives the windows a plain
one-shot aggregation gives; every bad or late record is dead-lettered with its
reason and source index."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import orjson
import pytest
from governor_telemetry.records import encode_envelope

import loop.pipeline as pipeline
from controllers.window_columns import AGENT_COLUMNS, AGENT_PATHS
from controllers.window_result import result
from controllers.windows import (
    SloSpec,
    add_gpu,
    add_requests,
    initialize,
    merge,
)
from core.settings import Settings
from loop.pipeline import TelemetryProcessor

SETTINGS = Settings(window_s=1.0, lateness_s=0.2)
MODEL = SETTINGS.models[0].name
T0 = 1_700_000_000_000


def _req(i: int, ts: int, node: str, zone: str = "az-a", **kw: Any) -> dict[str, Any]:
    rec = {
        "kind": "request",
        "request_id": f"r{i}",
        "ts_ms": ts,
        "model": MODEL,
        "zone": zone,
        "node": node,
        "ttft_ms": 50.0 + (i * 37) % 900,
        "itl_ms": float(i % 70),
        "e2e_ms": 2000.0 + i,
        "queue_ms": float(i % 5),
        "prompt_tokens": 100 + i,
        "output_tokens": i % 50,
        "kv_hit": i % 3 == 0,
        "status": "ok" if i % 11 else "error",
    }
    rec.update(kw)
    return {k: v for k, v in rec.items() if v is not None}


def _agent(i: int) -> dict[str, Any]:
    """Agent fields of request ``i``: none, signals and path, signals only, path only."""
    signals = {"agent_stability": (i % 10) / 10, "agent_rag_score": (i % 7) / 6, "agent_tool_conf": (i % 3) / 2}
    path = {"agent_path": ("rag", "tool", "llm")[i % 3]}
    return [{}, {**signals, **path}, signals, path][i % 4]


def _gpu(ts: int, node: str, state: str = "ready", zone: str = "az-a") -> dict[str, Any]:
    return {
        "kind": "gpu",
        "ts_ms": ts,
        "model": MODEL,
        "zone": zone,
        "node": node,
        "state": state,
        "gpu_util": 0.25 + (ts % 7) / 10,
        "mem_used_bytes": 10,
        "mem_total_bytes": 20,
        "queue_len": ts % 4,
        "running": 2,
        "kv_blocks_used": 3,
        "kv_blocks_total": 9,
    }


def _reference(records: list[dict[str, Any]], slo: SloSpec) -> list[dict[str, Any]]:
    """Node and zone window results from one add_requests/add_gpu per window."""
    groups: dict[tuple[str, str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["model"], r["zone"], r["node"], r["ts_ms"] - r["ts_ms"] % 1000)].append(r)
    nodes: dict[tuple[Any, ...], Any] = {}
    for key, recs in groups.items():
        agg = initialize()
        reqs = [r for r in recs if r["kind"] == "request"]
        gpus = [r for r in recs if r["kind"] == "gpu"]
        if reqs:
            add_requests(
                agg,
                {
                    **{
                        c: np.array([r.get(c) or 0 for r in reqs], dtype=float)
                        for c in ("ttft_ms", "itl_ms", "e2e_ms", "queue_ms", "prompt_tokens", "output_tokens")
                    },
                    "kv_hit": np.array([bool(r.get("kv_hit")) for r in reqs]),
                    "ok": np.array([r["status"] == "ok" for r in reqs]),
                    **{c: np.array([r.get(c, np.nan) for r in reqs], dtype=float) for c in AGENT_COLUMNS[:3]},
                    "agent_path": np.array(
                        [AGENT_PATHS.index(r["agent_path"]) if "agent_path" in r else np.nan for r in reqs]
                    ),
                },
                slo,
            )
        if gpus:
            add_gpu(
                agg,
                {c: np.array([r.get(c) or 0 for r in gpus]) for c in pipeline._GPU_COLUMNS},
                [r["node"] for r in gpus],
                [r["state"] for r in gpus],
            )
        nodes[key] = agg
    out = []
    zones: dict[tuple[Any, ...], Any] = {}
    for (model, zone, node, start), agg in nodes.items():
        out.append(("node", zone, node, start, result(agg, 1.0)))
        zk = (model, zone, start)
        zones[zk] = agg if zk not in zones else merge(zones[zk], agg)
    out += [("zone", zone, None, start, result(agg, 1.0)) for (_, zone, start), agg in zones.items()]
    return out


def _as_reference(windows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    keys = set(result(initialize(), 1.0))
    return [(w["scope"], w["zone"], w.get("node"), w["window_start_ms"], {k: w[k] for k in keys}) for w in windows]


def _same(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> None:
    def order(x: tuple[Any, ...]) -> tuple[Any, ...]:
        return (x[0], x[1], x[2] or "", x[3])

    assert [x[:4] for x in sorted(a, key=order)] == [x[:4] for x in sorted(b, key=order)]
    for x, y in zip(sorted(a, key=order), sorted(b, key=order), strict=True):
        assert x[4].keys() == y[4].keys()
        for k in x[4]:
            assert (x[4][k] is None) == (y[4][k] is None), (x[:4], k)
            if x[4][k] is not None:
                assert x[4][k] == pytest.approx(y[4][k], rel=1e-12), (x[:4], k)


def _traffic() -> list[list[dict[str, Any]]]:
    """Messages of one node's batch each (as producers send), several windows and nodes."""
    messages, i = [], 0
    for m in range(60):
        node = f"az-a/n{m % 4}"
        ts = T0 + m * 70
        batch = [_req(i + k, ts + k, node, **_agent(i + k)) for k in range(1 + m % 9)]
        if m % 5 == 0:
            batch.append(_gpu(ts, node, "starting" if m < 20 else "ready"))
        i += len(batch)
        messages.append(batch)
    messages.append([_req(9999, T0 + 4200, "az-b/n0", zone="az-b")])
    return messages


@pytest.mark.parametrize("flush_rows", [1, 3, pipeline.FLUSH_ROWS])
@pytest.mark.parametrize("encoded", [True, False])
def test_windows_match_one_shot_aggregation(monkeypatch: pytest.MonkeyPatch, flush_rows: int, encoded: bool) -> None:
    monkeypatch.setattr(pipeline, "FLUSH_ROWS", flush_rows)
    p = TelemetryProcessor(SETTINGS)
    windows: list[dict[str, Any]] = []
    for k, batch in enumerate(_traffic()):
        raw: Any = (
            encode_envelope(batch, "n", 0) if encoded else {"schema_version": 1, "kind": "batch", "records": batch}
        )
        res = p.process(raw, {"topic": "t", "partition": 0, "offset": k}, 0)
        assert not res.dead_letters and res.valid == len(batch)
        windows += p.close_due(None, 0)
    windows += p.close_due(T0 + 60_000, 0)
    slo = p.slos[MODEL]
    _same(_as_reference(windows), _reference([r for b in _traffic() for r in b], slo))
    assert p.tracker.open_count == 0 and not p._pending
    zones = [w for w in windows if w["scope"] == "zone"]
    assert sum(w["agent_signals_n"] for w in zones) > 0 and sum(w["agent_path_counts"]["tool"] for w in zones) > 0


def test_bad_and_late_records_are_dead_lettered_with_reason_and_index() -> None:
    p = TelemetryProcessor(SETTINGS)
    src = {"topic": "t", "partition": 2, "offset": 7}
    good = _req(1, T0 + 5000, "az-a/n0")
    batch = [
        good,
        _req(2, T0 + 5001, "az-a/n0", ttft_ms=-1.0),
        {"kind": "nope"},
        _req(3, T0 + 5002, "az-a/n0", model="unknown-model"),
        5,
        _gpu(T0 + 5003, "az-a/n0"),
    ]
    res = p.process(encode_envelope(batch, "n", 0), src, 42)
    assert res.valid == 2
    assert [(d["source"]["index"], d["reason"]) for d in res.dead_letters] == [
        (1, "field 'ttft_ms'=-1.0 is below 0"),
        (2, "unknown record kind 'nope'"),
        (3, "no SLO configured for model 'unknown-model' (GOVERNOR_MODELS)"),
        (4, "record must be an object, got int"),
    ]
    assert all(d["source"]["offset"] == 7 and d["dead_lettered_ms"] == 42 for d in res.dead_letters)
    assert res.dead_letters[0]["record"] == batch[1]
    # The watermark closes [T0+5000, T0+6000) once event time reaches T0+6200.
    p.process(orjson.dumps(_req(4, T0 + 6300, "az-a/n1")), src, 0)
    closed = p.close_due(None, 0)
    assert {(w["scope"], w["window_start_ms"]) for w in closed} == {("node", T0 + 5000), ("zone", T0 + 5000)}
    zone = next(w for w in closed if w["scope"] == "zone")
    assert zone["count"] == 1 and zone["replicas_ready"] == 1
    late = p.process(encode_envelope([_req(5, T0 + 5999, "az-a/n0"), _req(6, T0 + 6001, "az-a/n0")], "n", 0), src, 0)
    assert late.valid == 1 and [d["source"]["index"] for d in late.dead_letters] == [0]
    assert late.dead_letters[0]["reason"].startswith(f"late: window [{T0 + 5000}, {T0 + 6000})")
    assert p.late_count == 1


def test_bad_envelope_is_one_dead_letter() -> None:
    p = TelemetryProcessor(SETTINGS)
    res = p.process(b"{not json", {"topic": "t", "partition": 0, "offset": 1}, 5)
    assert res.valid == 0 and len(res.dead_letters) == 1
    assert res.dead_letters[0]["reason"].startswith("bad envelope: not JSON")
    assert res.dead_letters[0]["record"] == "{not json"


def test_bad_gpu_sample_beside_valid_requests_keeps_its_index() -> None:
    p = TelemetryProcessor(SETTINGS)
    bad_gpu = {**_gpu(T0 + 10, "az-a/n0"), "gpu_util": 2.0}
    batch = [
        _req(1, T0, "az-a/n0"),
        _req(2, T0 + 1, "az-a/n0"),
        bad_gpu,
        _gpu(T0 + 11, "az-a/n0"),
        _req(3, T0 + 2, "az-a/n1"),
    ]
    res = p.process(encode_envelope(batch, "n", 0), {"topic": "t", "partition": 0, "offset": 3}, 0)
    assert res.valid == 4
    assert [(d["source"]["index"], d["reason"]) for d in res.dead_letters] == [(2, "gpu_util=2.0 outside [0, 1]")]
    zone = next(w for w in p.close_due(T0 + 5000, 0) if w["scope"] == "zone")
    assert zone["count"] == 3 and zone["nodes"] == 2 and zone["replicas_ready"] == 1


def test_backlog_after_a_restart_is_windowed_not_dead_lettered_as_late() -> None:
    """A consumer catching up sees event times far behind the clock; while messages
    flow the clock must not close their windows (only the watermark does)."""
    from governor_telemetry.records import encode_envelope

    from core.settings import Settings
    from loop.pipeline import TelemetryProcessor

    p = TelemetryProcessor(Settings(window_s=1.0, lateness_s=0.2))
    now = 10_000_000  # the clock is ~2 h ahead of the backlog's event times
    rec = {
        "kind": "request",
        "request_id": "r",
        "model": "llama2-70b",
        "zone": "az-a",
        "node": "n",
        "ttft_ms": 100.0,
        "e2e_ms": 900.0,
        "status": "ok",
    }
    late = 0
    for k in range(50):  # 50 messages, 100 ms of event time each
        msg = encode_envelope([{**rec, "ts_ms": 1_000 + 100 * k}], "t", now)
        late += len(p.process(msg, {"topic": "t", "partition": 0, "offset": k}, now + k).dead_letters)
        p.close_due(now + k, now + k)
    assert late == 0
    # Once traffic stops for longer than window + lateness, the clock closes what is open.
    closed = p.close_due(now + 60_000, now + 60_000)
    assert closed and closed[-1]["scope"] == "zone"


def test_bad_agent_fields_are_dead_lettered_and_the_good_ones_reach_the_zone_window() -> None:
    p = TelemetryProcessor(SETTINGS)
    sig = {"agent_stability": 0.9, "agent_rag_score": 0.9, "agent_tool_conf": 0.2}
    batch = [
        _req(1, T0, "az-a/n0", **sig, agent_path="rag"),
        _req(2, T0 + 1, "az-a/n0", **sig),
        _req(3, T0 + 2, "az-a/n0", **{**sig, "agent_rag_score": 1.5}),
        _req(4, T0 + 3, "az-a/n0", agent_stability=0.5),
        _req(5, T0 + 4, "az-a/n1", agent_path="browse"),
        _req(6, T0 + 5, "az-a/n1", agent_path="llm"),
    ]
    res = p.process(encode_envelope(batch, "n", 0), {"topic": "t", "partition": 0, "offset": 1}, 0)
    assert [(d["source"]["index"], d["reason"]) for d in res.dead_letters] == [
        (2, "field 'agent_rag_score' outside [0, 1]: 1.5"),
        (3, "agent signals incomplete: 'agent_rag_score' missing (send all three or none)"),
        (4, "agent_path not in ['llm', 'rag', 'tool']: 'browse'"),
    ]
    zone = next(w for w in p.close_due(T0 + 5000, 0) if w["scope"] == "zone")
    assert zone["count"] == 3 and zone["agent_signals_n"] == 2
    assert (zone["agent_stability_mean"], zone["agent_rag_score_mean"], zone["agent_tool_conf_mean"]) == pytest.approx(
        (0.9, 0.9, 0.2)
    )
    assert zone["agent_path_counts"] == {"rag": 1, "tool": 0, "llm": 1}


@pytest.mark.parametrize("encoding", ["rows", "columns"])
def test_a_miss_without_a_reported_wait_counts_as_fixable(encoding: str) -> None:
    """TTFT 3 s against a 1 s SLO: with the wait reported as 0 the miss is unfixable (its prefill
    alone is too long); with no queue_ms at all (a producer that does not report waits) it is
    fixable, in either encoding, so the scaler still acts on it."""
    from governor_telemetry.columnar import encode_columns

    p = TelemetryProcessor(Settings(window_s=1.0, lateness_s=0.2))
    recs = [
        _req(i, T0 + 10 * i, "n1", ttft_ms=3000.0, e2e_ms=6000.0, status="ok", queue_ms=0.0 if i % 2 else None)
        for i in range(8)
    ]
    raw = encode_envelope(recs, "n", 0) if encoding == "rows" else encode_columns(recs, "n", 0)
    res = p.process(raw, {"topic": "t", "partition": 0, "offset": 0}, 0)
    assert not res.dead_letters
    (zone,) = [w for w in p.close_due(T0 + 60_000, 0) if w["scope"] == "zone"]
    assert zone["violation_rate"] == 1.0 and zone["unfixable_rate"] == 0.5


@pytest.mark.parametrize("encoding", ["record", "rows", "columns"])
def test_windows_keep_the_stage_latencies(encoding: str) -> None:
    """Issue 36 item 6: the per-record path (one record a message), the row batch's column path and the
    columnar path each keep network, preprocess and decode latencies as sketches, and count the misses
    a slow stage explains (over the TTFT SLO without the wait, within it without the network and
    preprocess time too).  Requests without a stage carry none (NaN), never a 0."""
    from governor_telemetry.columnar import encode_columns

    p = TelemetryProcessor(Settings(window_s=1.0, lateness_s=0.2))
    recs = []
    for i in range(10):
        stages: dict[str, Any] = {"network_ms": 800.0, "preprocess_ms": 5.0, "decode_ms": 2000.0} if i < 4 else {}
        # 0-3: TTFT 1400 = 800 network + 5 preprocess + 0 wait + 595 prefill (the network explains the miss);
        # 4-5: TTFT 1400, no stages reported, no wait (unfixable, not explained); 6-9: within the SLO
        ttft = 1400.0 if i < 6 else 300.0
        recs.append(_req(i, T0 + 10 * i, "n1", ttft_ms=ttft, e2e_ms=4000.0, status="ok", queue_ms=0.0, **stages))
    src = {"topic": "t", "partition": 0, "offset": 0}
    if encoding == "record":
        for rec in recs:
            assert not p.process(encode_envelope([rec], "n", 0), src, 0).dead_letters
    else:
        raw = encode_envelope(recs, "n", 0) if encoding == "rows" else encode_columns(recs, "n", 0)
        assert not p.process(raw, src, 0).dead_letters
    (zone,) = [w for w in p.close_due(T0 + 60_000, 0) if w["scope"] == "zone"]
    assert zone["violation_rate"] == 0.6 and zone["unfixable_rate"] == 0.6
    assert zone["stage_unfixable_rate"] == 0.4
    assert zone["network_p50_ms"] == pytest.approx(800.0, rel=0.01)
    assert zone["network_p95_ms"] == pytest.approx(800.0, rel=0.01)
    assert zone["preprocess_p95_ms"] == pytest.approx(5.0, rel=0.01)
    assert zone["decode_p50_ms"] == pytest.approx(2000.0, rel=0.01)


def test_a_bad_stage_latency_is_dead_lettered_with_its_reason() -> None:
    p = TelemetryProcessor(Settings(window_s=1.0, lateness_s=0.2))
    recs = [_req(0, T0, "n1", network_ms=-3.0), _req(1, T0, "n1", decode_ms=5.0)]
    res = p.process(encode_envelope(recs, "n", 0), {"topic": "t", "partition": 0, "offset": 0}, 0)
    assert [(d["reason"], d["source"]["index"]) for d in res.dead_letters] == [
        ("field 'network_ms'=-3.0 is below 0", 0)
    ]
    (zone,) = [w for w in p.close_due(T0 + 60_000, 0) if w["scope"] == "zone"]
    assert zone["count"] == 1 and zone["decode_p50_ms"] == pytest.approx(5.0, rel=0.01)
    assert zone["network_p50_ms"] is None
