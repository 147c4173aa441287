"""Per-request-class SLOs: the window counts a request against its class's limits.

The oracle is a per-record Python count of violations (status, then TTFT and ITL
against the class override or the model's SLO), independent of the numpy path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from governor_telemetry.records import encode_envelope

import loop.pipeline as pipeline
from controllers.errors import ParameterError
from controllers.routing_model import DEFAULT_CLASSES
from controllers.window_columns import REQUEST_CLASS_CODES, request_batch
from controllers.windows import SloSpec, add_requests, initialize
from core.settings import REQUEST_CLASSES, ClassSlo, ModelSpec, Settings
from loop.pipeline import TelemetryProcessor

T0 = 1_700_000_000_000
# Model SLO 1000/150; trading tighter on TTFT, voice tighter on ITL, batch looser on both.
MODEL = ModelSpec(
    "m",
    ttft_slo_ms=1000.0,
    itl_slo_ms=150.0,
    classes={
        "trading": ClassSlo(ttft_slo_ms=300.0),
        "voice": ClassSlo(itl_slo_ms=50.0),
        "batch": ClassSlo(ttft_slo_ms=5000.0),
    },
)
SPEC = SloSpec(1000.0, 150.0, tuple(MODEL.slo(c) for c in REQUEST_CLASSES))


def _cols(ttft: list[float], itl: list[float], codes: Sequence[float] | None) -> dict[str, Any]:
    n = len(ttft)
    cols: dict[str, Any] = {
        "ttft_ms": np.array(ttft),
        "itl_ms": np.array(itl),
        "e2e_ms": np.array(ttft) + 100.0,
        "queue_ms": np.zeros(n),
        "prompt_tokens": np.ones(n),
        "output_tokens": np.ones(n),
        "kv_hit": np.zeros(n, dtype=bool),
        "ok": np.ones(n, dtype=bool),
    }
    if codes is not None:
        cols["request_class"] = np.array(codes, dtype=np.float64)
    return cols


def test_the_router_classes_are_the_settings_classes() -> None:
    assert tuple(c.name for c in DEFAULT_CLASSES) == REQUEST_CLASSES


@pytest.mark.parametrize(
    ("ttft", "itl", "code", "violated"),
    [
        (400.0, 10.0, 0, False),  # no class: the model's 1000 ms TTFT holds
        (400.0, 10.0, REQUEST_CLASS_CODES["trading"], True),  # trading: 400 > 300
        (300.0, 10.0, REQUEST_CLASS_CODES["trading"], False),  # exactly at the override: not over (strict >)
        (400.0, 100.0, REQUEST_CLASS_CODES["trading"], True),  # trading keeps the model's ITL: TTFT still over
        (400.0, 100.0, REQUEST_CLASS_CODES["voice"], True),  # voice: ITL 100 > 50
        (400.0, 100.0, 0, False),  # the same request without a class: within 1000/150
        (3000.0, 10.0, REQUEST_CLASS_CODES["batch"], False),  # batch: 3000 <= 5000
        (3000.0, 10.0, 0, True),  # without a class: 3000 > 1000
        (3000.0, 10.0, 99, True),  # a code the spec has no limits for: the model's SLO
    ],
)
def test_a_class_override_decides_the_violation(ttft: float, itl: float, code: int, violated: bool) -> None:
    agg = initialize()
    add_requests(agg, _cols([ttft], [itl], [code]), SPEC)
    assert agg.n_violations == int(violated)


def test_without_class_limits_or_without_the_column_one_slo_holds() -> None:
    rows = ([400.0, 3000.0, 100.0], [10.0, 10.0, 100.0])
    codes = [REQUEST_CLASS_CODES["trading"], REQUEST_CLASS_CODES["batch"], REQUEST_CLASS_CODES["voice"]]
    counts = []
    for spec, with_codes in [(SPEC, False), (SloSpec(1000.0, 150.0), True), (SPEC, True)]:
        agg = initialize()
        add_requests(agg, _cols(*rows, codes if with_codes else None), spec)
        counts.append(agg.n_violations)
    assert counts == [1, 1, 2]  # model SLO: only the 3000 ms one; classes: trading and voice, not batch


@pytest.mark.parametrize(
    "codes",
    [
        [-1.0],  # negative
        [1.5],  # not an integer
        [np.nan],  # NaN: 0 means no class
        [np.inf],
    ],
)
def test_bad_class_codes_reject_the_batch(codes: list[float]) -> None:
    with pytest.raises(ValueError, match="request_class"):
        request_batch(_cols([1.0], [1.0], codes))


@pytest.mark.parametrize(
    "limits",
    [
        ((0.0, 10.0),),  # zero TTFT
        ((10.0, float("inf")),),  # infinite ITL
        ((10.0,),),  # not a pair
        ((True, 10.0),),  # a bool is no limit
    ],
)
def test_bad_class_limits_are_refused(limits: Any) -> None:
    with pytest.raises(ParameterError, match="class_limits"):
        SloSpec(100.0, 10.0, limits)


def _record(i: int, request_class: str | None) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "kind": "request",
        "request_id": f"r{i}",
        "ts_ms": T0 + i,
        "model": "m",
        "zone": "az-a",
        "node": "n1",
        "ttft_ms": float((i * 173) % 3500),
        "itl_ms": float((i * 29) % 200),
        "e2e_ms": 5000.0,
        "status": "ok" if i % 13 else "error",
    }
    if request_class is not None:
        rec["request_class"] = request_class
    return rec


def _oracle(records: list[dict[str, Any]]) -> int:
    """Violations counted one record at a time; an unknown class gets the model's SLO."""
    bad = 0
    for r in records:
        ttft_slo, itl_slo = MODEL.slo(r.get("request_class"))
        bad += r["status"] != "ok" or r["ttft_ms"] > ttft_slo or r["itl_ms"] > itl_slo
    return bad


