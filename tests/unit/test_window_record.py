"""The typed window record (controllers.window_record): what decodes, what is refused
(WindowRecordError naming the field; the control loop dead-letters it), the round trip
through the metrics topic's JSON, and that every window the real pipeline emits decodes."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

import orjson
import pytest
from governor_telemetry.records import encode_envelope
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from controllers.window_record import WindowRecord, WindowRecordError, decode_window
from core.settings import Settings
from core.vocab import AGENT_PATHS
from loop.pipeline import TelemetryProcessor

pytestmark = pytest.mark.timeout(120)

END = 20_000
ZONE = {"scope": "zone", "model": "m", "zone": "az-a", "window_end_ms": END}
NODE = {**ZONE, "scope": "node", "node": "az-a/m/r0"}
FIELDS = [f.name for f in dataclasses.fields(WindowRecord)]


def _without(base: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in base.items() if k != key}


# (id, object, the field its error must name)
MALFORMED: list[tuple[str, Any, str]] = [
    # a missing or empty header
    ("no scope", _without(ZONE, "scope"), "scope"),
    ("no model", _without(ZONE, "model"), "model"),
    ("no zone", _without(ZONE, "zone"), "zone"),
    ("no window end", _without(ZONE, "window_end_ms"), "window_end_ms"),
    ("null model", {**ZONE, "model": None}, "model"),
    ("empty zone", {**ZONE, "zone": ""}, "zone"),
    ("null window end", {**ZONE, "window_end_ms": None}, "window_end_ms"),
    ("unknown scope", {**ZONE, "scope": "cluster"}, "scope"),
    ("not a window", {**ZONE, "kind": "event"}, "kind"),
    ("another schema version", {**ZONE, "schema_version": 2}, "schema_version"),
    ("bool schema version", {**ZONE, "schema_version": True}, "schema_version"),
    # wrong types
    ("model not a string", {**ZONE, "model": 5}, "model"),
    ("model too long", {**ZONE, "model": "m" * 257}, "model"),
    ("count a string", {**ZONE, "count": "3"}, "count"),
    ("count not an int", {**ZONE, "count": 1.5}, "count"),
    ("null count", {**ZONE, "count": None}, "count"),
    ("null violation rate", {**ZONE, "violation_rate": None}, "violation_rate"),
    ("rate a string", {**ZONE, "error_rate": "x"}, "error_rate"),
    ("quantile a list", {**ZONE, "ttft_p95_ms": [1.0]}, "ttft_p95_ms"),
    ("window end a string", {**ZONE, "window_end_ms": "10"}, "window_end_ms"),
    ("path counts a list", {**ZONE, "agent_path_counts": [1, 2]}, "agent_path_counts"),
    ("an unknown path", {**ZONE, "agent_path_counts": {"browse": 1}}, "agent_path_counts"),
    ("a negative path count", {**ZONE, "agent_path_counts": {"rag": -1}}, "agent_path_counts"),
    ("histogram a string", {**NODE, "free_block_hist": "1,2"}, "free_block_hist"),
    # bools are not counts
    ("bool count", {**ZONE, "count": True}, "count"),
    ("bool replicas", {**ZONE, "replicas_ready": False}, "replicas_ready"),
    ("bool generation", {**NODE, "kv_generation": True}, "kv_generation"),
    ("bool path count", {**ZONE, "agent_path_counts": {"rag": True}}, "agent_path_counts"),
    ("bool in the histogram", {**NODE, "free_block_hist": [1, True]}, "free_block_hist"),
    ("bool rate", {**ZONE, "rate_rps": True}, "rate_rps"),
    # negative, NaN, infinite, too large
    ("negative count", {**ZONE, "count": -1}, "count"),
    ("negative window end", {**ZONE, "window_end_ms": -5}, "window_end_ms"),
    ("negative quantile", {**ZONE, "ttft_p95_ms": -1.0}, "ttft_p95_ms"),
    ("negative rate", {**ZONE, "violation_rate": -0.1}, "violation_rate"),
    ("negative queue", {**ZONE, "queue_len_mean": -0.5}, "queue_len_mean"),
    ("negative in the histogram", {**NODE, "free_block_hist": [-1]}, "free_block_hist"),
    ("NaN rate", {**ZONE, "error_rate": math.nan}, "error_rate"),
    ("NaN quantile", {**ZONE, "ttft_p99_ms": math.nan}, "ttft_p99_ms"),
    ("NaN window length", {**ZONE, "window_s": math.nan}, "window_s"),
    ("NaN window end", {**ZONE, "window_end_ms": math.nan}, "window_end_ms"),
    ("infinite window end", {**ZONE, "window_end_ms": math.inf}, "window_end_ms"),
    ("infinite arrival rate", {**ZONE, "rate_rps": math.inf}, "rate_rps"),
    ("minus infinite quantile", {**ZONE, "e2e_p95_ms": -math.inf}, "e2e_p95_ms"),
    ("count past int64", {**ZONE, "count": 2**64}, "count"),
    ("window length past any window end", {**ZONE, "window_s": 1e306}, "window_s|window_start_ms"),
    # rates above 1
    ("violation rate above 1", {**ZONE, "violation_rate": 1.5}, "violation_rate"),
    ("error rate above 1", {**ZONE, "error_rate": 2.0}, "error_rate"),
    ("hit rate above 1", {**ZONE, "kv_hit_rate": 1.0001}, "kv_hit_rate"),
    ("utilisation above 1", {**ZONE, "gpu_util_mean": 1.2}, "gpu_util_mean"),
    ("agent mean above 1", {**ZONE, "agent_stability_mean": 1.2}, "agent_stability_mean"),
    ("fragmentation above 1", {**NODE, "fragmentation_ratio": 1.5}, "fragmentation_ratio"),
    # stage latencies (issue 36 item 6)
    ("negative network P95", {**ZONE, "network_p95_ms": -1.0}, "network_p95_ms"),
    ("infinite preprocess P50", {**ZONE, "preprocess_p50_ms": math.inf}, "preprocess_p50_ms"),
    ("decode P95 as text", {**ZONE, "decode_p95_ms": "12"}, "decode_p95_ms"),
    ("stage share above 1", {**ZONE, "stage_unfixable_rate": 1.5, "unfixable_rate": 1.0}, "stage_unfixable_rate"),
    (
        "stage share above the unfixable",
        {**ZONE, "stage_unfixable_rate": 0.3, "unfixable_rate": 0.2},
        "stage_unfixable_rate",
    ),
    ("null stage share", {**ZONE, "stage_unfixable_rate": None}, "stage_unfixable_rate"),
    # node windows, bounds, histogram size
    ("node window without a node", _without(NODE, "node"), "node"),
    ("node window with an empty node", {**NODE, "node": ""}, "node"),
    ("start after end", {**ZONE, "window_start_ms": END + 1}, "window_start_ms"),
    ("huge histogram", {**NODE, "free_block_hist": [1] * 65}, "free_block_hist"),
    # not an object at all
    ("null", None, "record"),
    ("a list", [ZONE], "record"),
    ("a string", "window", "record"),
    ("a number", 42, "record"),
]


@pytest.mark.parametrize(("obj", "field"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_a_malformed_record_raises_naming_the_field(obj: Any, field: str) -> None:
    with pytest.raises(WindowRecordError, match=rf"^({field}):") as exc:
        decode_window(obj)
    assert isinstance(exc.value, ValueError)


@pytest.mark.parametrize(("obj", "field"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_the_loop_dead_letters_a_malformed_record_with_the_field(obj: Any, field: str) -> None:
    from loop.control_loop import ControlLoop

    loop = ControlLoop(Settings(zones=("az-a",)))
    src = {"topic": "metrics", "partition": 0, "offset": 3}
    raw = obj if isinstance(obj, dict) else orjson.dumps(obj)  # a non-object arrives as JSON text
    rec, dl = loop.decode(raw, src, 7)
    assert rec is None and dl is not None
    assert re.match(rf"bad metrics record: ({field}):", dl["reason"]), dl["reason"]
    assert dl["source"] == src and dl["dead_lettered_ms"] == 7
    if isinstance(raw, dict):  # kept as is, or a cut-down copy when orjson cannot write it (an int past 64 bits)
        assert dl["record"] is raw or dl["truncated"]
    else:
        assert dl["record"] == orjson.loads(raw)
    orjson.dumps(dl)  # every dead letter can be produced


def test_a_record_from_before_the_stage_latencies_decodes_without_them() -> None:
    """An older worker's window (no stage fields, schema version 1) decodes: no stage latency, no stage share."""
    old = {**ZONE, "schema_version": 1, "count": 10, "violation_rate": 0.5, "unfixable_rate": 0.4}
    r = decode_window(old)
    assert r.stage_unfixable_rate == 0.0 and r.unfixable_rate == 0.4
    assert (r.network_p50_ms, r.network_p95_ms, r.preprocess_p95_ms, r.decode_p95_ms) == (None, None, None, None)
    new = decode_window({**old, "stage_unfixable_rate": 0.4, "network_p95_ms": 812.5, "decode_p50_ms": 0})
    assert (new.stage_unfixable_rate, new.network_p95_ms, new.decode_p50_ms) == (0.4, 812.5, 0.0)
    assert decode_window(new.to_dict()) == new


