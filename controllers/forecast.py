"""Online load forecasting per interval, with River's time-series models.

One :class:`LoadForecaster` per series (arrival rate per interval, token
volume per interval, ...).  Models:

* ``"holtwinters"``: :class:`river.time_series.HoltWinters`, additive; with
  ``season_length`` a seasonal model (defaults ``alpha=0.1, beta=0.01,
  gamma=0.3``), without it Holt's linear trend (``alpha=0.5, beta=0.1``).
  River 0.26 initialises *additive* seasonal terms as ratios ``y / level``
  (as for the multiplicative model) and updates them against the previous
  level, so the first seasons forecast badly and large ``gamma`` with
  ``alpha`` can fail to settle; the defaults above converge on a clean sine
  (measured: one-step error below 0.1 % of the amplitude after 25 seasons).
* ``"snarimax"``: :class:`river.time_series.SNARIMAX`, default ``p=2, d=1``;
  with ``season_length`` ``p=2, d=0, m=season_length, sp=1, sd=1`` (one
  seasonal difference: exact on a pure seasonal pattern).
* ``"ewma"``: simple exponential smoothing here (weight ``alpha``, default
  0.3), flat forecast; the robust baseline.

Any of the defaults can be overridden with ``**model_params``.  Until the
model is warm (``warmup_steps``: 2, or ``2 * season_length + 2`` with
seasons) :meth:`LoadForecaster.forecast` repeats the last value (naive).

Error tracking is online: before each :meth:`~LoadForecaster.learn` the
forecast made one step earlier and the one made ``horizon_steps`` earlier
are scored against the new value (MAE; MAPE over non-zero values only,
unlike River's MAPE which counts ``y = 0`` as a zero error).  Only forecasts
made by a warm model are scored.

On drift (:mod:`controllers.drift`) call :meth:`~LoadForecaster.reset`: the
model is rebuilt empty and relearns from the next value (River's models have
no forgetting knob beyond their smoothing weights, so a *reweight* would be
a different model); the error statistics are kept and ``n_resets`` rises.

Examples
--------
>>> f = LoadForecaster("holtwinters", horizon_steps=3)
>>> for k in range(40):
...     f.learn(10.0 + 2.0 * k)
>>> [round(v) for v in f.forecast()], f.errors_1.mae < 0.1
([90, 92, 94], True)
"""

from __future__ import annotations

import math
import pickle
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from river import time_series

from controllers.errors import ParameterError

__all__ = ["ErrorStats", "LoadForecaster"]

Model = Literal["holtwinters", "snarimax", "ewma"]


@dataclass
class ErrorStats:
    """Running forecast errors: MAE over all, MAPE over non-zero actuals."""

    n: int = 0
    sum_abs: float = 0.0
    n_pct: int = 0
    sum_pct: float = 0.0

    def add(self, y: float, y_hat: float) -> None:
        """Score one forecast."""
        self.n += 1
        self.sum_abs += abs(y - y_hat)
        if y != 0.0:
            self.n_pct += 1
            self.sum_pct += abs(y - y_hat) / abs(y)

    @property
    def mae(self) -> float | None:
        """Mean absolute error (``None`` before any score)."""
        return self.sum_abs / self.n if self.n else None

    @property
    def mape(self) -> float | None:
        """Mean absolute percentage error, in percent."""
        return 100.0 * self.sum_pct / self.n_pct if self.n_pct else None


class _Ewma:
    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.level: float | None = None

    def learn_one(self, y: float) -> None:
        self.level = y if self.level is None else self.level + self.alpha * (y - self.level)

    def forecast(self, horizon: int) -> list[float]:
        return [self.level if self.level is not None else 0.0] * horizon


def _defaults(model: Model, season: int | None) -> dict[str, Any]:
    if model == "holtwinters":
        if season:
            return {"alpha": 0.1, "beta": 0.01, "gamma": 0.3, "seasonality": season}
        return {"alpha": 0.5, "beta": 0.1}
    if model == "snarimax":
        if season:
            return {"p": 2, "d": 0, "q": 0, "m": season, "sp": 1, "sd": 1, "sq": 0}
        return {"p": 2, "d": 1, "q": 0}
    return {"alpha": 0.3}


