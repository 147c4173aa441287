"""Splitwise-calibrated perf model: medians, interpolation, memory, calibration."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.perf_model import PerfModel, PerfModelError, available_configs, calibration_report

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pm() -> PerfModel:
    return PerfModel.from_splitwise()


# README medians, llama2-70b TP8 on H100: (tokens, ms, tolerance)
PREFILL = [
    (512, 53.0, 0.05),  # README 53 ms
    (2048, 137.0, 0.05),  # README 137 (batch-1 rows); pooled median 134.4
    (8192, 845.0, 0.05),  # README 845 (batch-1 rows); pooled with 16x512 -> 831.5
]
DECODE = [
    (1, 29.8, 0.03),  # README 29.8 (prompt 512 rows); all batch-1 rows -> 30.4
    (8, 32.5, 0.01),
    (32, 38.6, 0.01),
    (64, 50.2, 0.01),
]


@pytest.mark.parametrize("tokens,ms,tol", PREFILL)
def test_prefill_matches_readme_medians(pm: PerfModel, tokens: int, ms: float, tol: float) -> None:
    assert pm.prefill_ms(tokens) == pytest.approx(ms, rel=tol)


@pytest.mark.parametrize("batch,ms,tol", DECODE)
def test_decode_matches_readme_medians(pm: PerfModel, batch: int, ms: float, tol: float) -> None:
    assert pm.decode_step_ms(batch) == pytest.approx(ms, rel=tol)


def test_prefill_monotone_and_vectorised(pm: PerfModel) -> None:
    grid = np.geomspace(1, 200_000, 400)
    y = pm.prefill_ms(grid)
    assert isinstance(y, np.ndarray) and np.all(np.diff(y) >= -1e-9)
    assert y[10] == pytest.approx(pm.prefill_ms(float(grid[10])))


def test_prefill_extrapolates_linearly_in_loglog(pm: PerfModel) -> None:
    # beyond the last knot (32,768) the last segment's log-log slope continues
    x1, x2 = pm.prefill_tokens[-2], pm.prefill_tokens[-1]
    slope = np.log(pm.prefill_knots_ms[-1] / pm.prefill_knots_ms[-2]) / np.log(x2 / x1)
    assert np.log(pm.prefill_ms(4 * x2) / pm.prefill_ms(x2)) == pytest.approx(slope * np.log(4))


@given(st.floats(min_value=1, max_value=1e6), st.floats(min_value=1, max_value=1e6))
@settings(max_examples=50, deadline=None)
def test_prefill_monotone_property(a: float, b: float) -> None:
    pm = PerfModel.from_splitwise()
    lo, hi = sorted((a, b))
    assert pm.prefill_ms(lo) <= pm.prefill_ms(hi) + 1e-9


def test_decode_context_adjustment(pm: PerfModel) -> None:
    base = pm.decode_step_ms(8)
    assert pm.decode_step_ms(8, 8 * 576) == pytest.approx(base)  # reference context
    assert pm.decode_step_ms(8, 8 * 4000) > base
    assert pm.decode_step_ms(8, 0) >= 0.5 * base


def test_memory_model(pm: PerfModel) -> None:
    assert pm.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert pm.weight_bytes == 140e9
    assert pm.kv_capacity_tokens == int((8 * 80e9 - 140e9) * 0.9) // 327_680 == 1_373_291
    tp2 = PerfModel.from_splitwise(tensor_parallel=2)
    assert tp2.kv_capacity_tokens == int((2 * 80e9 - 140e9) * 0.9) // 327_680


def test_available_configs() -> None:
    combos = available_configs()
    assert len(combos) == 12
    assert ("bloom-176b", "h100-80gb", 8) in combos
    assert ("llama2-70b", "a100-80gb", 2) in combos


@pytest.mark.parametrize(
    "kwargs,param",
    [
        (dict(model="gpt-5"), "model"),
        (dict(hardware="tpu-v5"), "model/hardware"),
        (dict(tensor_parallel=3), "tensor_parallel"),
    ],
)
def test_bad_config_names_parameter(kwargs, param) -> None:
    with pytest.raises(PerfModelError, match=param):
        PerfModel.from_splitwise(**kwargs)


def test_bad_batch(pm: PerfModel) -> None:
    with pytest.raises(PerfModelError, match="batch_size"):
        pm.decode_step_ms(0)


def test_calibration_report_numbers() -> None:
    rep = calibration_report("llama2-70b")
    s = rep["summary"]
    # the numbers documented in the module docstring
    assert s["prefill_fit_max_rel_err"] == pytest.approx(0.071, abs=0.002)
    assert s["prefill_loo_mean_rel_err"] == pytest.approx(0.110, abs=0.002)
    assert s["prefill_loo_max_rel_err"] == pytest.approx(0.272, abs=0.002)
    assert s["decode_fit_max_rel_err"] < 1e-12
    assert s["decode_loo_max_rel_err"] == pytest.approx(0.130, abs=0.002)
    assert [p["x"] for p in rep["prefill"]] == [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
    assert [p["x"] for p in rep["decode"]] == [1, 2, 4, 8, 16, 32, 64]


@pytest.mark.parametrize("model,hw,tp", [c for c in available_configs()])
def test_every_config_builds_and_calibrates(model: str, hw: str, tp: int) -> None:
    pm = PerfModel.from_splitwise(model=model, hardware=hw, tensor_parallel=tp)
    assert pm.prefill_ms(1000) > 0 and pm.decode_step_ms(16) > 0
    rep = calibration_report(model, hw, tp)
    assert rep["summary"]["prefill_fit_max_rel_err"] < 0.2  # monotone fit stays near the medians


def test_pcap_is_derived_1_3x() -> None:
    # README: h100-80gb-pcap prefill = 1.3 x H100
    a = PerfModel.from_splitwise(hardware="h100-80gb")
    b = PerfModel.from_splitwise(hardware="h100-80gb-pcap")
    assert b.prefill_ms(4096) / a.prefill_ms(4096) == pytest.approx(1.3, rel=0.02)


def test_broken_tp2_batch64_rows_dropped() -> None:
    # TP2 64x512 runs report 360 ms prefill (32x512: 2,398 ms): excluded from both curves
    pm = PerfModel.from_splitwise(tensor_parallel=2)
    assert 32768 not in pm.prefill_tokens and 64 not in pm.decode_batch
    assert pm.decode_step_ms(64) > pm.decode_step_ms(32)
