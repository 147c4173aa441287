"""Dynamo's load predictors and the throughput planner's interval forecast.

Re-implemented from ai-dynamo/dynamo ``components/src/dynamo/planner/core/load/predictors.py``
(not copied).  Every predictor shares ``BasePredictor.add_data_point``: a
non-finite reading counts as 0 and the leading run of zeros (the idle period
after deployment) is skipped.  Predictors:

* ``constant``: the last value (``ConstantPredictor``).
* ``arima`` (Dynamo's default, ``load_predictor = "arima"``): with fewer than
  5 points the last value; a constant buffer forecasts that value; else
  Dynamo fits ``pmdarima.auto_arima``.  This project does not depend on
  pmdarima, so the fit is the simplest model auto_arima commonly selects for
  a short trending series: ARIMA(1,1,0) with drift by conditional least
  squares on the first differences (``x_{n+1} = x_n + c + phi (x_n - x_{n-1})``,
  ``|phi| < 1``), floored at 0.  Auto-ARIMA's order search and its ``log1p``
  refit when the order collapses to ``(0, d, 0)`` are not reproduced.
* ``kalman``: the local-linear-trend Kalman filter (``q_level`` 1.0,
  ``q_trend`` 0.1, ``r`` 10.0), one cached forecast per interval.

:class:`IntervalForecast` integrates the zone's arrival rate into request
counts per ``adjustment_interval_s`` (180 s) and turns each forecast into a
demand rate, as ``throughput_scaling.py`` does with the frontend's request
count.

Examples
--------
>>> p = LoadPredictor("arima")
>>> for v in (0.0, 0.0, 10.0, 20.0, 30.0, 40.0, 50.0):
...     p.add(v)
>>> p.buffer  # leading zeros skipped
[10.0, 20.0, 30.0, 40.0, 50.0]
>>> round(p.predict(), 6)  # a straight ramp: +10 per interval
60.0
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

__all__ = ["PREDICTORS", "ArimaTrend", "IntervalForecast", "KalmanTrend", "LoadPredictor"]

PREDICTORS = ("constant", "arima", "kalman")


class KalmanTrend:
    """Local-linear-trend Kalman filter (level, trend), as Dynamo's ``KalmanPredictor``.

    >>> k = KalmanTrend()
    >>> for v in (10.0, 20.0, 30.0, 40.0):
    ...     k.update(v)
    >>> 40.0 < k.predict() < 60.0
    True
    """

    def __init__(self, q_level: float = 1.0, q_trend: float = 0.1, r: float = 10.0) -> None:
        self.F = np.array([[1.0, 1.0], [0.0, 1.0]])
        self.H = np.array([[1.0, 0.0]])
        self.Q = np.diag([max(1e-12, q_level), max(1e-12, q_trend)])
        self.R = np.array([[max(1e-9, r)]])
        self.x = np.zeros((2, 1))
        self.P = np.eye(2) * 1000.0
        self.initialized = False
        self.cached: float | None = None

    def _predict_step(self) -> None:
        self.x = self.F @ self.x
        self.P = self.F @ self.P @ self.F.T + self.Q

    def update(self, z: float) -> None:
        """Absorb one observation (predicting first unless a forecast already did)."""
        if not self.initialized:
            self.x = np.array([[z], [0.0]])
            self.initialized = True
        else:
            if self.cached is None:
                self._predict_step()
            y = np.array([[z]]) - self.H @ self.x
            S = self.H @ self.P @ self.H.T + self.R
            K = self.P @ self.H.T @ np.linalg.inv(S)
            self.x = self.x + K @ y
            ikh = np.eye(2) - K @ self.H
            self.P = ikh @ self.P @ ikh.T + K @ self.R @ K.T  # Joseph form
        self.cached = None

    def predict(self) -> float:
        """One-step-ahead level forecast (cached until the next update)."""
        if self.cached is None:
            self._predict_step()
            self.cached = float(self.x[0, 0])
        return self.cached


class ArimaTrend:
    """ARIMA(1,1,0) with drift by conditional least squares, with Dynamo's ARIMA guards.

    >>> a = ArimaTrend()
    >>> a.predict([5.0, 7.0])  # fewer than 5 points: the last value
    7.0
    >>> a.predict([4.0] * 6)  # constant buffer: that value
    4.0
    """

    min_points = 5

    def predict(self, xs: list[float]) -> float:
        """One-step-ahead forecast of ``xs``."""
        if not xs:
            return 0.0
        if len(xs) < self.min_points:
            return float(xs[-1])
        if len(set(xs)) == 1:
            return float(xs[0])
        d = np.diff(np.asarray(xs, dtype=float))
        y, x = d[1:], d[:-1]
        if len(y) >= 2 and float(np.var(x)) > 1e-12:
            phi, c = np.polyfit(x, y, 1)
            phi = float(np.clip(phi, -0.99, 0.99))
            c = float(np.mean(y) - phi * np.mean(x))
        else:
            phi, c = 0.0, float(np.mean(d))
        forecast = xs[-1] + c + phi * float(d[-1])
        return max(0.0, float(forecast)) if math.isfinite(forecast) else float(xs[-1])


class LoadPredictor:
    """``BasePredictor`` buffer (idle skip, non-finite as 0) with one of :data:`PREDICTORS`.

    >>> p = LoadPredictor("constant")
    >>> p.predict()  # empty buffer
    0.0
    >>> p.add(float("inf")); p.add(999.0); p.predict()  # inf read as 0 and skipped as leading idle
    999.0
    """

    def __init__(
        self,
        kind: Literal["constant", "arima", "kalman"] = "arima",
        q_level: float = 1.0,
        q_trend: float = 0.1,
        r: float = 10.0,
        max_points: int = 1000,
    ) -> None:
        if kind not in PREDICTORS:
            raise ValueError(f"predictor={kind!r}: choose one of {PREDICTORS}")
        self.kind = kind
        self.buffer: list[float] = []
        self.max_points = max_points
        self.seen_nonzero = False
        self.kalman = KalmanTrend(q_level, q_trend, r)
        self.arima = ArimaTrend()

    def add(self, value: float) -> None:
        """``add_data_point``."""
        if not math.isfinite(value):
            value = 0.0
        if value == 0 and not self.seen_nonzero:
            return  # skip the leading idle period
        self.seen_nonzero = self.seen_nonzero or value != 0
        self.buffer.append(float(value))
        if len(self.buffer) > self.max_points:
            del self.buffer[0]
        if self.kind == "kalman":
            self.kalman.update(float(value))

    def predict(self) -> float:
        """``predict_next``."""
        if not self.buffer:
            return 0.0
        if self.kind == "kalman":
            return max(0.0, self.kalman.predict())
        if self.kind == "arima":
            return self.arima.predict(self.buffer)
        return self.buffer[-1]


class IntervalForecast:
    """Request count per interval -> predictor -> demand rate at each interval end.

    >>> f = IntervalForecast(10.0, LoadPredictor("constant"))
    >>> outs = [f.step(float(t), 5.0, 1.0) for t in range(11)]
    >>> outs[-1]  # 50 requests in 10 s -> 5 req/s
    5.0
    """

    def __init__(self, interval_s: float, predictor: LoadPredictor) -> None:
        self.interval_s = interval_s
        self.predictor = predictor
        self.interval_start_s: float | None = None
        self.last_t_s: float | None = None
        self.count = 0.0

    def step(self, t_s: float, arrival_rate_rps: float, sample_period_s: float) -> float | None:
        """Integrate the arrival rate; at an interval end return the forecast demand (req/s)."""
        if self.interval_start_s is None or self.last_t_s is None:
            self.interval_start_s = self.last_t_s = t_s
            return None
        dt = max(0.0, min(t_s - self.last_t_s, 2.0 * sample_period_s))
        rate = arrival_rate_rps if math.isfinite(arrival_rate_rps) else 0.0
        self.count += max(0.0, rate) * dt
        self.last_t_s = t_s
        elapsed = t_s - self.interval_start_s
        if elapsed < self.interval_s - 1e-9:
            return None
        self.predictor.add(self.count)
        self.count, self.interval_start_s = 0.0, t_s
        return self.predictor.predict() / elapsed