def test_a_header_alone_decodes_with_empty_defaults() -> None:
    r = decode_window(ZONE)
    assert (r.scope, r.model, r.zone, r.window_end_ms, r.node) == ("zone", "m", "az-a", END, None)
    assert (r.count, r.rate_rps, r.violation_rate, r.error_rate, r.replicas_ready) == (0, 0.0, 0.0, 0.0, 0)
    assert r.ttft_p95_ms is None and r.queue_len_mean is None and r.agent_stability_mean is None
    assert r.agent_path_counts == {} and r.free_block_hist is None and r.key == ("m", "az-a")
    assert r.window_start_ms == END  # no window length: an empty span at the end
    assert decode_window({**ZONE, "window_s": 10.0}).window_start_ms == END - 10_000
    assert decode_window({**ZONE, "window_s": 60.0}).window_start_ms == 0  # clamped, not negative
    assert decode_window({**ZONE, "node": "ignored"}).node is None  # a zone window has no node
    n = decode_window({**NODE, "free_block_hist": [3, 0, 1], "kv_generation": 5.0})
    assert n.node == "az-a/m/r0" and n.free_block_hist == (3, 0, 1) and n.kv_generation == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.count = 5  # type: ignore[misc]


FULL_ZONE = {
    **ZONE,
    "schema_version": 1,
    "kind": "window",
    "window_start_ms": END - 10_000,
    "window_s": 10.0,
    "ttft_slo_ms": 1000.0,
    "itl_slo_ms": 150.0,
    "emitted_ms": END + 5,
    "nodes": 3,
    "count": 120,
    "rate_rps": 12.0,
    "violation_rate": 0.25,
    "error_rate": 0.01,
    "kv_hit_rate": 0.5,
    "ttft_p50_ms": 200.0,
    "ttft_p95_ms": 800.0,
    "ttft_p99_ms": 900.0,
    "prompt_tokens": 1000,
    "output_tokens": 400,
    "queue_len_mean": 1.5,
    "gpu_util_mean": 0.7,
    "replicas_ready": 2,
    "replicas_starting": 1,
    "agent_signals_n": 4,
    "agent_stability_mean": 0.9,
    "agent_rag_score_mean": 0.8,
    "agent_tool_conf_mean": 0.2,
    "agent_path_counts": {"rag": 3, "llm": 1},
}
FULL_NODE = {
    **NODE,
    "window_s": 1.0,
    "largest_free_block_bytes": 4096,
    "fragmentation_ratio": 0.5,
    "kv_free_bytes": 8192,
    "kv_waiting_bytes": 1024,
    "kv_generation": 7,
    "free_block_hist": [2, 1, 0, 1],
}


