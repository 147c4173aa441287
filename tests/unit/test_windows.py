"""Tumbling-window aggregation: tables of cases, oracles and properties."""

from __future__ import annotations

import json
import math
import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controllers.errors import LateWindowError, ParameterError
from controllers.window_columns import AGENT_COLUMNS, AGENT_PATHS, GPU_COLUMNS
from controllers.window_result import result
from controllers.window_tracker import WindowTracker
from controllers.windows import (
    SloSpec,
    WindowAggregate,
    add_gpu,
    add_requests,
    initialize,
    merge,
    window_start_ms,
)

SLO = SloSpec(ttft_slo_ms=500.0, itl_slo_ms=50.0)


def req_cols(rows: list[tuple[float, float, bool]], **extra: Any) -> dict[str, np.ndarray]:
    """Columns from (ttft_ms, itl_ms, ok) rows; other columns get simple values."""
    n = len(rows)
    cols = {
        "ttft_ms": np.array([r[0] for r in rows], dtype=float),
        "itl_ms": np.array([r[1] for r in rows], dtype=float),
        "ok": np.array([r[2] for r in rows], dtype=bool),
        "e2e_ms": np.arange(1, n + 1, dtype=float) * 100.0,
        "queue_ms": np.full(n, 10.0),
        "prompt_tokens": np.full(n, 100),
        "output_tokens": np.full(n, 20),
        "kv_hit": np.arange(n) % 2 == 0,
    }
    cols.update({k: np.asarray(v) for k, v in extra.items()})
    return cols


def gpu_cols(
    ts: list[int], util: list[float], qlen: list[float] | None = None, free: list[int] | None = None
) -> dict[str, np.ndarray]:
    n = len(ts)
    cols = {k: np.zeros(n) for k in GPU_COLUMNS}
    cols.update(
        ts_ms=np.array(ts),
        gpu_util=np.array(util),
        queue_len=np.array(qlen if qlen is not None else [1.0] * n),
        running=np.full(n, 4.0),
        mem_used_bytes=np.full(n, 10),
        mem_total_bytes=np.full(n, 80),
        kv_blocks_used=np.full(n, 30),
        kv_blocks_total=np.full(n, 100),
        largest_free_block_bytes=np.array(free if free is not None else [1000] * n),
    )
    return cols


@pytest.mark.parametrize(
    ("rows", "violations", "errors"),
    [
        ([(100.0, 20.0, True)], 0, 0),  # within both limits
        ([(500.0, 50.0, True)], 0, 0),  # exactly at the limits: not a violation (strict >)
        ([(501.0, 20.0, True)], 1, 0),  # TTFT over
        ([(100.0, 51.0, True)], 1, 0),  # ITL over
        ([(100.0, 20.0, False)], 1, 1),  # error status is a violation even if fast
        ([(900.0, 90.0, False)], 1, 1),  # several reasons count once
        ([(np.nan, np.nan, False)], 1, 1),  # failed before first token: error only
        ([(np.nan, 20.0, True)], 0, 0),  # unmeasured TTFT is not a latency violation
        ([(100.0, 20.0, True), (600.0, 20.0, True), (1.0, 1.0, False)], 2, 1),  # mixed batch
        ([], 0, 0),  # empty batch
    ],
)
def test_violation_and_error_counting(rows, violations, errors) -> None:
    agg = initialize()
    add_requests(agg, req_cols(rows), SLO)
    assert (agg.n_requests, agg.n_violations, agg.n_errors) == (len(rows), violations, errors)
    out = result(agg, window_s=10.0)
    assert out["violation_rate"] == (violations / len(rows) if rows else 0.0)
    assert out["error_rate"] == (errors / len(rows) if rows else 0.0)


