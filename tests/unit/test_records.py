"""The telemetry record validator: a table of records and the reason each gets,
and a property check of the fast validator against a plain reading of the
field tables."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytest
from governor_telemetry.records import (
    FIELDS_BY_KIND,
    GPU_STATES,
    INT_MAX,
    REQUEST_STATUSES,
    SUPPORTED_VERSIONS,
    EnvelopeError,
    decode_envelope,
    encode_envelope,
    validate_record,
)
from hypothesis import given, settings
from hypothesis import strategies as st

REQ: dict[str, Any] = {
    "kind": "request", "request_id": "r1", "ts_ms": 1_700_000_000_000, "model": "m", "zone": "z",
    "node": "z/n0", "ttft_ms": 120.0, "itl_ms": 40.0, "e2e_ms": 4120.0, "queue_ms": 10.0,
    "prompt_tokens": 1000, "output_tokens": 100, "status": "ok",
}
AGENT: dict[str, Any] = {"agent_stability": 0.9, "agent_rag_score": 0.9, "agent_tool_conf": 0.2, "agent_path": "rag"}
GPU: dict[str, Any] = {
    "kind": "gpu", "ts_ms": 1_700_000_000_000, "model": "m", "zone": "z", "node": "z/n0",
    "state": "ready", "gpu_util": 0.5, "mem_used_bytes": 1, "mem_total_bytes": 2,
}


def _without(rec: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if k != name}


VALID = [
    REQ,
    GPU,
    {**REQ, "schema_version": 1},
    {**REQ, "ttft_ms": 0, "e2e_ms": 0},                      # ints in float fields
    {**REQ, "ts_ms": 1_700_000_000_000.0},                   # integral float in an int field
    {**REQ, "itl_ms": None, "queue_ms": None},               # optional fields given as null
    {**REQ, "kv_hit": True, "kv_hit_blocks": 3, "request_class": "chat", "arrival_ms": 5},
    {**REQ, "status": "error", "e2e_ms": 120.0 - 1e-7},      # e2e within rounding of ttft
    {**GPU, "gpu_util": 0, "state": "starting"},
    {**GPU, "gpu_util": 1.0, "kv_blocks_used": 5, "kv_blocks_total": 0},
    {**GPU, "kv_blocks_used": None, "kv_blocks_total": 4},
    {**REQ, "prompt_tokens": INT_MAX},
    {**REQ, "e2e_ms": 1e19},                                 # a float latency may exceed int64
    {**REQ, **AGENT},                                        # a mixed-agent turn (seed 4.1)
    {**REQ, "agent_stability": 0, "agent_rag_score": 1, "agent_tool_conf": 0.0},  # ints, the bounds
    {**REQ, "agent_path": "llm"},                            # a path without the signals
    {**REQ, "agent_stability": 0.5, "agent_rag_score": 0.5, "agent_tool_conf": 0.5},  # signals, no path
]

INVALID = [
    ([1, 2], "record must be an object, got list"),
    ("x", "record must be an object, got str"),
    ({**REQ, "schema_version": 2}, "unsupported schema_version 2"),
    ({**REQ, "schema_version": [1]}, "unsupported schema_version [1]"),
    ({**REQ, "kind": "batch"}, "unknown record kind 'batch'"),
    ({**REQ, "kind": ["request"]}, "unknown record kind ['request']"),
    (_without(REQ, "kind"), "unknown record kind None"),
    (_without(REQ, "request_id"), "missing field 'request_id'"),
    ({**REQ, "zone": None}, "missing field 'zone'"),
    ({**REQ, "zone": ""}, "field 'zone' is empty"),
    ({**REQ, "zone": 3}, "field 'zone' must be str, got int"),
    ({**REQ, "ts_ms": "1"}, "field 'ts_ms' must be int, got str"),
    ({**REQ, "ts_ms": 1.5}, "field 'ts_ms' must be int, got float"),
    ({**REQ, "ts_ms": True}, "field 'ts_ms' must be int, got bool"),
    ({**REQ, "ts_ms": -1}, "field 'ts_ms'=-1 is below 0"),
    ({**REQ, "ts_ms": -5.0}, "field 'ts_ms'=-5.0 is below 0"),
    ({**REQ, "ts_ms": 2**63}, f"field 'ts_ms'={2**63} exceeds {INT_MAX}"),
    ({**REQ, "ts_ms": 1e19}, f"field 'ts_ms'=1e+19 exceeds {INT_MAX}"),
    ({**REQ, "ttft_ms": -0.5}, "field 'ttft_ms'=-0.5 is below 0"),
    ({**REQ, "ttft_ms": math.nan}, "field 'ttft_ms' is not finite"),
    ({**REQ, "ttft_ms": math.inf}, "field 'ttft_ms' is not finite"),
    ({**REQ, "ttft_ms": False}, "field 'ttft_ms' must be int, got bool"),
    ({**REQ, "ttft_ms": "1"}, "field 'ttft_ms' must be int/float, got str"),
    ({**REQ, "ttft_ms": 10**30}, f"field 'ttft_ms'={10**30} exceeds {INT_MAX}"),
    ({**REQ, "queue_ms": -1}, "field 'queue_ms'=-1 is below 0"),
    ({**REQ, "kv_hit": 1}, "field 'kv_hit' must be bool, got int"),
    ({**REQ, "prompt_tokens": 1.5}, "field 'prompt_tokens' must be int, got float"),
    ({**REQ, "status": "meh"}, "status 'meh' not in ['error', 'ok', 'timeout']"),
    ({**REQ, "e2e_ms": 100.0}, "e2e_ms (100.0) is smaller than ttft_ms (120.0)"),
    (_without(GPU, "state"), "missing field 'state'"),
    ({**GPU, "state": "gone"}, "state 'gone' not in ['draining', 'ready', 'starting']"),
    ({**GPU, "gpu_util": 1.5}, "gpu_util=1.5 outside [0, 1]"),
    ({**GPU, "mem_used_bytes": 3}, "mem_used_bytes exceeds mem_total_bytes"),
    ({**GPU, "kv_blocks_used": 5, "kv_blocks_total": 4}, "kv_blocks_used exceeds kv_blocks_total"),
    ({**GPU, "mem_total_bytes": 2.5}, "field 'mem_total_bytes' must be int, got float"),
    # agent fields: a signal above 1 (the value after the colon keeps the counter label bounded)
    ({**REQ, **AGENT, "agent_rag_score": 1.2}, "field 'agent_rag_score' outside [0, 1]: 1.2"),
    ({**REQ, **AGENT, "agent_tool_conf": -0.1}, "field 'agent_tool_conf'=-0.1 is below 0"),
    ({**REQ, **AGENT, "agent_stability": math.nan}, "field 'agent_stability' is not finite"),
    ({**REQ, **AGENT, "agent_stability": "high"}, "field 'agent_stability' must be int/float, got str"),
    # only part of the signals: the 4.1 weights need all three
    ({**REQ, "agent_stability": 0.9}, "agent signals incomplete: 'agent_rag_score' missing "
                                      "(send all three or none)"),
    (_without({**REQ, **AGENT}, "agent_tool_conf"), "agent signals incomplete: 'agent_tool_conf' missing "
                                                    "(send all three or none)"),
    ({**REQ, **AGENT, "agent_path": "search"}, "agent_path not in ['llm', 'rag', 'tool']: 'search'"),
    ({**REQ, **AGENT, "agent_path": ""}, "field 'agent_path' is empty"),
]


@pytest.mark.parametrize("rec", VALID)
def test_valid_records(rec: dict[str, Any]) -> None:
    assert validate_record(rec) is None


@pytest.mark.parametrize(("rec", "reason"), INVALID)
def test_invalid_records_and_their_reasons(rec: Any, reason: str) -> None:
    assert validate_record(rec) == reason


def _reference(rec: Any) -> str | None:
    """The field tables read one field at a time, the plain way."""
    if not isinstance(rec, Mapping):
        return f"record must be an object, got {type(rec).__name__}"
    version = rec.get("schema_version", 1)
    try:
        supported = version in SUPPORTED_VERSIONS
    except TypeError:
        supported = False
    if not supported:
        return f"unsupported schema_version {version!r}"
    kind = rec.get("kind")
    if kind not in ("request", "gpu"):
        return f"unknown record kind {kind!r}"
    for name, (types, required, minimum) in FIELDS_BY_KIND[kind].items():
        value = rec.get(name)
        if value is None:
            if required:
                return f"missing field {name!r}"
            continue
        if isinstance(value, bool) and bool not in types:
            return f"field {name!r} must be {types[0].__name__}, got bool"
        integral = types == (int,) and isinstance(value, float) and value.is_integer()
        if not isinstance(value, types) and not integral:
            return f"field {name!r} must be {'/'.join(t.__name__ for t in types)}, got {type(value).__name__}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"field {name!r} is not finite"
        if isinstance(value, str) and not value:
            return f"field {name!r} is empty"
        if minimum is not None and value < minimum:
            return f"field {name!r}={value} is below {minimum}"
        if (types == (int,) or type(value) is int) and value > INT_MAX:
            return f"field {name!r}={value} exceeds {INT_MAX}"
    if kind == "request":
        if rec["status"] not in REQUEST_STATUSES:
            return f"status {rec['status']!r} not in {sorted(REQUEST_STATUSES)}"
        if rec["e2e_ms"] + 1e-6 < rec["ttft_ms"]:
            return f"e2e_ms ({rec['e2e_ms']}) is smaller than ttft_ms ({rec['ttft_ms']})"
        signals = ("agent_stability", "agent_rag_score", "agent_tool_conf")
        if any(rec.get(name) is not None for name in signals):
            for name in signals:
                if rec.get(name) is None:
                    return f"agent signals incomplete: {name!r} missing (send all three or none)"
                if rec[name] > 1.0:
                    return f"field {name!r} outside [0, 1]: {rec[name]}"
        if rec.get("agent_path") not in (None, "rag", "tool", "llm"):
            return f"agent_path not in ['llm', 'rag', 'tool']: {rec['agent_path']!r}"
        return None
    if rec["state"] not in GPU_STATES:
        return f"state {rec['state']!r} not in {sorted(GPU_STATES)}"
    if not 0.0 <= rec["gpu_util"] <= 1.0:
        return f"gpu_util={rec['gpu_util']} outside [0, 1]"
    if rec["mem_used_bytes"] > rec["mem_total_bytes"]:
        return "mem_used_bytes exceeds mem_total_bytes"
    if (rec.get("kv_blocks_used") or 0) > (rec.get("kv_blocks_total") or 0) > 0:
        return "kv_blocks_used exceeds kv_blocks_total"
    if (rec.get("fragmentation_ratio") or 0.0) > 1.0:
        return f"fragmentation_ratio={rec['fragmentation_ratio']} above 1"
    hist = rec.get("free_block_hist")
    if hist is not None and not (isinstance(hist, list) and all(
            type(v) is int and 0 <= v <= INT_MAX for v in hist)):
        return "free_block_hist must be a list of non-negative ints"
    return None


_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.integers(2**62, 2**64),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1.0, -2.0, 0.5, 1e12, 1e19]),
    st.sampled_from(["", "x", "ok", "error", "ready", "draining", "request", "gpu", "rag", "llm"]),
    st.lists(st.integers(), max_size=1),
)


@settings(max_examples=400, deadline=None)
@given(base=st.sampled_from([REQ, GPU]),
       changes=st.dictionaries(st.sampled_from(sorted({*FIELDS_BY_KIND["request"], *FIELDS_BY_KIND["gpu"],
                                                       "kind", "schema_version"})), _VALUES, max_size=3),
       dropped=st.sets(st.sampled_from(sorted(FIELDS_BY_KIND["gpu"])), max_size=2))
def test_fast_validator_agrees_with_the_tables(base: dict[str, Any], changes: dict[str, Any],
                                               dropped: set[str]) -> None:
    rec = {k: v for k, v in {**base, **changes}.items() if k not in dropped}
    assert validate_record(rec) == _reference(rec)


def test_envelope_round_trip_and_errors() -> None:
    assert decode_envelope(encode_envelope([REQ, GPU], "n", 1)) == [REQ, GPU]
    assert decode_envelope(b'{"kind": "gpu"}') == [{"kind": "gpu"}]
    for raw, reason in ((b"{", "not JSON"), (b"[]", "must be a JSON object"),
                        (b'{"kind": ["batch"]}', "unknown message kind"),
                        (b'{"kind": "batch", "schema_version": [1], "records": []}', "schema_version"),
                        (b'{"kind": "batch", "schema_version": 1, "records": 3}', "must be a list")):
        with pytest.raises(EnvelopeError, match=reason):
            decode_envelope(raw)


def test_kv_allocator_fields_of_gpu_records_are_validated() -> None:
    from governor_telemetry.records import validate_record

    from sim.fleet import Fleet, FleetConfig
    from sim.perf_model import PerfModel

    fleet = Fleet(FleetConfig(models={"m": PerfModel.from_splitwise()}, initial_replicas=1,
                              kv_allocator="contiguous"), epoch_ms0=0)
    (snap,) = fleet.gpu_snapshot(0.0)
    assert "fragmentation_ratio" in snap and "free_block_hist" in snap
    assert validate_record(snap) is None  # what the simulator sends is valid
    assert "fragmentation_ratio" in validate_record({**snap, "fragmentation_ratio": 1.5})
    assert "free_block_hist" in validate_record({**snap, "free_block_hist": [1, -2]})
    assert "kv_generation" in validate_record({**snap, "kv_generation": "new"})
