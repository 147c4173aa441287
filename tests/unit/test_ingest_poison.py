"""Nothing a telemetry writer sends stops ingest (issue #31, item 1).

A record nested just under orjson's writer limit (254 levels) still gives an
encodable dead letter; a valid record at the 64-bit limits is dead-lettered by
its realistic bounds (and a window's sums saturate), so no window is refused
because of its own content.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from governor_telemetry.bounds import MAX_BYTES, MAX_COUNT, MAX_DURATION_MS, MAX_TOKENS
from governor_telemetry.columnar import encode_columns
from governor_telemetry.records import encode_envelope

from controllers.window_record import decode_window
from controllers.window_result import result
from controllers.windows import initialize
from core.settings import ModelSpec, Settings
from loop.control_loop import ControlLoop
from loop.deadletters import MAX_DEAD_LETTER_BYTES, dead_letter
from streams.metrics_export import WorkerMetrics

MODEL = "m"
NOW = 1_700_000_000_000
SRC = {"topic": "telemetry", "partition": 0, "offset": 7}


def _loop() -> ControlLoop:
    return ControlLoop(
        Settings(models=(ModelSpec(MODEL),), zones=("az-a",), window_s=1.0, lateness_s=0.5), WorkerMetrics()
    )


def _deep_request(depth: int) -> bytes:
    """A request record whose ``ttft_ms`` is ``depth`` nested lists (the issue's poison shape)."""
    head = b'{"kind":"request","request_id":"r","model":"m","zone":"az-a","ttft_ms":'
    return head + b"[" * depth + b"]" * depth + b"}"


def test_the_issues_547_byte_record_nested_253_deep_gives_an_encodable_dead_letter() -> None:
    raw = b'{"kind":"request","ttft_ms":' + b"[" * 253 + b"]" * 253 + b',"ts_ms":100}'
    assert len(raw) == 547
    res = _loop().ingest(raw, SRC, NOW)
    assert res.valid == 0 and len(res.dead_letters) == 1
    assert len(orjson.dumps(res.dead_letters[0])) <= MAX_DEAD_LETTER_BYTES


@pytest.mark.parametrize("depth", range(240, 261))
def test_every_dead_letter_of_a_record_nested_240_to_260_deep_encodes(depth: int) -> None:
    raw = _deep_request(depth)
    res = _loop().ingest(raw, SRC, NOW)  # ControlLoop.ingest: the bad envelope or the invalid record
    assert res.valid == 0 and len(res.dead_letters) == 1
    dl = res.dead_letters[0]
    assert dl["source"]["offset"] == 7
    assert len(orjson.dumps(dl)) <= MAX_DEAD_LETTER_BYTES
    # and dead_letter itself, on the parsed record (one level deeper inside the letter)
    rec: Any = orjson.loads(raw) if depth < 1024 else None
    assert len(orjson.dumps(dead_letter("r", SRC, rec, NOW))) <= MAX_DEAD_LETTER_BYTES


# -- records at the 64-bit limits --------------------------------------------------------


def _req(i: int, ts: int, **kw: Any) -> dict[str, Any]:
    rec = {"kind": "request", "request_id": f"r{i}", "ts_ms": ts, "model": MODEL, "zone": "az-a", "node": "n0"}
    return {**rec, "ttft_ms": 100.0, "e2e_ms": 500.0, "prompt_tokens": 100, "status": "ok", **kw}


def _encode(shape: str, records: list[dict[str, Any]]) -> list[bytes]:
    if shape == "bare":
        return [orjson.dumps(r) for r in records]
    if shape == "columns":
        return [encode_columns(records, "n0", NOW)]
    return [encode_envelope(records, "n0", NOW)]


@pytest.mark.parametrize("shape", ["bare", "batch", "columns"])
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("prompt_tokens", 2**63 - 1),  # the issue's record: one overflowed the window's sums
        ("output_tokens", 2**63 - 1),
        ("prompt_tokens", 2**31 + 1),
        ("e2e_ms", 1e308),
        ("itl_ms", 1e19),
        ("ts_ms", 2**63 - 1),
    ],
)
def test_a_record_past_its_realistic_bounds_is_dead_lettered_and_the_window_is_decided(
    shape: str, field: str, value: Any
) -> None:
    loop = _loop()
    ts = 5_000  # no wall clock (now < 2000): no future check, the bounds alone refuse
    good = [_req(i, ts + i) for i in range(5)]
    poison = _req(99, ts + 10, **{field: value})
    dead: list[dict[str, Any]] = []
    for k, raw in enumerate(_encode(shape, [*good, poison])):
        dead += loop.ingest(raw, {**SRC, "offset": k}, 0).dead_letters
    assert [d["kind"] for d in dead] == ["invalid record"] and field in dead[0]["reason"]
    assert "exceeds" in dead[0]["reason"]
    windows = loop.ingest(encode_envelope([_req(7, ts + 3_000)], "n0", 0), SRC, 0).windows
    zone = [w for w in windows if w["scope"] == "zone"]
    assert len(zone) == 1 and zone[0]["count"] == 5 and zone[0]["prompt_tokens"] == 500
    for w in windows:
        value_, headers = loop.sign_window(w)
        rec, dl = loop.decode(value_, SRC, 0, dict(headers))
        assert rec is not None, dl  # never refused because of its own content
        loop.decide(rec, 0)