@pytest.mark.parametrize("batch", [1, 7, 200])  # 1: the per-record path; more: the column path
@pytest.mark.parametrize("flush_rows", [5, pipeline.FLUSH_ROWS])
def test_the_pipeline_holds_each_record_to_its_class_slo(
    monkeypatch: pytest.MonkeyPatch, batch: int, flush_rows: int
) -> None:
    monkeypatch.setattr(pipeline, "FLUSH_ROWS", flush_rows)
    classes = [*REQUEST_CLASSES, None, "gold"]  # gold: not a request class -> the model's SLO
    records = [_record(i, classes[i % len(classes)]) for i in range(400)]
    p = TelemetryProcessor(Settings(models=(MODEL,), window_s=10.0))
    for k in range(0, len(records), batch):
        res = p.process(encode_envelope(records[k : k + batch], "n1", 0), {"topic": "t", "offset": k}, 0)
        assert res.valid == len(records[k : k + batch]) and not res.dead_letters
    zone = next(w for w in p.close_due(T0 + 60_000, 0) if w["scope"] == "zone")
    expected = _oracle(records)
    assert zone["count"] == len(records)
    assert round(zone["violation_rate"] * len(records)) == expected
    # The class overrides change the count: the model's SLO alone would give another one.
    assert expected != _oracle([{k: v for k, v in r.items() if k != "request_class"} for r in records])


def test_a_model_without_classes_ignores_the_records_class() -> None:
    records = [_record(i, "trading") for i in range(50)]
    p = TelemetryProcessor(Settings(models=(ModelSpec("m"),), window_s=10.0))
    p.process(encode_envelope(records, "n1", 0), {"topic": "t"}, 0)
    zone = next(w for w in p.close_due(T0 + 60_000, 0) if w["scope"] == "zone")
    model_only = sum(r["status"] != "ok" or r["ttft_ms"] > 1000.0 or r["itl_ms"] > 150.0 for r in records)
    assert round(zone["violation_rate"] * 50) == model_only
