"""A seeded telemetry fuzz of the whole in-memory path (issue #31, item 1: measure and report).

Each case is one telemetry message -- a bare record, a batch, a columnar or a
typed message (some with bytes overwritten), or junk -- built from good request and GPU records with fields
replaced by values at the 64-bit limits (ints 2^63-1, -2^63, 2^64-1; floats
1e308, 1e-308, 5e-324), by lists nested 240 to 260 levels deep (orjson writes
254), or by junk.  Each goes through what the worker's agents do with it:
``ControlLoop.ingest``, each dead letter encoded, each window closed signed,
decoded and decided.  Counted: *escapes* (an exception out of any of these:
the agents' boundary would have had to catch it; goal 0) and *refused*
windows (a window the ingest made that the control agent's decoder refuses;
goal 0).  The suite runs 2,000 cases; ``python -m tests.unit.test_ingest_fuzz
20000`` runs more and prints the counts.
"""

from __future__ import annotations

import random
import sys
import time
import traceback
from collections import Counter
from typing import Any

import orjson
from governor_telemetry.columnar import encode_columns, encode_typed
from governor_telemetry.records import encode_envelope

from core.settings import ModelSpec, Settings
from loop.control_loop import ControlLoop
from loop.deadletters import MAX_DEAD_LETTER_BYTES
from streams.metrics_export import WorkerMetrics

MODEL = "m"
ZONES = ("az-a", "az-b")
NOW = 1_700_000_000_000
LIMITS: list[Any] = [2**63 - 1, -(2**63), 2**64 - 1, 1e308, -1e308, 1e-308, 5e-324, 2**31, 2**53, 0, -1, 0.5]
FIELDS = (
    "ts_ms ttft_ms itl_ms e2e_ms queue_ms prompt_tokens output_tokens kv_hit_blocks arrival_ms decode_ms "
    "gpu_util mem_used_bytes mem_total_bytes kv_blocks_used kv_blocks_total largest_free_block_bytes queue_len "
    "running fragmentation_ratio kv_free_bytes kv_waiting_bytes kv_generation free_block_hist agent_stability "
    "agent_rag_score agent_tool_conf model zone node request_id status state kind schema_version"
).split()


def _deep(depth: int) -> str:
    """A stand-in for a list nested ``depth`` levels deep, written as raw JSON by :func:`_raw`
    (a producer's encoder stops at 254 levels; a hostile writer sends bytes)."""
    return f"\u0001deep{depth}\u0001"


def _raw(encoded: bytes) -> bytes:
    """``encoded`` with every :func:`_deep` stand-in replaced by its nested lists."""
    for depth in range(240, 261):
        token = orjson.dumps(_deep(depth))
        if token in encoded:
            encoded = encoded.replace(token, b"[" * depth + b"]" * depth)
    return encoded


def _request(rng: random.Random, ts: int) -> dict[str, Any]:
    ttft = rng.uniform(10, 900)
    rec = {"kind": "request", "request_id": f"r{rng.randrange(10**6)}", "ts_ms": ts, "model": MODEL}
    rec |= {"zone": rng.choice(ZONES), "node": f"n{rng.randrange(4)}", "ttft_ms": ttft, "e2e_ms": ttft + 500}
    return rec | {"itl_ms": rng.uniform(5, 60), "prompt_tokens": rng.randrange(4000), "status": "ok"}


def _gpu(rng: random.Random, ts: int) -> dict[str, Any]:
    rec = {"kind": "gpu", "ts_ms": ts, "model": MODEL, "zone": rng.choice(ZONES), "node": f"n{rng.randrange(4)}"}
    return rec | {"state": "ready", "gpu_util": rng.random(), "mem_used_bytes": 1, "mem_total_bytes": 2}


def _value(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.45:
        return rng.choice(LIMITS)
    if roll < 0.75:
        return _deep(rng.randint(240, 260))
    if roll < 0.85:
        return [rng.choice(LIMITS) for _ in range(rng.randint(0, 70))]  # a histogram, too long or not
    return rng.choice([None, True, "", "x" * 300, {"a": 1}, [2**64 - 1], float(rng.randint(0, 9))])


def _message(rng: random.Random, ts: int) -> bytes:
    n = rng.randint(1, 6)
    records = [(_request if rng.random() < 0.7 else _gpu)(rng, ts + rng.randint(-400, 400)) for _ in range(n)]
    for rec in records:
        for _ in range(rng.choice([0, 1, 1, 2])):
            rec[rng.choice(FIELDS)] = _value(rng)
    shape = rng.random()
    if shape < 0.1:
        return _raw(orjson.dumps(_deep(rng.randint(240, 260))))  # the whole message nested
    if shape < 0.35:
        return _raw(orjson.dumps(records[0]))
    try:
        if shape < 0.55:
            return _raw(encode_columns(records, "fuzz", ts))
        if shape < 0.72:  # a typed message, some with bytes of its header or its arrays overwritten
            typed = bytearray(encode_typed(records, "fuzz", ts))
            for _ in range(rng.choice([0, 0, 1, 3])):
                typed[rng.randrange(len(typed))] = rng.randrange(256)
            return bytes(typed)
    except (TypeError, ValueError):  # past what the columnar encoder takes: a batch then
        pass
    return _raw(encode_envelope(records, "fuzz", ts))


def fuzz(cases: int, seed: int = 31) -> Counter[str]:
    """Run ``cases`` messages; the counts (escapes, refused, messages, dead_letters, windows, decided)."""
    rng = random.Random(seed)
    loop = ControlLoop(Settings(models=(ModelSpec(MODEL),), zones=ZONES, window_s=1.0, lateness_s=0.5), WorkerMetrics())
    out: Counter[str] = Counter()
    now = NOW
    for k in range(cases):
        now += rng.randint(0, 120)
        raw = _message(rng, now)
        src = {"topic": "telemetry", "partition": 0, "offset": k}
        try:
            res = loop.ingest(raw, src, now)
            for dl in res.dead_letters:
                assert len(orjson.dumps(dl)) <= MAX_DEAD_LETTER_BYTES
            windows = res.windows + loop.close_due(now)
            for w in windows:
                value, headers = loop.sign_window(w)
                rec, refusal = loop.decode(value, src, now, dict(headers))
                if rec is None:
                    out["refused"] += 1
                    print("refused:", refusal and refusal["reason"], file=sys.stderr)
                    continue
                loop.decide(rec, now)
                out["decided"] += 1
        except Exception:  # noqa: BLE001 - counted: what the agents' boundary would have had to catch
            out["escapes"] += 1
            traceback.print_exc()
            continue
        out["messages"] += 1
        out["dead_letters"] += len(res.dead_letters)
        out["windows"] += len(windows)
    return out


def test_2000_hostile_messages_no_escape_and_no_window_refused() -> None:
    counts = fuzz(2000)
    assert counts["escapes"] == 0 and counts["refused"] == 0, counts
    assert counts["dead_letters"] > 1000 and counts["decided"] > 100  # both outcomes well represented


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    t0 = time.perf_counter()
    result = fuzz(n)
    print(dict(result), f"{time.perf_counter() - t0:.1f} s")
