"""The window record's wire format is frozen: the bytes a worker signs for a window stay byte-identical.

Issue 32 item 5 rebuilt the record's shape (aggregate, result, record) from one field table; the
MAC-signed metrics message (:meth:`loop.control_loop.ControlLoop.sign_window`) and the decoded
record (:meth:`controllers.window_record.WindowRecord.to_dict`) must not change by a byte, or
workers of two versions would stop reading each other's windows.  The fixture was written by the
code before that change (commit 2b29a4c); regenerate it only for a deliberate format change
(``GOVERNOR_REWRITE_WIRE_FIXTURE=1``) and bump ``METRICS_SCHEMA_VERSION`` then, unless the change
only adds optional fields (an older reader ignores them, a newer one reads their absence as empty):
issue 36 item 6 added the stage latencies that way and regenerated it, at version 1.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson
from governor_telemetry.records import encode_envelope

from controllers.window_record import decode_window
from core.settings import ModelSpec, Settings
from core.signing import Keyring
from loop.control_loop import ControlLoop

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "window_records" / "signed.jsonl"
MODEL = "m"
T0 = 1_700_000_000_000
SRC = {"topic": "telemetry", "partition": 0, "offset": 0}


_REQUEST = ("ttft_ms", "itl_ms", "e2e_ms", "queue_ms", "prompt_tokens", "output_tokens", "kv_hit")
_GPU = ("gpu_util", "mem_used_bytes", "mem_total_bytes", "queue_len", "running", "kv_blocks_used", "kv_blocks_total")
_KV = ("largest_free_block_bytes", "fragmentation_ratio", "kv_free_bytes", "kv_waiting_bytes", "kv_generation")


def _row(kind: str, ts_ms: int, zone: str, node: str, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "ts_ms": ts_ms, "model": MODEL, "zone": zone, "node": node, **fields}


def _traffic() -> list[dict[str, Any]]:
    """Requests with agent signals and classes, GPU samples with KV fields, and 70 nodes (past the node cap)."""
    recs: list[dict[str, Any]] = []
    for i in range(120):
        values = (40.0 + (i * 37) % 900, float(i % 70), 2000.0 + i, float(i % 5), 100 + i, i % 50, i % 3 == 0)
        rec = _row(
            "request", T0 + i * 17, "az-a", f"n{i % 3}", request_id=f"r{i}", **dict(zip(_REQUEST, values, strict=True))
        )
        rec["status"] = "ok" if i % 11 else "error"
        if i % 2:
            rec.update(agent_stability=(i % 10) / 10, agent_rag_score=(i % 7) / 6, agent_tool_conf=(i % 3) / 2)
            rec["agent_path"] = ("rag", "tool", "llm")[i % 3]
        if i % 5 == 0:
            rec["request_class"] = ("trading", "voice", "batch")[i % 3]
        if i % 4 == 0:  # stage latencies, one request in four; a slow network past the TTFT SLO in eight
            net = 700.0 if i % 8 == 0 else float(i % 9)
            rec.update(network_ms=net, preprocess_ms=0.5, decode_ms=float(i), ttft_ms=rec["ttft_ms"] + net)
        recs.append(rec)
    for i in range(9):
        gpu = dict(zip(_GPU, (0.25 + i / 20, 10, 20, i % 4, 2, 3, 9), strict=True))
        kv = dict(zip(_KV, (64 + i, 0.125, 4096, 512, i), strict=True))
        state = "ready" if i > 2 else "starting"
        recs.append(_row("gpu", T0 + i * 200, "az-a", f"n{i % 3}", state=state, **gpu, **kv, free_block_hist=[i, 1, 0]))
    # a second zone flooded with new nodes: the cap drops some (node_cap_dropped)
    flood = dict(zip(_GPU[:3], (0.5, 1, 2), strict=True))
    recs += [_row("gpu", T0 + 100 + k, "az-b", f"flood{k}", state="ready", **flood) for k in range(70)]
    return recs


def _signed() -> list[bytes]:
    """Each closed window's signed message: the value bytes, the MAC header, the decoded record's bytes."""
    settings = Settings(models=(ModelSpec(MODEL),), zones=("az-a", "az-b"), window_s=1.0, lateness_s=0.5)
    loop = ControlLoop(settings, keyring=Keyring(active="k1", keys={"k1": bytes(range(32))}))
    recs = _traffic()
    for start in range(0, len(recs), 40):
        res = loop.ingest(encode_envelope(recs[start : start + 40], "p", T0), SRC, T0)
        assert not res.dead_letters
    lines = []
    for window in loop.close_due(T0 + 60_000):
        value, headers = loop.sign_window(window)
        lines.append(value)
        lines.append(orjson.dumps({k: v.decode() for k, v in headers}))
        lines.append(orjson.dumps(decode_window(orjson.loads(value)).to_dict()))
    return lines


def test_signed_window_records_are_byte_identical_to_the_fixture() -> None:
    lines = _signed()
    if os.environ.get("GOVERNOR_REWRITE_WIRE_FIXTURE") == "1":
        FIXTURE.write_bytes(b"\n".join(lines) + b"\n")
    expected = FIXTURE.read_bytes().splitlines()
    assert len(lines) == len(expected)
    for got, want in zip(lines, expected, strict=True):
        assert got == want


def test_the_fixture_covers_every_record_field() -> None:
    """Zone and node windows, the KV fields, agent means, class SLO effects and the node cap's drops."""
    records = [orjson.loads(line) for line in FIXTURE.read_bytes().splitlines()[2::3]]
    zone = [r for r in records if r["scope"] == "zone"]
    node = [r for r in records if r["scope"] == "node"]
    assert zone and node
    assert any(r["node_cap_dropped"] > 0 for r in zone)
    assert any(r["agent_stability_mean"] is not None for r in zone)
    assert any(r["kv_generation"] is not None and r["free_block_hist"] for r in node)
    assert all(v is not None for r in zone for k, v in r.items() if k.startswith("ttft_p") and r["count"])
    assert any(r["network_p95_ms"] is not None and r["stage_unfixable_rate"] > 0 for r in zone)