def test_unfixable_violations_are_those_over_the_limit_without_their_wait() -> None:
    """TTFT limit 500 ms.  900 ms after a 500 ms wait would have made it on an idle fleet (fixable);
    900 ms after a 100 ms wait would not (unfixable); a failed request, an ITL miss, a request in time,
    an unmeasured TTFT and a miss whose wait was not measured (NaN) are never unfixable."""
    rows = [
        (900.0, 20.0, True),
        (900.0, 20.0, True),
        (900.0, 20.0, False),
        (100.0, 90.0, True),
        (400.0, 20.0, True),
        (np.nan, 20.0, True),
        (900.0, 20.0, True),
    ]
    queue = [500.0, 100.0, 0.0, 0.0, 0.0, 0.0, np.nan]
    agg = initialize()
    add_requests(agg, req_cols(rows, queue_ms=np.array(queue)), SLO)
    assert (agg.n_violations, agg.n_unfixable) == (5, 1)
    out = result(agg, window_s=10.0)
    assert out["unfixable_rate"] == 1 / 7 and out["queue_ms_mean"] == 600.0 / 7  # a NaN wait adds nothing
    both = merge(agg, agg)
    assert both.n_unfixable == 2
    assert WindowAggregate.from_dict(agg.to_dict()) == agg
    older = {k: v for k, v in agg.to_dict().items() if k != "n_unfixable"}  # a state saved before the field
    assert WindowAggregate.from_dict(older).n_unfixable == 0


def test_empty_window_result_is_json_null_not_nan() -> None:
    out = result(initialize(), window_s=10.0)
    for key in (
        "e2e_p50_ms",
        "e2e_p95_ms",
        "e2e_p99_ms",
        "ttft_p50_ms",
        "ttft_p95_ms",
        "ttft_p99_ms",
        "itl_p95_ms",
        "queue_ms_mean",
        "gpu_util_mean",
        "queue_len_mean",
        "largest_free_block_bytes_min",
    ):
        assert out[key] is None, key
    assert out["count"] == 0 and out["rate_rps"] == 0.0 and out["violation_rate"] == 0.0
    json.dumps(out, allow_nan=False)  # raises on NaN/inf


def test_result_values_against_numpy() -> None:
    rng = np.random.default_rng(7)
    n = 2_000
    cols = req_cols([(t, 20.0, True) for t in rng.lognormal(5.5, 0.6, n)])
    cols["e2e_ms"] = rng.lognormal(7.0, 0.8, n)
    agg = initialize()
    add_requests(agg, cols, SLO)
    out = result(agg, window_s=20.0)
    assert out["rate_rps"] == n / 20.0
    for q in (50, 95, 99):
        true = float(np.quantile(cols["e2e_ms"], q / 100, method="lower"))
        assert abs(out[f"e2e_p{q}_ms"] - true) <= 0.01 * true * (1 + 1e-9)
    assert out["violation_rate"] == pytest.approx(float((cols["ttft_ms"] > 500).mean()))
    assert out["kv_hit_rate"] == pytest.approx(0.5)
    assert out["queue_ms_mean"] == pytest.approx(10.0)
    assert out["prompt_tokens"] == 100 * n and out["output_tokens"] == 20 * n


@pytest.mark.parametrize(
    ("col", "value"),
    [
        ("ttft_ms", -1.0),  # negative latency
        ("e2e_ms", np.inf),  # infinite latency
        ("output_tokens", np.nan),  # NaN allowed only for latencies (the wait, queue_ms, is one)
        ("prompt_tokens", -5),  # negative count
    ],
)
def test_bad_request_batch_rejected_atomically(col: str, value: float) -> None:
    agg = initialize()
    cols = req_cols([(100.0, 20.0, True), (100.0, 20.0, True)])
    cols[col] = cols[col].astype(float)
    cols[col][1] = value
    with pytest.raises(ValueError, match=col):
        add_requests(agg, cols, SLO)
    assert agg == initialize()


def test_missing_and_ragged_columns() -> None:
    cols = req_cols([(1.0, 1.0, True)])
    del cols["kv_hit"]
    with pytest.raises(ValueError, match="kv_hit"):
        add_requests(initialize(), cols, SLO)
    cols = req_cols([(1.0, 1.0, True)], e2e_ms=[1.0, 2.0])
    with pytest.raises(ValueError, match="e2e_ms"):
        add_requests(initialize(), cols, SLO)


