"""Load forecaster: ramp / constant / seasonal sine after warm-up, online
error statistics against numpy, drift reset, snapshots, validation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from controllers.errors import ParameterError
from controllers.forecast import LoadForecaster

SEASON = 24
N = 25 * SEASON  # 25 seasons of hourly intervals


def ramp(k: int) -> float:
    return 10.0 + 0.5 * k


def const(k: int) -> float:
    return 50.0


def sine(k: int) -> float:
    return 100.0 + 30.0 * math.sin(2.0 * math.pi * k / SEASON)


NOISE = np.random.default_rng(11).normal(0.0, 3.0, size=2 * N)  # fixed per index


def noisy_sine(k: int) -> float:
    return sine(k) + float(NOISE[k])


@pytest.mark.parametrize(
    ("model", "season", "series", "truth", "tol"),
    [
        ("holtwinters", None, ramp, ramp, 1e-6),  # Holt's trend: exact on a line (0.0)
        ("snarimax", None, ramp, ramp, 1e-3),  # ARIMA(2,1,0) on a line (1.7e-5)
        ("ewma", None, const, const, 1e-12),  # every model holds a constant
        ("holtwinters", None, const, const, 1e-9),
        ("snarimax", None, const, const, 1e-9),
        ("holtwinters", SEASON, sine, sine, 0.1),  # seasonal HW (measured 0.02 of amplitude 30)
        ("snarimax", SEASON, sine, sine, 1e-6),  # seasonal difference: exact on a sine
        ("holtwinters", SEASON, noisy_sine, sine, 3.0),  # noise sd 3: within one sd (1.9)
        ("snarimax", SEASON, noisy_sine, sine, 4.5),  # seasonal differencing adds noise (2.7)
    ],
)
def test_forecast_after_warm_up(model, season, series, truth, tol) -> None:
    f = LoadForecaster(model, horizon_steps=6, season_length=season)
    for k in range(N):
        f.learn(series(k))
    assert f.ready
    got = np.array(f.forecast())
    want = np.array([truth(N + h) for h in range(6)])
    assert got.shape == (6,)
    assert np.max(np.abs(got - want)) <= tol, np.max(np.abs(got - want))


def test_ewma_lags_a_ramp_by_slope_times_one_minus_alpha_over_alpha() -> None:
    # simple exponential smoothing is flat: its steady lag on a ramp is known
    f = LoadForecaster("ewma", horizon_steps=1, alpha=0.25)
    for k in range(200):
        f.learn(ramp(k))
    assert f.forecast(1)[0] == pytest.approx(ramp(199) - 0.5 * 0.75 / 0.25, abs=1e-9)


@pytest.mark.parametrize(
    ("model", "season"),
    [("holtwinters", SEASON), ("snarimax", None), ("ewma", None)],
)
def test_error_tracking_matches_numpy(model, season) -> None:
    """Replay the same forecasts by hand and score them with numpy."""
    rng = np.random.default_rng(3)
    ys = np.array([sine(k) for k in range(300)]) + rng.normal(0.0, 5.0, size=300)
    ys[::37] = 0.0  # zeros: MAPE must skip them, MAE must not
    horizon = 4
    f = LoadForecaster(model, horizon_steps=horizon, season_length=season)
    made: list[list[float] | None] = []
    for y in ys:
        f.learn(float(y))
        made.append(f.forecast() if f.ready else None)
    y1, p1, yh, ph = [], [], [], []
    for t in range(1, len(ys)):
        if made[t - 1] is not None:
            y1.append(ys[t])
            p1.append(made[t - 1][0])
        if t >= horizon and made[t - horizon] is not None:
            yh.append(ys[t])
            ph.append(made[t - horizon][horizon - 1])
    ym, pm = [], []  # the horizon's mean against the mean of the forecasts made for it
    for t in range(horizon, len(ys)):
        if made[t - horizon] is not None:
            ym.append(float(np.mean(ys[t - horizon + 1 : t + 1])))
            pm.append(float(np.mean(made[t - horizon])))
    for stats, y, p in [
        (f.errors_1, np.array(y1), np.array(p1)),
        (f.errors_h, np.array(yh), np.array(ph)),
        (f.errors_hmean, np.array(ym), np.array(pm)),
    ]:
        nz = y != 0.0
        assert stats.n == len(y) > 200
        assert stats.mae == pytest.approx(np.mean(np.abs(y - p)), rel=1e-12)
        assert stats.mape == pytest.approx(100 * np.mean(np.abs(y - p)[nz] / np.abs(y[nz])), rel=1e-12)
        assert stats.n_pct == int(nz.sum()) <= stats.n  # the horizon means of this series are never 0


def test_naive_until_warm_and_empty_before_any_value() -> None:
    f = LoadForecaster("holtwinters", horizon_steps=3, season_length=4)
    assert f.forecast() == [] and f.errors_1.mae is None and f.errors_1.mape is None
    for y in [5.0, 7.0, 6.0]:
        f.learn(y)
    assert not f.ready and f.forecast() == [6.0, 6.0, 6.0] and f.forecast(1) == [6.0]
    assert f.errors_1.n == 0  # naive forecasts are not scored
    for y in range(7):
        f.learn(float(y))
    assert f.ready and f.warmup_steps == 10


def test_holt_warms_up_over_its_trend_memory_so_its_first_guess_is_not_scored() -> None:
    """River starts Holt's trend at the difference of the first two values; with beta = 0.1 it
    forgets that guess over ~10 steps.  Fed the first windows of an Azure run (a steady ~9 req/s
    read from 6.6, 9.35, ...) it forecast ~20 req/s four steps ahead; scored, those errors were
    the scaler's headroom for the rest of the run.  Warm after 2 + 1 / beta steps, the errors
    scored are the steady series' own."""
    start = [6.6, 9.35, 8.28, 8.53, 12.45, 8.67, 3.96, 6.71, 10.9, 11.9, 6.57, 9.48]
    rng = np.random.default_rng(0)
    ys = start + list(9.0 + rng.normal(0.0, 0.5, size=30))
    f = LoadForecaster("holtwinters", horizon_steps=4)
    assert f.warmup_steps == 12 and LoadForecaster("holtwinters", 4, beta=0.25).warmup_steps == 6
    two = LoadForecaster("holtwinters", horizon_steps=4)
    two.warmup_steps = 2  # what it was
    for y in ys:
        f.learn(y)
        two.learn(y)
    assert f.ready and f.errors_hmean.mae is not None and two.errors_hmean.mae is not None
    assert f.errors_hmean.mae < 1.5 and two.errors_hmean.mae > 1.9 * f.errors_hmean.mae  # measured: 1.28, 2.65