@pytest.mark.parametrize("obj", [ZONE, NODE, FULL_ZONE, FULL_NODE], ids=["zone", "node", "full zone", "full node"])
def test_round_trip(obj: dict[str, Any]) -> None:
    r = decode_window(obj)
    assert decode_window(r.to_dict()) == r
    assert decode_window(orjson.loads(orjson.dumps(r.to_dict()))) == r  # through the topic's bytes
    d = r.to_dict()
    assert {k: d[k] for k in obj} == obj  # every field given, with its value


# -- properties ------------------------------------------------------------------------------

_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
JSON_LIKE = st.recursive(
    _leaf,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=16,
)
_number = (
    st.integers(min_value=-3, max_value=2**64)
    | st.floats()
    | st.floats(min_value=0.0, max_value=1.0)
    | st.sampled_from([0, 1, 0.5, 1.0000001, 2**63 - 1, 2**63, 1e306, -0.0])
)
_value = (
    _number
    | st.none()
    | st.booleans()
    | st.text(max_size=12)
    | st.lists(st.integers(min_value=-1, max_value=2**64) | st.booleans(), max_size=70)
    | st.dictionaries(st.sampled_from([*AGENT_PATHS, "browse"]), st.integers(min_value=-1, max_value=10) | _leaf)
    | JSON_LIKE
)
_good = st.integers(min_value=0, max_value=10**6) | st.floats(min_value=0.0, max_value=1.0) | st.none()
_DROP = object()  # an override that removes the field