@pytest.mark.parametrize(
    ("samples", "ready", "starting"),
    [
        ([("n1", 1, "ready")], 1, 0),  # one ready node
        ([("n1", 1, "starting"), ("n1", 2, "ready")], 1, 0),  # latest state wins
        ([("n1", 2, "ready"), ("n1", 1, "starting")], 1, 0),  # ... regardless of row order
        ([("n1", 1, "starting"), ("n2", 1, "ready"), ("n3", 1, "draining")], 1, 1),
        ([("n1", 5, "ready"), ("n1", 6, "draining")], 0, 0),  # draining is neither
        ([], 0, 0),  # no GPU samples
    ],
)
def test_replicas_ready_and_starting(samples, ready, starting) -> None:
    agg = initialize()
    add_gpu(
        agg,
        gpu_cols([s[1] for s in samples], [0.5] * len(samples)),
        [s[0] for s in samples],
        [s[2] for s in samples],
    )
    out = result(agg, window_s=10.0)
    assert (out["replicas_ready"], out["replicas_starting"]) == (ready, starting)


def test_gpu_result_fields() -> None:
    agg = initialize()
    add_gpu(
        agg,
        gpu_cols([1, 2, 3], [0.2, 0.4, 0.9], qlen=[1.0, 7.0, 4.0], free=[500, 800, 300]),
        ["a", "b", "a"],
        ["ready"] * 3,
    )
    out = result(agg, window_s=10.0)
    assert out["gpu_util_mean"] == pytest.approx(0.5)
    assert out["queue_len_mean"] == pytest.approx(4.0) and out["queue_len_max"] == 7.0
    assert out["running_mean"] == 4.0
    assert out["largest_free_block_bytes_min"] == 300  # latest of a (300) vs b (800)
    assert (out["kv_blocks_used"], out["kv_blocks_total"]) == (60, 200)  # 2 nodes


def test_gpu_bad_inputs() -> None:
    with pytest.raises(ValueError, match="nodes/states"):
        add_gpu(initialize(), gpu_cols([1, 2], [0.1, 0.2]), ["a"], ["ready"])
    with pytest.raises(ValueError, match="gpu_util"):
        add_gpu(initialize(), gpu_cols([1], [np.nan]), ["a"], ["ready"])


def _node_window(seed: int, node: str) -> tuple[WindowAggregate, dict, dict]:
    rng = np.random.default_rng(seed)
    n = 50 + seed
    rows = [
        (float(t), float(i), bool(o))
        for t, i, o in zip(rng.lognormal(6, 1, n), rng.lognormal(3, 1, n), rng.random(n) > 0.05, strict=True)
    ]
    rq = req_cols(rows)
    gp = gpu_cols(list(range(seed, seed + 5)), list(rng.random(5)))
    agg = initialize()
    add_requests(agg, rq, SLO)
    add_gpu(agg, gp, [node] * 5, ["ready"] * 5)
    return agg, rq, gp


def test_merge_of_node_windows_equals_aggregate_of_union() -> None:
    a, rq_a, gp_a = _node_window(1, "n1")
    b, rq_b, gp_b = _node_window(2, "n2")
    zone = merge(a, b)
    union = initialize()
    add_requests(union, {k: np.concatenate([rq_a[k], rq_b[k]]) for k in rq_a}, SLO)
    add_gpu(
        union,
        {k: np.concatenate([gp_a[k], gp_b[k]]) for k in gp_a},
        ["n1"] * 5 + ["n2"] * 5,
        ["ready"] * 10,
    )
    ra, ru = result(zone, 10.0), result(union, 10.0)
    assert ra.keys() == ru.keys()
    for key in ra:
        assert ra[key] == pytest.approx(ru[key]), key
    assert zone.e2e.bucket_counts() == union.e2e.bucket_counts()
    assert zone.nodes == union.nodes
    assert a.n_requests == 51  # inputs untouched