def test_reset_on_drift_relearns_and_keeps_errors() -> None:
    f = LoadForecaster("snarimax", horizon_steps=2)
    for k in range(100):
        f.learn(const(k))
    n_before = f.errors_1.n
    f.reset()
    assert not f.ready and f.n_resets == 1 and f.errors_1.n == n_before
    assert f.forecast(2) == [50.0, 50.0]  # naive from the last value while cold
    for _ in range(100):
        f.learn(200.0)  # new regime
    assert f.forecast(2) == pytest.approx([200.0, 200.0], abs=1e-6)


@pytest.mark.parametrize("model", ["holtwinters", "snarimax", "ewma"])
def test_snapshot_round_trip_continues_identically(model) -> None:
    season = SEASON if model != "ewma" else None
    f = LoadForecaster(model, horizon_steps=3, season_length=season)
    ys = [noisy_sine(k) for k in range(200)]
    for y in ys[:120]:
        f.learn(y)
    g = LoadForecaster.from_state(json.loads(json.dumps(f.to_state(), allow_nan=False)))
    for y in ys[120:]:
        for m in (f, g):
            m.learn(y)
        assert f.forecast() == g.forecast()
    assert f.errors_1 == g.errors_1 and f.errors_h == g.errors_h and f.errors_1.n > 50
    assert f.to_state() == g.to_state()


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: LoadForecaster("prophet", 1), "model"),  # not offered
        (lambda: LoadForecaster("ewma", 0), "horizon_steps"),  # horizon >= 1
        (lambda: LoadForecaster("holtwinters", 2, season_length=1), "season_length"),  # >= 2
        (lambda: LoadForecaster("ewma", 2, season_length=24), "season_length"),  # no seasons
        (lambda: LoadForecaster("ewma", 2, alpha=1.5), "params"),  # weight in (0, 1]
        (lambda: LoadForecaster("ewma", 2, beta=0.1), "params"),  # unknown parameter
        (lambda: LoadForecaster("holtwinters", 2, season_length=4, gamma=None), "params"),
        (lambda: LoadForecaster("snarimax", 2, bogus=3), "params"),  # River rejects
        (lambda: LoadForecaster("ewma", 2).learn(float("inf")), "y=inf"),  # not finite
        (lambda: LoadForecaster("ewma", 2).forecast(0), "h=0"),  # horizon >= 1
        (lambda: LoadForecaster("snarimax", 2, regressor=None), "params.regressor"),  # not plain data
        (lambda: LoadForecaster("holtwinters", 2, seasonality=12, gamma=0.3), "params.seasonality"),
        (lambda: LoadForecaster("snarimax", 2, p=10**6), "params.p"),  # orders are bounded
        (lambda: LoadForecaster("ewma", 10**6), "horizon_steps"),  # pending holds horizon**2 numbers
        (lambda: LoadForecaster.from_state({}), "state.type"),  # not a forecaster's state
    ],
)
def test_validation(build, needle: str) -> None:
    with pytest.raises(ParameterError, match=needle):
        build()
