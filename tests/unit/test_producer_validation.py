"""The producer refuses, in the caller, every record ingest would dead-letter as invalid.

No broker: ``send_nowait`` and ``send`` only buffer until a batch is full, and the
producer here is never started.  "Ingest" is the worker's real path
(:class:`loop.pipeline.TelemetryProcessor` on a batch envelope), so the two
sides are compared, not two copies of the rules.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import orjson
import pytest
from governor_telemetry.producer import InvalidRecord, TelemetryProducer
from governor_telemetry.records import validate_record
from hypothesis import given, settings
from hypothesis import strategies as st

from core.settings import ModelSpec, Settings
from loop.pipeline import TelemetryProcessor

T0 = 1_700_000_000_000
MODEL = "m"
SETTINGS = Settings(models=(ModelSpec(MODEL),), zones=("az-a",), window_s=1.0)

REQUEST: dict[str, Any] = {
    "kind": "request",
    "request_id": "r-1",
    "ts_ms": T0,
    "model": MODEL,
    "zone": "az-a",
    "node": "node-1",
    "ttft_ms": 120.0,
    "e2e_ms": 900.0,
    "status": "ok",
}
GPU: dict[str, Any] = {
    "kind": "gpu",
    "ts_ms": T0,
    "model": MODEL,
    "zone": "az-a",
    "node": "node-1",
    "state": "ready",
    "gpu_util": 0.5,
    "mem_used_bytes": 10,
    "mem_total_bytes": 20,
}


def _producer(**kw: Any) -> TelemetryProducer:
    return TelemetryProducer("127.0.0.1:1", "t", source="test", kafka_options={}, max_batch=1_000, **kw)


def _without(rec: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if k != name}


def _ingest_reason(rec: Any) -> str | None:
    """The reason of the worker's ``invalid record`` dead letter for ``rec`` (None: not one).

    ``rec`` rides in a batch behind a valid record, as a producer's batch would.
    """
    raw = orjson.dumps({"schema_version": 1, "kind": "batch", "source": "t", "sent_ms": T0, "records": [REQUEST, rec]})
    out = TelemetryProcessor(SETTINGS).process(raw, {"topic": "telemetry", "partition": 0, "offset": 0}, T0)
    invalid = [dl for dl in out.dead_letters if dl["kind"] == "invalid record"]
    assert all(dl["source"]["index"] == 1 for dl in invalid), invalid
    return invalid[0]["reason"] if invalid else None


def _on_the_wire_as_is(rec: dict[str, Any]) -> bool:
    """JSON cannot carry NaN or infinity (orjson writes null): ingest sees such a field missing."""
    return not any(isinstance(v, float) and not math.isfinite(v) for v in rec.values())


BAD = [
    # (record, the field the error names)
    (_without(REQUEST, "request_id"), "request_id"),
    ({**REQUEST, "request_id": ""}, "request_id"),
    ({**REQUEST, "request_id": 7}, "request_id"),
    (_without(REQUEST, "zone"), "zone"),
    ({**REQUEST, "ttft_ms": -1.0}, "ttft_ms"),
    ({**REQUEST, "ttft_ms": math.inf}, "ttft_ms"),
    ({**REQUEST, "e2e_ms": 10.0}, "e2e_ms"),
    ({**REQUEST, "ts_ms": "yesterday"}, "ts_ms"),
    ({**REQUEST, "status": "fine"}, "status"),
    ({**REQUEST, "kv_hit": 1}, "kv_hit"),
    ({**REQUEST, "agent_stability": 0.5}, "agent_rag_score"),
    ({**REQUEST, "agent_path": "web"}, "agent_path"),
    ({**REQUEST, "kind": "req"}, "kind"),
    ({**REQUEST, "schema_version": 2}, "schema_version"),
    (_without(GPU, "gpu_util"), "gpu_util"),
    ({**GPU, "gpu_util": 1.5}, "gpu_util"),
    ({**GPU, "mem_used_bytes": 30}, "mem_used_bytes"),
    ({**GPU, "state": "asleep"}, "state"),
    ({**GPU, "free_block_hist": [1, -2]}, "free_block_hist"),
]


def test_valid_records_are_buffered() -> None:
    p = _producer()
    p.send_nowait(REQUEST)
    p.send_nowait(GPU)
    assert p.pending == 2


@pytest.mark.parametrize(("rec", "field"), BAD, ids=[f"{i}-{f}" for i, (_, f) in enumerate(BAD)])
def test_send_nowait_refuses_what_ingest_dead_letters_and_names_the_field(rec: dict[str, Any], field: str) -> None:
    p = _producer()
    with pytest.raises(InvalidRecord) as info:
        p.send_nowait(rec)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.field == field, err
    assert repr(field) in str(err) or field in str(err)
    ingest = _ingest_reason(rec)
    assert ingest is not None  # the worker dead-letters it too ...
    if _on_the_wire_as_is(rec):  # ... for the same rule, in the same words
        assert err.reason == ingest
    assert p.pending == 0  # nothing buffered


async def test_send_refuses_a_record_without_request_id() -> None:
    p = _producer()
    with pytest.raises(InvalidRecord, match=r"request_id 'r-9'|missing field 'request_id'") as info:
        await p.send(_without({**REQUEST, "request_id": "r-9"}, "request_id"))
    assert info.value.field == "request_id"
    assert str(info.value) == "invalid telemetry record (kind 'request', model 'm', zone 'az-a'): " + (
        "missing field 'request_id'"
    )
    assert p.pending == 0
    await p.send(REQUEST)
    assert p.pending == 1


async def test_send_refuses_before_waiting_for_room() -> None:
    # A full buffer makes send wait; a bad record is refused at once all the same.
    p = TelemetryProducer("127.0.0.1:1", "t", source="test", kafka_options={}, max_batch=1, max_pending=1)
    p.send_nowait({**REQUEST, "model": "x"})
    with pytest.raises(InvalidRecord):
        await p.send({"kind": "request"})


def test_a_non_mapping_is_refused() -> None:
    with pytest.raises(InvalidRecord, match="record must be an object") as info:
        _producer().send_nowait([1, 2])  # type: ignore[arg-type]
    assert info.value.field is None


def test_validate_false_sends_records_as_they_are() -> None:
    # For tests that put bad records on the wire on purpose (the worker's dead letters).
    p = _producer(validate=False)
    p.send_nowait({"kind": "request", "model": MODEL, "zone": "az-a"})
    assert p.pending == 1


# Values a hostile or buggy node might put in a field.
ODD = st.sampled_from([None, -1, 0, 1, 2**63, 0.5, -0.5, 2.0, 1e300, math.nan, True, "", "x", "ok", "ready", [1]])


@settings(max_examples=300, deadline=None)
@given(
    base=st.sampled_from([REQUEST, GPU]),
    changes=st.dictionaries(
        st.sampled_from(
            [
                "request_id",
                "ts_ms",
                "model",
                "zone",
                "node",
                "ttft_ms",
                "e2e_ms",
                "status",
                "kv_hit",
                "prompt_tokens",
                "agent_stability",
                "agent_path",
                "state",
                "gpu_util",
                "mem_used_bytes",
                "kv_blocks_used",
                "fragmentation_ratio",
                "free_block_hist",
                "schema_version",
            ]
        ),
        ODD,
        max_size=3,
    ),
)
def test_the_producer_refuses_exactly_what_ingest_dead_letters_as_invalid(
    base: dict[str, Any], changes: dict[str, Any]
) -> None:
    rec = {k: v for k, v in {**base, **changes}.items() if v is not None}
    expected = _ingest_reason(rec)
    p = _producer()
    try:
        p.send_nowait(rec)
    except InvalidRecord as err:
        if _on_the_wire_as_is(rec):
            assert err.reason == expected
        # else: NaN/inf reach the worker as null; the producer refuses what the node meant
    else:
        assert expected is None, expected  # what the producer sends is never an invalid record
        assert p.pending == 1


async def test_the_readme_handler_example_sends_a_valid_record() -> None:
    # docs/contracts.md, "Producer library for inference nodes": the instrumented request handler, run
    # against a stand-in engine; the producer is not started, so the record stays in its buffer.
    readme = (Path(__file__).resolve().parents[2] / "docs" / "contracts.md").read_text()
    section = readme.split("## Producer library for inference nodes", 1)[1].split("\n## ", 1)[0]
    blocks = [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]
    (code,) = [b for b in blocks if "async def handle(" in b]
    assert len([line for line in code.splitlines() if line.strip()]) <= 10

    class Engine:
        async def generate(self, prompt: str) -> tuple[float, str]:
            await asyncio.sleep(0.05)  # the whole request: 50 ms; its first token came after 20
            return 20.0, prompt.upper()

    ns: dict[str, Any] = {"engine": Engine()}
    exec(compile(code, "docs/contracts.md", "exec"), ns)
    producer = ns["producer"]
    assert isinstance(producer, TelemetryProducer)
    assert await ns["handle"]("r-1", "hi") == "HI"
    assert producer.pending == 1
    (batch,) = producer._buffers.values()
    assert validate_record(batch[0]) is None and batch[0]["request_id"] == "r-1"