def test_merge_keeps_latest_node_snapshot() -> None:
    old, new = initialize(), initialize()
    add_gpu(old, gpu_cols([10], [0.1]), ["n1"], ["starting"])
    add_gpu(new, gpu_cols([20], [0.1]), ["n1"], ["ready"])
    assert merge(old, new).nodes["n1"].state == "ready"
    assert merge(new, old).nodes["n1"].state == "ready"


counts = st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(0, 3))


def _agg_from(spec: tuple[int, int, int]) -> WindowAggregate:
    n_ok, n_slow, n_err = spec
    rows = [(10.0, 1.0, True)] * n_ok + [(900.0, 1.0, True)] * n_slow + [(10.0, 1.0, False)] * n_err
    agg = initialize()
    add_requests(agg, req_cols(rows), SLO)
    add_gpu(
        agg,
        gpu_cols(list(range(n_ok)), [0.5] * n_ok),
        [f"n{i % 3}" for i in range(n_ok)],
        ["ready"] * n_ok,
    )
    return agg


def _counts(agg: WindowAggregate) -> tuple:
    return (
        agg.n_requests,
        agg.n_violations,
        agg.n_errors,
        agg.n_kv_hits,
        agg.n_gpu_samples,
        agg.e2e.bucket_counts(),
        agg.ttft.count,
        agg.nodes,
    )


@settings(max_examples=100, deadline=None)
@given(counts, counts, counts)
def test_merge_is_associative_and_commutative_on_counts(x, y, z) -> None:
    a, b, c = _agg_from(x), _agg_from(y), _agg_from(z)
    assert _counts(merge(a, b)) == _counts(merge(b, a))
    assert _counts(merge(merge(a, b), c)) == _counts(merge(a, merge(b, c)))


def test_aggregate_round_trips() -> None:
    agg, _, _ = _node_window(3, "n9")
    wire = json.loads(json.dumps(agg.to_dict(), allow_nan=False))
    assert WindowAggregate.from_dict(wire) == agg
    assert pickle.loads(pickle.dumps(agg)) == agg


# ---------------------------------------- agent signals (docs/model.md §15 (agents))
def agent_cols(signals: list[tuple[float, float, float] | None], paths: list[int | None]) -> dict[str, Any]:
    """Request columns whose rows carry agent signals (None: not carried) and paths."""
    n = len(signals)
    rows = [s if s is not None else (np.nan, np.nan, np.nan) for s in signals]
    return req_cols(
        [(10.0, 1.0, True)] * n,
        **{name: np.array([r[i] for r in rows], dtype=float) for i, name in enumerate(AGENT_COLUMNS[:3])},
        agent_path=np.array([np.nan if p is None else p for p in paths], dtype=float),
    )


@pytest.mark.parametrize(
    ("signals", "paths", "n", "means", "counts"),
    [
        ([(0.9, 0.9, 0.2)], [0], 1, (0.9, 0.9, 0.2), (1, 0, 0)),  # one RAG turn
        ([(0.2, 0.5, 0.8), (0.4, 0.1, 0.6)], [1, 2], 2, (0.3, 0.3, 0.7), (0, 1, 1)),  # means of two
        ([None, (1.0, 0.0, 0.5)], [None, None], 1, (1.0, 0.0, 0.5), (0, 0, 0)),  # one carries, no paths
        ([None, None], [2, 2], 0, (None, None, None), (0, 0, 2)),  # paths without signals
        ([None], [None], 0, (None, None, None), (0, 0, 0)),  # an ordinary request
    ],
)
def test_agent_signals_are_counted_and_averaged(signals, paths, n, means, counts) -> None:
    agg = initialize()
    add_requests(agg, agent_cols(signals, paths), SLO)
    r = result(agg, 10.0)
    assert r["agent_signals_n"] == n
    for name, want in zip(AGENT_COLUMNS[:3], means, strict=True):
        assert r[f"{name}_mean"] == (None if want is None else pytest.approx(want, abs=1e-6)), name
    assert r["agent_path_counts"] == dict(zip(AGENT_PATHS, counts, strict=True))


def test_a_batch_without_agent_columns_leaves_the_agent_fields_empty() -> None:
    agg = initialize()
    add_requests(agg, req_cols([(10.0, 1.0, True)] * 3), SLO)
    assert result(agg, 10.0)["agent_signals_n"] == 0 and agg.agent_stability_micro == 0