def test_the_largest_valid_records_never_overflow_a_windows_sums() -> None:
    """Records at every realistic maximum, many of them and from the most nodes: the window decodes."""
    loop = ControlLoop(
        Settings(models=(ModelSpec(MODEL),), zones=("az-a",), window_s=1.0, lateness_s=0.5, max_nodes_per_window=8)
    )
    big = {"prompt_tokens": MAX_TOKENS, "output_tokens": MAX_TOKENS, "e2e_ms": float(MAX_DURATION_MS)}
    gpu = {"kind": "gpu", "ts_ms": 5_000, "model": MODEL, "zone": "az-a", "state": "ready", "gpu_util": 1.0}
    gpu |= {"mem_used_bytes": MAX_BYTES, "mem_total_bytes": MAX_BYTES, "largest_free_block_bytes": MAX_BYTES}
    gpu |= {"kv_blocks_used": MAX_COUNT, "kv_blocks_total": MAX_COUNT, "queue_len": MAX_COUNT, "running": MAX_COUNT}
    gpu |= {"kv_free_bytes": MAX_BYTES, "kv_waiting_bytes": MAX_BYTES, "kv_generation": MAX_BYTES}
    for node in range(8):
        reqs = [_req(i, 5_000, node=f"n{node}", ttft_ms=float(MAX_DURATION_MS), **big) for i in range(3000)]
        loop.ingest(encode_envelope([*reqs, {**gpu, "node": f"n{node}"}], "n", 0), SRC, 0)
    windows = loop.ingest(encode_envelope([_req(7, 8_000)], "n0", 0), SRC, 0).windows
    zone = next(w for w in windows if w["scope"] == "zone")
    assert zone["prompt_tokens"] == 8 * 3000 * MAX_TOKENS and zone["kv_blocks_total"] == 8 * MAX_COUNT
    for w in windows:
        assert loop.decode(loop.sign_window(w)[0], SRC, 0)[0] is not None


def test_a_windows_sums_saturate_at_int64() -> None:
    agg = initialize()
    agg.prompt_tokens = agg.output_tokens = 2**70  # as many records as no window holds
    agg.queue_ms_sum, agg.n_requests = math.inf, 1
    rec = decode_window({"scope": "zone", "model": MODEL, "zone": "az-a", "window_end_ms": 1, **result(agg, 1.0)})
    assert rec.prompt_tokens == 2**63 - 1 and rec.queue_ms_mean is None
