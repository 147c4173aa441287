"""The Dynamo throughput planner held to Dynamo's own predictor and sizing facts.

Sources (each case names its own): ai-dynamo/dynamo
``components/src/dynamo/planner/core/load/predictors.py`` (``BasePredictor``,
``ConstantPredictor``, ``ARIMAPredictor``, ``KalmanPredictor``) with its tests
``components/src/dynamo/planner/tests/plugins/builtins/test_load_predictor.py``;
``core/throughput_scaling.py`` (``replicas = max(ceil(demand / engine_rps),
min_endpoint)``); ``config/defaults.py`` (``load_predictor = "arima"``,
``throughput_adjustment_interval = 180``).  The ARIMA fit itself is
pmdarima's auto_arima upstream; ours is ARIMA(1,1,0) with drift, so only
Dynamo's guards (< 5 points, constant series) are held exactly, and the fit
on a clean ramp.
"""

from __future__ import annotations

import math

import pytest

from sim.baselines import Observation
from sim.baselines.dynamo import DynamoThroughputParams, DynamoThroughputPlanner
from sim.baselines.dynamo_predictors import LoadPredictor

pytestmark = pytest.mark.timeout(60)


def test_default_predictor_and_interval_are_dynamos() -> None:
    p = DynamoThroughputParams()  # defaults.py: load_predictor = "arima", throughput_adjustment_interval = 180
    assert p.predictor == "arima" and p.adjustment_interval_s == 180.0


@pytest.mark.parametrize("kind", ["constant", "arima", "kalman"])
def test_empty_buffer_predicts_zero(kind: str) -> None:
    # test_predict_returns_accept_when_no_traffic_and_no_data: an empty buffer predicts 0
    assert LoadPredictor(kind).predict() == 0.0  # type: ignore[arg-type]


def test_constant_predictor_sequence() -> None:
    # test_predict_matches_bare_constant_predictor_output: 10, 20, 30 -> each time the last value
    p = LoadPredictor("constant")
    outs = []
    for v in (10.0, 20.0, 30.0):
        p.add(v)
        outs.append(p.predict())
    assert outs == [10.0, 20.0, 30.0]
    q = LoadPredictor("constant")  # test_reset_reinstantiates_predictors_and_discards_state: 999 -> 999
    q.add(999.0)
    assert q.predict() == 999.0


@pytest.mark.parametrize(
    ("values", "buffer"),
    [
        ([0.0, 0.0, 5.0, 0.0, 7.0], [5.0, 0.0, 7.0]),  # BasePredictor: leading idle zeros skipped, later zeros kept
        ([math.inf, 3.0, math.nan], [3.0, 0.0]),  # non-finite -> 0 (skipped while leading)
    ],
)
def test_base_predictor_idle_skip_and_non_finite(values: list[float], buffer: list[float]) -> None:
    p = LoadPredictor("constant")
    for v in values:
        p.add(v)
    assert p.buffer == buffer


def test_arima_guards() -> None:
    p = LoadPredictor("arima")
    for v in (10.0, 30.0, 20.0, 40.0):
        p.add(v)
    assert p.predict() == 40.0  # ARIMAPredictor: fewer than minimum_data_points (5) -> the last value
    c = LoadPredictor("arima")
    for _ in range(8):
        c.add(12.0)
    assert c.predict() == 12.0  # "pmdarima will predict 0 for constant data": the constant is returned


def test_arima_follows_a_ramp() -> None:
    p = LoadPredictor("arima")
    for k in range(1, 9):
        p.add(100.0 * k)
    assert p.predict() == pytest.approx(900.0)  # differences constant at 100: the drift carries on


def test_kalman_caches_the_forecast_within_an_interval() -> None:
    # KalmanPredictor: predict_next twice without new data must not advance the filter twice
    p = LoadPredictor("kalman")
    for v in (10.0, 20.0, 30.0, 40.0):
        p.add(v)
    first = p.predict()
    assert p.predict() == first and 40.0 < first < 60.0


def planner(interval: float, capacity: float, predictor: str = "constant") -> DynamoThroughputPlanner:
    return DynamoThroughputPlanner(
        DynamoThroughputParams(adjustment_interval_s=interval, predictor=predictor),  # type: ignore[arg-type]
        replica_capacity_rps=capacity,
    )


def feed(p: DynamoThroughputPlanner, rates: list[float]) -> list[int | None]:
    return [p.decide(Observation(float(t), "az-a", "m", 1, 0, 1, 0, 0, r, 0.5, None)) for t, r in enumerate(rates)]


@pytest.mark.parametrize(
    ("rate", "capacity", "expected"),
    [
        (10.0, 4.0, 3),  # throughput_scaling: 100 requests / 10 s = 10 req/s / 4 per engine -> ceil(2.5) = 3
        (8.0, 4.0, 2),  # exactly 2 engines' worth
        (0.5, 4.0, None),  # 0.125 -> ceil = 1 = current: no change (min_endpoint 1 floor)
    ],
)
def test_replicas_are_ceil_of_demand_over_engine_rate(rate: float, capacity: float, expected: int | None) -> None:
    outs = feed(planner(10.0, capacity), [rate] * 11)
    assert outs[:-1] == [None] * 10 and outs[-1] == expected


def test_leading_idle_intervals_do_not_enter_the_buffer() -> None:
    p = planner(10.0, 4.0)
    feed(p, [0.0] * 11 + [10.0] * 10)  # one idle interval, then one at 10 req/s
    assert p.history == [100.0]