@pytest.mark.parametrize(
    ("cols", "match"),
    [
        (
            {"agent_stability": [0.5], "agent_rag_score": [np.nan], "agent_tool_conf": [0.5]},
            "carried together",
        ),  # part of the signals
        ({"agent_stability": [0.5]}, "carried together"),  # a signal column alone
        ({"agent_stability": [1.5], "agent_rag_score": [0.5], "agent_tool_conf": [0.5]}, r"\[0, 1\]"),
        ({"agent_stability": [0.5], "agent_rag_score": [-0.1], "agent_tool_conf": [0.5]}, r"\[0, 1\]"),
        ({"agent_path": [3.0]}, "agent_path"),  # no such path
        ({"agent_path": [0.5]}, "agent_path"),  # not an index
        ({"agent_path": [0.0, 1.0]}, "length"),  # ragged
    ],
)
def test_bad_agent_columns_reject_the_batch(cols: dict[str, list[float]], match: str) -> None:
    agg = initialize()
    with pytest.raises(ValueError, match=match):
        add_requests(agg, req_cols([(10.0, 1.0, True)], **cols), SLO)
    assert agg == initialize()  # all or nothing


_signal = st.floats(0.0, 1.0)
agent_rows = st.lists(
    st.tuples(st.one_of(st.none(), st.tuples(_signal, _signal, _signal)), st.one_of(st.none(), st.integers(0, 2))),
    max_size=6,
)


def _agent_agg(rows: list[tuple[Any, Any]]) -> WindowAggregate:
    agg = initialize()
    add_requests(agg, agent_cols([s for s, _ in rows], [p for _, p in rows]), SLO)
    return agg


@settings(max_examples=100, deadline=None)
@given(agent_rows, agent_rows, agent_rows)
def test_agent_merge_is_exactly_associative_commutative_and_equals_the_union(x, y, z) -> None:
    def fields(agg: WindowAggregate) -> dict[str, Any]:
        return {k: v for k, v in agg.to_dict().items() if k.startswith(("n_agent", "agent_", "n_path_"))}

    a, b, c = _agent_agg(x), _agent_agg(y), _agent_agg(z)
    assert fields(merge(a, b)) == fields(merge(b, a))
    assert fields(merge(merge(a, b), c)) == fields(merge(a, merge(b, c)))
    assert fields(merge(merge(a, b), c)) == fields(_agent_agg(x + y + z))  # sums in millionths: exact
    assert len(fields(a)) == 7


def test_agent_fields_round_trip_and_old_snapshots_load() -> None:
    agg = _agent_agg([((0.9, 0.9, 0.2), 0), ((0.1, 0.3, 0.7), 1), (None, 2)])
    wire = json.loads(json.dumps(agg.to_dict(), allow_nan=False))
    assert WindowAggregate.from_dict(wire) == agg
    old = {k: v for k, v in wire.items() if not k.startswith(("n_agent", "agent_", "n_path_"))}
    assert len(old) == len(wire) - 7  # a dict written before the agent fields existed
    loaded = WindowAggregate.from_dict(old)
    assert loaded.n_agent_signals == 0 and loaded.n_path_llm == 0 and loaded.n_requests == agg.n_requests


# ----------------------------------------------------------------- windows
@pytest.mark.parametrize(
    ("ts", "size", "start"),
    [
        (0, 1000, 0),  # on a boundary
        (999, 1000, 0),  # last ms of the first window
        (1000, 1000, 1000),  # next boundary
        (-1, 1000, -1000),  # before the epoch floors down, not toward zero
        (1_717_000_012_345, 10_000, 1_717_000_010_000),  # real epoch-ms
    ],
)
def test_window_start_ms(ts: int, size: int, start: int) -> None:
    assert window_start_ms(ts, size) == start
    assert window_start_ms(np.array([ts]), size).tolist() == [start]