def _apply(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = base | overrides
    return {k: v for k, v in out.items() if v is not _DROP}


# A valid header, then up to 10 of the real fields (and kind / schema_version) set to
# plausible values mostly, to anything JSON-like sometimes, or removed.
RECORD_LIKE = st.builds(
    _apply,
    st.fixed_dictionaries(
        {
            "scope": st.sampled_from(["zone", "node"]),
            "model": st.just("m"),
            "zone": st.just("az-a"),
            "window_end_ms": st.integers(min_value=0, max_value=2**45),
            "node": st.just("az-a/m/r0"),
        }
    ),
    st.dictionaries(
        st.sampled_from([*FIELDS, "kind", "schema_version"]),
        st.one_of(_good, _good, _good, _value, st.just(_DROP)),
        max_size=10,
    ),
)


RATES = ("gpu_util_mean", "fragmentation_ratio", "agent_stability_mean", "agent_rag_score_mean", "agent_tool_conf_mean")


def _decodes_or_refuses(obj: Any) -> WindowRecord | None:
    try:
        r = decode_window(obj)
    except WindowRecordError:
        return None
    # What decodes is a record a driver can rely on, and survives the topic's JSON.
    assert isinstance(r, WindowRecord) and r.scope in ("zone", "node") and (r.node is not None) == (r.scope == "node")
    assert 0 <= r.window_start_ms <= r.window_end_ms
    for f in dataclasses.fields(r):
        v = getattr(r, f.name)
        assert not isinstance(v, bool), f.name
        if isinstance(v, int | float):
            assert math.isfinite(v) and v >= 0, f.name
        if f.name.endswith("_rate") or f.name in RATES:
            assert v is None or v <= 1.0, f.name
    assert all(p in AGENT_PATHS and c >= 0 and not isinstance(c, bool) for p, c in r.agent_path_counts.items())
    assert r.free_block_hist is None or len(r.free_block_hist) <= 64
    assert decode_window(json.loads(json.dumps(r.to_dict(), allow_nan=False))) == r
    return r


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSON_LIKE)
def test_any_json_like_object_decodes_or_raises_window_record_error(obj: Any) -> None:
    _decodes_or_refuses(obj)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(RECORD_LIKE)
@example({**ZONE, "window_s": 1e306})  # end - window_s * 1000 overflows an int
@example({**FULL_NODE, "free_block_hist": [2**63]})
def test_any_record_shaped_object_decodes_or_raises_window_record_error(obj: dict[str, Any]) -> None:
    _decodes_or_refuses(obj)


# -- the real pipeline's windows --------------------------------------------------------------


def _pipeline_windows() -> list[dict[str, Any]]:
    from tests.unit.test_fleet import fragmented
    from tests.unit.test_pipeline import SETTINGS, T0, _traffic

    p = TelemetryProcessor(SETTINGS)
    windows: list[dict[str, Any]] = []
    for k, batch in enumerate(_traffic()):  # requests with agent fields, GPU samples, two zones
        res = p.process(encode_envelope(batch, "n", 0), {"topic": "t", "partition": 0, "offset": k}, 0)
        assert not res.dead_letters
        windows += p.close_due(None, 0)
    windows += p.close_due(T0 + 60_000, 0)
    _, g = fragmented()  # a simulated replica's GPU record: the KV allocator fields and histogram
    kv = TelemetryProcessor(Settings(window_s=1.0, lateness_s=0.0))
    assert kv.process(encode_envelope([g], "n", 0), {"topic": "t", "partition": 0, "offset": 0}, 0).valid == 1
    windows += kv.close_due(g["ts_ms"] + 10_000, 0)
    return windows


def test_every_window_the_pipeline_emits_decodes_to_the_same_values() -> None:
    windows = _pipeline_windows()
    assert {w["scope"] for w in windows} == {"zone", "node"}
    assert any(w["scope"] == "node" and w.get("free_block_hist") for w in windows)
    assert any(w["scope"] == "zone" and w["agent_signals_n"] for w in windows)
    for w in windows:
        r = decode_window(w)
        assert set(w) <= set(FIELDS) | {"kind", "schema_version"}, set(w) - set(FIELDS)  # nothing dropped
        d = r.to_dict()
        assert {k: d[k] for k in w} == w  # every field the pipeline wrote, with its value
        assert decode_window(orjson.loads(orjson.dumps(w))) == r
