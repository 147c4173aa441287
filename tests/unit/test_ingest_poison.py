"""Nothing a telemetry writer sends stops ingest (issue #31, item 1).

A record nested just under orjson's writer limit (254 levels) still gives an
encodable dead letter; a valid record at the 64-bit limits is dead-lettered by
its realistic bounds (and a window's sums saturate), so no window is refused
because of its own content.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from core.settings import ModelSpec, Settings
from streams.control_loop import ControlLoop
from streams.deadletters import MAX_DEAD_LETTER_BYTES, dead_letter
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