def test_window_start_rejects_bad_size() -> None:
    with pytest.raises(ParameterError, match="size_ms"):
        window_start_ms(5, 0)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"size_ms": 0}, "size_ms"), ({"size_ms": 1000, "lateness_ms": -1}, "lateness_ms")],
)
def test_tracker_parameter_errors(kwargs, name) -> None:
    with pytest.raises(ParameterError, match=name):
        WindowTracker(**kwargs)


def test_slo_spec_validation() -> None:
    with pytest.raises(ParameterError, match="itl_slo_ms"):
        SloSpec(ttft_slo_ms=1.0, itl_slo_ms=0.0)


def test_tracker_closes_after_lateness_in_start_then_key_order() -> None:
    t = WindowTracker(size_ms=1000, lateness_ms=500)
    for key, ts in [(("b",), 1100), (("a",), 1200), (("a",), 100), (("b",), 2100)]:
        t.observe(ts)
        t.get(key, window_start_ms(ts, 1000)).n_requests += 1
    assert t.open_count == 4
    # watermark 2100: [0,1000) is due (1000 + 500 <= 2100), [1000,2000) is not (2500 > 2100)
    assert [(k, s) for k, s, _ in t.close_due()] == [(("a",), 0)]
    t.observe(2499)
    assert t.close_due() == []  # one ms short of 2500
    t.observe(2500)
    assert [(k, s) for k, s, _ in t.close_due()] == [(("a",), 1000), (("b",), 1000)]
    assert t.open_count == 1
    # processing-time flush closes the rest without new events
    assert [(k, s) for k, s, _ in t.close_due(now_ms=3500)] == [(("b",), 2000)]
    assert t.open_count == 0


@pytest.mark.parametrize(
    ("ts", "late"),
    [
        (999, True),  # window [0,1000) closed
        (1000, True),  # window [1000,2000) closed too (horizon 2000)
        (2000, False),  # window [2000,3000) still open
        (2600, False),  # within lateness of the watermark
    ],
)
def test_tracker_reports_late_records_never_merges_them(ts: int, late: bool) -> None:
    t = WindowTracker(size_ms=1000, lateness_ms=500)
    t.get(("z",), 1000)
    t.observe(2500)
    closed = t.close_due()
    assert len(closed) == 1
    start = window_start_ms(ts, 1000)
    assert t.is_late(start) is late
    if late:
        with pytest.raises(LateWindowError, match=str(start)):
            t.get(("z",), start)
        assert t.open_count == 0
    else:
        t.get(("z",), start)
        assert t.open_count == 1


def test_tracker_late_even_without_open_windows_and_unaligned_start() -> None:
    t = WindowTracker(size_ms=1000)
    t.observe(5000)
    assert t.close_due() == []
    assert t.is_late(3000) and not t.is_late(5000)
    with pytest.raises(ValueError, match="aligned"):
        t.get(("k",), 5001)


def test_tracker_round_trips() -> None:
    t = WindowTracker(size_ms=1000, lateness_ms=200)
    t.observe(1500)
    add_requests(t.get(("az-a", "n1"), 1000), req_cols([(1.0, 1.0, True)]), SLO)
    t.get(("az-b", "n2"), 0)
    t.observe(1300)
    t.close_due()
    wire = json.loads(json.dumps(t.to_dict(), allow_nan=False))
    back = WindowTracker.from_dict(wire)
    assert back.to_dict() == t.to_dict()
    assert back.get(("az-a", "n1"), 1000).n_requests == 1
    again = pickle.loads(pickle.dumps(t))
    assert again.to_dict() == t.to_dict() and again.is_late(0)


def test_the_latest_samples_free_block_histogram_is_kept_and_survives_serialisation() -> None:
    agg = initialize()
    cols = {k: np.array([0, 0]) for k in GPU_COLUMNS}
    cols["ts_ms"] = np.array([1, 2])
    add_gpu(agg, cols, ["n1", "n1"], ["ready", "ready"], [[5, 0, 1], [1, 2, 0]])
    assert agg.nodes["n1"].free_block_hist == (1, 2, 0)
    back = WindowAggregate.from_dict(json.loads(json.dumps(agg.to_dict())))
    assert back == agg
    old = agg.to_dict()
    del old["nodes"]["n1"]["free_block_hist"]  # an aggregate saved before the field existed
    assert WindowAggregate.from_dict(old).nodes["n1"].free_block_hist == ()
    with pytest.raises(ValueError, match="free_block_hist"):
        add_gpu(initialize(), cols, ["n1", "n1"], ["ready", "ready"], [[1], [-1]])