class LoadForecaster:
    """Online forecaster of one per-interval series.

    Parameters
    ----------
    model : "holtwinters", "snarimax" or "ewma"
    horizon_steps : default horizon of :meth:`forecast`, and the lag at
        which the horizon error is scored, >= 1.
    season_length : steps per season (e.g. 24 hourly intervals), or None.
    **model_params : override the model's defaults (see module doc).

    Examples
    --------
    >>> LoadForecaster("prophet", horizon_steps=1)
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: model='prophet': must be 'holtwinters', 'snarimax' or 'ewma'
    """

    def __init__(
        self,
        model: Model,
        horizon_steps: int,
        season_length: int | None = None,
        **model_params: Any,
    ) -> None:
        if model not in ("holtwinters", "snarimax", "ewma"):
            raise ParameterError(f"model={model!r}: must be 'holtwinters', 'snarimax' or 'ewma'")
        if isinstance(horizon_steps, bool) or not isinstance(horizon_steps, int) or horizon_steps < 1:
            raise ParameterError(f"horizon_steps={horizon_steps!r}: must be an int >= 1")
        if season_length is not None and (
            isinstance(season_length, bool) or not isinstance(season_length, int) or season_length < 2
        ):
            raise ParameterError(f"season_length={season_length!r}: must be an int >= 2 or None")
        if model == "ewma" and season_length is not None:
            raise ParameterError("season_length: the ewma model has no seasons")
        self.model: Model = model
        self.horizon_steps = horizon_steps
        self.season_length = season_length
        self.params = {**_defaults(model, season_length), **model_params}
        self.warmup_steps = 2 * season_length + 2 if season_length else 2
        self.errors_1 = ErrorStats()
        self.errors_h = ErrorStats()
        self.n_seen = 0
        self.n_resets = 0
        self._model = self._build()
        self._n_model = 0
        self._last: float | None = None
        self._pending: deque[list[float] | None] = deque(maxlen=horizon_steps)

    def _build(self) -> Any:
        try:
            if self.model == "holtwinters":
                return time_series.HoltWinters(**self.params)  # type: ignore[no-untyped-call]
            if self.model == "snarimax":
                return time_series.SNARIMAX(**self.params)
            alpha = self.params.get("alpha")
            if set(self.params) != {"alpha"} or not isinstance(alpha, float | int):
                raise ValueError("ewma takes one parameter, alpha")
            if not 0.0 < alpha <= 1.0:
                raise ValueError(f"alpha={alpha} must lie in (0, 1]")
            return _Ewma(float(alpha))
        except (TypeError, ValueError) as exc:
            raise ParameterError(f"params={self.params!r}: {self.model} rejects them ({exc})") from exc

    @property
    def ready(self) -> bool:
        """Whether the model (not the naive fallback) makes the forecasts."""
        return self._n_model >= self.warmup_steps

    def learn(self, y: float) -> None:
        """Score the pending forecasts against ``y``, then learn it."""
        if isinstance(y, bool) or not isinstance(y, float | int) or not math.isfinite(y):
            raise ParameterError(f"y={y!r}: must be a finite number")
        y = float(y)
        if self._pending and self._pending[-1] is not None:
            self.errors_1.add(y, self._pending[-1][0])
        if len(self._pending) == self.horizon_steps and self._pending[0] is not None:
            self.errors_h.add(y, self._pending[0][-1])
        self._model.learn_one(y)
        self._n_model += 1
        self.n_seen += 1
        self._last = y
        self._pending.append(self._model_forecast(self.horizon_steps) if self.ready else None)

    def _model_forecast(self, h: int) -> list[float]:
        return [float(v) for v in self._model.forecast(horizon=h)]

    def forecast(self, h: int | None = None) -> list[float]:
        """The next ``h`` values (default ``horizon_steps``); naive until warm.

        Returns an empty list before any value has been learnt.
        """
        h = self.horizon_steps if h is None else h
        if isinstance(h, bool) or not isinstance(h, int) or h < 1:
            raise ParameterError(f"h={h!r}: must be an int >= 1")
        if self._last is None:
            return []
        if not self.ready:
            return [self._last] * h
        return self._model_forecast(h)

    def reset(self) -> None:
        """Drift hook: rebuild the model empty; keep the error statistics."""
        self._model = self._build()
        self._n_model = 0
        self._pending.clear()
        self.n_resets += 1

    def to_bytes(self) -> bytes:
        """Snapshot (pickle) of the forecaster and its River model."""
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def from_bytes(cls, data: bytes) -> LoadForecaster:
        """Inverse of :meth:`to_bytes` (trusted snapshots only: it unpickles)."""
        obj = pickle.loads(data)
        if not isinstance(obj, cls):
            raise ParameterError(f"data: unpickled a {type(obj).__name__}, not a {cls.__name__}")
        return obj