# -- stage latencies (issue 36 item 6) ------------------------------------------------------------
def _stage_cols(ttft: list[float], queue: list[float], **stages: list[float]) -> dict[str, Any]:
    n = len(ttft)
    cols: dict[str, Any] = {
        "ttft_ms": np.array(ttft),
        "itl_ms": np.full(n, 10.0),
        "e2e_ms": np.array(ttft) + 100.0,
        "queue_ms": np.array(queue),
        "prompt_tokens": np.ones(n),
        "output_tokens": np.ones(n),
        "kv_hit": np.zeros(n, bool),
        "ok": np.ones(n, bool),
    }
    return cols | {k: np.array(v) for k, v in stages.items()}


def test_a_miss_the_network_explains_counts_as_a_stage_share_of_the_unfixable() -> None:
    """TTFT limit 500: (a) 900 = 600 network + 300 prefill, no wait: the network explains it; (b) 900 with a
    400 wait: queueing, fixable; (c) 900 = 100 network + 800 prefill: unfixable, the prefill's; (d) network not
    measured (NaN): unfixable, not explained; (e) within the limit."""
    agg = initialize()
    nan = math.nan
    cols = _stage_cols(
        [900.0, 900.0, 900.0, 900.0, 200.0],
        [0.0, 400.0, 0.0, 0.0, 0.0],
        network_ms=[600.0, 600.0, 100.0, nan, 50.0],
        preprocess_ms=[0.0, 0.0, 0.0, nan, 1.0],
        decode_ms=[40.0, 40.0, 40.0, 40.0, nan],
    )
    add_requests(agg, cols, SloSpec(500.0, 50.0))
    assert (agg.n_violations, agg.n_unfixable, agg.n_stage_unfixable) == (4, 3, 1)
    assert (agg.network.count, agg.preprocess.count, agg.decode.count) == (4, 4, 4)
    out = result(agg, 10.0)
    assert out["stage_unfixable_rate"] == 0.2 and out["unfixable_rate"] == 0.6
    assert out["network_p95_ms"] == pytest.approx(600.0, rel=0.01)
    assert out["decode_p50_ms"] == pytest.approx(40.0, rel=0.01)


def test_stage_latencies_merge_and_an_older_snapshot_restores_without_them() -> None:
    a, b = initialize(), initialize()
    add_requests(a, _stage_cols([900.0], [0.0], network_ms=[700.0]), SloSpec(500.0, 50.0))
    add_requests(b, _stage_cols([100.0, 100.0], [0.0, 0.0], preprocess_ms=[3.0, 4.0]), SloSpec(500.0, 50.0))
    m = merge(a, b)
    assert (m.n_stage_unfixable, m.network.count, m.preprocess.count, m.decode.count) == (1, 1, 2, 0)
    assert WindowAggregate.from_dict(m.to_dict()) == m
    old = m.to_dict()
    for k in ("network", "preprocess", "decode", "n_stage_unfixable"):
        del old[k]  # a snapshot written before the stage latencies
    restored = WindowAggregate.from_dict(old)
    assert (restored.n_stage_unfixable, restored.network.count, restored.decode.count) == (0, 0, 0)
    assert result(restored, 1.0)["network_p95_ms"] is None


@pytest.mark.parametrize("bad", [-1.0, math.inf])
def test_a_bad_stage_latency_rejects_the_batch(bad: float) -> None:
    agg = initialize()
    with pytest.raises(ValueError, match="^network_ms:"):
        add_requests(agg, _stage_cols([100.0], [0.0], network_ms=[bad]), SloSpec(500.0, 50.0))
    assert agg.n_requests == 0
