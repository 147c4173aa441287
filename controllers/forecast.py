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
model is warm (``warmup_steps``) :meth:`LoadForecaster.forecast` repeats the
last value (naive): ``2 * season_length + 2`` steps with seasons; for Holt's
linear trend ``2 + ceil(1 / beta)`` (12 at the default ``beta=0.1``), since
River starts the trend at the difference of the first two values and
smoothing by ``beta`` forgets that guess over about ``1 / beta`` steps (fed
6.6, 9.4, 8.3, 8.5 req/s it forecast 20 req/s four steps ahead, and the
scaler's headroom, a running mean of such errors, carried that start for the
rest of a run); 2 for the others.

Error tracking is online: before each :meth:`~LoadForecaster.learn` the
forecast made one step earlier and the one made ``horizon_steps`` earlier
are scored against the new value (MAE; MAPE over non-zero values only,
unlike River's MAPE which counts ``y = 0`` as a zero error), and the mean of
the ``horizon_steps`` forecasts made ``horizon_steps`` earlier against the
mean of the values they forecast (``errors_hmean``: the error on the demand
a replica ordered then serves, over its whole horizon).  Only forecasts made
by a warm model are scored.

On drift (:mod:`controllers.drift`) call :meth:`~LoadForecaster.reset`: the
model is rebuilt empty and relearns from the next value (River's models have
no forgetting knob beyond their smoothing weights, so a *reweight* would be
a different model); the error statistics are kept and ``n_resets`` rises.

Snapshots are plain data (:mod:`controllers.state`):
:meth:`LoadForecaster.to_state` returns a JSON-able dict and
:meth:`LoadForecaster.from_state` rebuilds the forecaster from one,
validating every field; the restored forecaster makes the same forecasts and
error statistics as the original on the same continuation.  The model
parameters are therefore limited to the scalars named above (no custom
regressor), and the River models are read field by field, an allowlist of
exactly ``river.time_series.HoltWinters`` and ``river.time_series.SNARIMAX``
(checked against ``model``):

* Holt-Winters: the level, trend and season deques, the values kept for
  initialisation and the initialised flag (at most ``season_length + 1``
  numbers each).
* SNARIMAX: the value, differenced-value and error histories, and its
  regressor, River's default ``StandardScaler | LinearRegression`` (SGD):
  per-feature counts, means and variances, the weights, the intercept and
  the optimiser's step count.  Maps are stored as ``[name, value]`` lists in
  River's order (it fixes the order of float sums); names must be the lag
  features the orders imply.
* EWMA: its level.

Every length is checked against the number of values learnt since the last
reset (``n_model``), so a snapshot that could not have come from a real
forecaster is refused.

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
from collections import Counter, defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from river import compose, linear_model, optim, preprocessing, time_series, utils

from controllers.errors import ParameterError
from controllers.state import Obj, as_float, as_int, as_list, enc_float, float_list, header, open_state, show, show_key

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

    def to_state(self) -> dict[str, Any]:
        """Plain data: ``{"n", "sum_abs", "n_pct", "sum_pct"}``."""
        return {
            "n": self.n,
            "sum_abs": enc_float(self.sum_abs),
            "n_pct": self.n_pct,
            "sum_pct": enc_float(self.sum_pct),
        }

    @classmethod
    def from_state(cls, data: object, path: str = "state") -> ErrorStats:
        """Inverse of :meth:`to_state`; :class:`ParameterError` names ``path.field``.

        >>> ErrorStats.from_state({"n": 2, "sum_abs": 1.0, "n_pct": 3, "sum_pct": 0.1})
        Traceback (most recent call last):
        ...
        controllers.errors.ParameterError: state.n_pct=3: must lie in [0, 2]
        """
        o = Obj(data, path, ("n", "sum_abs", "n_pct", "sum_pct"))
        n = o.get_int("n", 0, MAX_COUNT)
        return cls(
            n=n,
            sum_abs=_non_negative(o, "sum_abs"),
            n_pct=o.get_int("n_pct", 0, n),
            sum_pct=_non_negative(o, "sum_pct"),
        )


class _Ewma:
    """Simple exponential smoothing (``controllers.forecast.Ewma`` in snapshots)."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.level: float | None = None

    def learn_one(self, y: float) -> None:
        self.level = y if self.level is None else self.level + self.alpha * (y - self.level)

    def forecast(self, horizon: int) -> list[float]:
        return [self.level if self.level is not None else 0.0] * horizon


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def _warmup(model: Model, season: int | None, params: Mapping[str, Any]) -> int:
    """Steps before the model's forecasts are used and scored (module doc).

    >>> _warmup("holtwinters", None, {"alpha": 0.5, "beta": 0.1}), _warmup("holtwinters", 4, {})
    (12, 10)
    >>> _warmup("holtwinters", None, {"beta": 0.3}), _warmup("ewma", None, {})
    (6, 2)
    """
    if season:
        return 2 * season + 2
    if model == "holtwinters":
        return 2 + math.ceil(1.0 / float(params["beta"]) - 1e-9)
    return 2


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
        if horizon_steps > MAX_HORIZON:
            raise ParameterError(f"horizon_steps={horizon_steps}: must be <= {MAX_HORIZON}")
        if season_length is not None and season_length > MAX_SEASON:
            raise ParameterError(f"season_length={season_length}: must be <= {MAX_SEASON}")
        self.model: Model = model
        self.horizon_steps = horizon_steps
        self.season_length = season_length
        self.params = {**_defaults(model, season_length), **model_params}
        _check_params(model, season_length, self.params)
        self.warmup_steps = _warmup(model, season_length, self.params)
        self.errors_1 = ErrorStats()
        self.errors_h = ErrorStats()
        self.errors_hmean = ErrorStats()
        self._recent: deque[float] = deque(maxlen=horizon_steps)  # the last values, for errors_hmean
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
        except (TypeError, ValueError, OverflowError) as exc:
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
        self._recent.append(y)
        if len(self._pending) == self.horizon_steps and self._pending[0] is not None:
            self.errors_h.add(y, self._pending[0][-1])
            if len(self._recent) == self.horizon_steps:
                self.errors_hmean.add(math.fsum(self._recent) / self.horizon_steps, _mean(self._pending[0]))
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

    def to_state(self) -> dict[str, Any]:
        """Plain data (JSON-able, no NaN): everything :meth:`from_state` needs.

        Fields: ``type``, ``version``, ``model``, ``horizon_steps``,
        ``season_length``, ``params`` (the model parameters, defaults
        included), ``n_seen``, ``n_resets``, ``n_model`` (values learnt since
        the last reset), ``last`` (``None`` before any value), ``errors_1`` /
        ``errors_h`` / ``errors_hmean`` (:meth:`ErrorStats.to_state`),
        ``recent`` (the last ``min(n_seen, horizon_steps)`` values),
        ``pending`` (the forecasts
        awaiting scoring, oldest first, ``None`` where the model was cold) and
        ``learner``: the model, ``{"class": ..., ...}`` (see the module doc).
        Non-finite floats are the strings ``"nan"``, ``"inf"``, ``"-inf"``.

        Examples
        --------
        >>> import json
        >>> f = LoadForecaster("ewma", horizon_steps=2)
        >>> for y in [3.0, 5.0, 4.0]:
        ...     f.learn(y)
        >>> g = LoadForecaster.from_state(json.loads(json.dumps(f.to_state())))
        >>> g.forecast() == f.forecast(), g.to_state() == f.to_state()
        (True, True)
        >>> LoadForecaster.from_state({**f.to_state(), "learner": {"class": "os.system", "level": 4.0}})
        Traceback (most recent call last):
        ...
        controllers.errors.ParameterError: state.learner.class='os.system': must be 'controllers.forecast.Ewma' for model 'ewma'
        """
        if self.model == "holtwinters":
            learner = _holtwinters_to_state(self._model)
        elif self.model == "snarimax":
            learner = _snarimax_to_state(self._model)
        else:
            learner = {
                "class": EWMA_CLASS,
                "level": None if self._model.level is None else enc_float(self._model.level),
            }
        return {
            **header(STATE_TYPE),
            "model": self.model,
            "horizon_steps": self.horizon_steps,
            "season_length": self.season_length,
            "params": dict(self.params),
            "n_seen": self.n_seen,
            "n_resets": self.n_resets,
            "n_model": self._n_model,
            "last": None if self._last is None else enc_float(self._last),
            "errors_1": self.errors_1.to_state(),
            "errors_h": self.errors_h.to_state(),
            "errors_hmean": self.errors_hmean.to_state(),
            "recent": [enc_float(v) for v in self._recent],
            "pending": [None if p is None else [enc_float(v) for v in p] for p in self._pending],
            "learner": learner,
        }

    @classmethod
    def from_state(cls, data: Mapping[str, Any]) -> LoadForecaster:
        """Rebuild a forecaster from :meth:`to_state` output.

        Raises :class:`~controllers.errors.ParameterError` naming the field for
        anything malformed: a missing or unknown field, a wrong type, an
        unknown ``version``, a ``learner.class`` other than the one ``model``
        builds, lengths that do not fit ``n_model`` and the parameters.
        """
        o = open_state(data, STATE_TYPE, _STATE_KEYS)
        model = o.get_str("model", ("holtwinters", "snarimax", "ewma"))
        horizon = o.get_int("horizon_steps", 1, MAX_HORIZON)
        season = None if o.raw("season_length") is None else o.get_int("season_length", 2, MAX_SEASON)
        raw_params = o.raw("params")
        if not isinstance(raw_params, Mapping) or not all(isinstance(k, str) for k in raw_params):
            raise ParameterError(f"state.params={show(raw_params)}: must be an object of parameters")
        _check_params(model, season, raw_params)  # before the call: a name like "model" must not reach it
        f = cls(model, horizon, season, **raw_params)  # type: ignore[arg-type]
        if f.params != dict(raw_params):
            raise ParameterError(f"state.params={show(raw_params)}: must list every parameter, defaults included")
        f.n_seen = o.get_int("n_seen", 0, MAX_COUNT)
        f.n_resets = o.get_int("n_resets", 0, MAX_COUNT)
        f._n_model = n_model = o.get_int("n_model", 0, f.n_seen)
        f._last = o.get_opt_float("last")
        if (f._last is None) != (f.n_seen == 0):
            raise ParameterError(f"state.last={show(o.raw('last'))}: must be null exactly when n_seen is 0")
        f.errors_1 = ErrorStats.from_state(o.raw("errors_1"), o.at("errors_1"))
        f.errors_h = ErrorStats.from_state(o.raw("errors_h"), o.at("errors_h"))
        f.errors_hmean = ErrorStats.from_state(o.raw("errors_hmean"), o.at("errors_hmean"))
        recent = float_list(o.raw("recent"), o.at("recent"), length=min(f.n_seen, horizon))
        for i, v in enumerate(recent):
            if not math.isfinite(v):
                raise ParameterError(f"{o.at('recent')}[{i}]={show(v)}: must be a finite number")
        f._recent.extend(recent)
        for name, stats in (("errors_1", f.errors_1), ("errors_h", f.errors_h), ("errors_hmean", f.errors_hmean)):
            if stats.n > f.n_seen:
                raise ParameterError(f"state.{name}.n={stats.n}: more scores than values seen ({f.n_seen})")
        pending = as_list(o.raw("pending"), o.at("pending"), length=min(n_model, horizon))
        first = n_model - len(pending) + 1  # the learn (since the reset) after which pending[0] was made
        for i, item in enumerate(pending):
            path = f"{o.at('pending')}[{i}]"
            if first + i >= f.warmup_steps:
                f._pending.append(float_list(item, path, length=horizon))
            elif item is not None:
                raise ParameterError(f"{path}={show(item)}: must be null (the model was not warm then)")
            else:
                f._pending.append(None)
        learner, path = o.raw("learner"), o.at("learner")
        if model == "holtwinters":
            _holtwinters_restore(f._model, learner, path, n_model)
        elif model == "snarimax":
            _snarimax_restore(f._model, learner, path, n_model)
        else:
            lo = Obj(learner, path, ("class", "level"))
            lo.check_class(EWMA_CLASS, "model 'ewma'")
            f._model.level = lo.get_opt_float("level")
            if (f._model.level is None) != (n_model == 0):
                raise ParameterError(
                    f"{lo.at('level')}={show(lo.raw('level'))}: must be null exactly when n_model is 0"
                )
        return f


# -- plain-data state ------------------------------------------------------------

STATE_TYPE = "LoadForecaster"
_STATE_KEYS = (
    "model",
    "horizon_steps",
    "season_length",
    "params",
    "n_seen",
    "n_resets",
    "n_model",
    "last",
    "errors_1",
    "errors_h",
    "errors_hmean",
    "recent",
    "pending",
    "learner",
)
HOLT_WINTERS_CLASS = "river.time_series.HoltWinters"
SNARIMAX_CLASS = "river.time_series.SNARIMAX"
EWMA_CLASS = "controllers.forecast.Ewma"
MAX_HORIZON = 10_000  # pending forecasts hold horizon**2 numbers
MAX_SEASON = 100_000
MAX_ORDER = 100  # SNARIMAX p, d, q, sp, sd, sq
MAX_COUNT = 2**63  # bound on the counters read back


def _non_negative(o: Obj, key: str) -> float:
    x = o.get_float(key)
    if x < 0.0:
        raise ParameterError(f"{o.at(key)}={x!r}: must be >= 0")
    return x


def _check_params(model: str, season: int | None, params: Mapping[str, Any]) -> None:
    """Only the scalar parameters of ``model``, of their types; seasons come from ``season_length``.

    A snapshot must be plain data, so a custom SNARIMAX ``regressor`` is not
    taken; ``seasonality`` / ``m`` must agree with ``season_length`` (the
    warm-up is derived from it).
    """
    for name, value in params.items():
        path = f"params.{name}"
        if model == "holtwinters" and name in ("alpha", "beta", "gamma"):
            if value is not None or name == "alpha":
                as_float(value, path, 0.0, 1.0)
        elif model == "holtwinters" and name == "seasonality":
            if as_int(value, path) != (season or 0):
                raise ParameterError(f"{path}={show(value)}: must equal season_length={season} (set that instead)")
        elif model == "holtwinters" and name == "multiplicative":
            if not isinstance(value, bool):
                raise ParameterError(f"{path}={show(value)}: must be a bool")
        elif model == "snarimax" and name in ("p", "d", "q", "sp", "sd", "sq"):
            as_int(value, path, 0, MAX_ORDER)
        elif model == "snarimax" and name == "m":
            if as_int(value, path) != (season or 1):
                raise ParameterError(f"{path}={show(value)}: must equal season_length={season} (set that instead)")
        elif model == "ewma" and name == "alpha":
            if not 0.0 < as_float(value, path, finite=True) <= 1.0:
                raise ParameterError(f"{path}={show(value)}: must lie in (0, 1]")
        else:
            raise ParameterError(f"params.{show_key(name)}: not a {model} parameter (plain scalars only)")


# Holt-Winters: component deques (River subclasses of deque), first values, flag.

_HW_KEYS = ("class", "initialized", "first_values", "level", "trend", "season")


def _holtwinters_to_state(m: time_series.HoltWinters) -> dict[str, Any]:
    if type(m) is not time_series.HoltWinters:
        raise TypeError(f"not a HoltWinters: {type(m).__name__}")
    return {
        "class": HOLT_WINTERS_CLASS,
        "initialized": bool(m._initialized),
        "first_values": [enc_float(v) for v in m._first_values],
        "level": [enc_float(v) for v in m.level],
        "trend": None if m.trend is None else [enc_float(v) for v in m.trend],
        "season": None if m.season is None else [enc_float(v) for v in m.season],
    }


def _holtwinters_restore(m: time_series.HoltWinters, data: object, path: str, n_model: int) -> None:
    """Load the fields into ``m`` (freshly built from the same parameters)."""
    o = Obj(data, path, _HW_KEYS)
    o.check_class(HOLT_WINTERS_CLASS, "model 'holtwinters'")
    s = m.seasonality or 0
    k0 = max(2, s)  # values River gathers before it initialises
    initialized = n_model >= k0
    if o.get_bool("initialized") != initialized:
        raise ParameterError(
            f"{o.at('initialized')}={show(o.raw('initialized'))}: must be {initialized} after {n_model} values"
        )
    n_level = min(n_model - k0 + 1, 2) if initialized else 0
    first = o.get_floats("first_values", length=min(n_model, k0))
    level = o.get_floats("level", length=n_level)
    for name, comp, n in (("trend", m.trend, n_level), ("season", m.season, min(n_model, s + 1) if initialized else 0)):
        if comp is None:
            if o.raw(name) is not None:
                raise ParameterError(f"{o.at(name)}={show(o.raw(name))}: must be null (this model has no {name})")
        else:
            comp.extend(o.get_floats(name, length=n))
    m.level.extend(level)
    m._first_values = first
    m._initialized = initialized


# SNARIMAX: histories and River's default regressor, StandardScaler | LinearRegression (SGD).

_SN_KEYS = ("class", "y_hist", "y_diff", "errors", "scaler", "regression")


def _feature_names(m: time_series.SNARIMAX) -> list[str]:
    """The lag features SNARIMAX._add_lag_features can make for these orders."""
    return (
        [f"y-{t + 1}" for t in range(m.p)]
        + [f"sy-{t + 1}" for t in range(m.m - 1, m.m * m.sp, m.m)]
        + [f"e-{t + 1}" for t in range(m.q)]
        + [f"se-{t + 1}" for t in range(m.m - 1, m.m * m.sq, m.m)]
    )


def _default_parts(m: time_series.SNARIMAX) -> tuple[Any, Any]:
    """The scaler and regression of River's default regressor; RuntimeError for anything else."""
    reg: Any = m.regressor
    ok = type(reg) is compose.Pipeline and list(reg.steps) == ["StandardScaler", "LinearRegression"]
    if ok:
        sc, lr = reg.steps["StandardScaler"], reg.steps["LinearRegression"]
        ok = (
            type(sc) is preprocessing.StandardScaler
            and sc.with_std is True
            and sc.window_size is None
            and type(lr) is linear_model.LinearRegression
            and type(lr.optimizer) is optim.SGD
            and type(lr.optimizer.lr) is optim.schedulers.Constant
            and type(lr.loss) is optim.losses.Squared
            and type(lr.intercept_lr) is optim.schedulers.Constant
            and type(lr.initializer) is optim.initializers.Zeros
            and lr.l1 == 0
            and lr.l2 == 0
        )
    if not ok:
        raise RuntimeError(f"SNARIMAX regressor {reg!r}: only River's default one has a plain-data state here")
    return sc, lr


def _snarimax_to_state(m: time_series.SNARIMAX) -> dict[str, Any]:
    if type(m) is not time_series.SNARIMAX:
        raise TypeError(f"not a SNARIMAX: {type(m).__name__}")
    sc, lr = _default_parts(m)
    return {
        "class": SNARIMAX_CLASS,
        "y_hist": [enc_float(v) for v in m.y_hist],
        "y_diff": [enc_float(v) for v in m.y_diff],
        "errors": [enc_float(v) for v in m.errors],
        "scaler": {
            "counts": [[k, int(v)] for k, v in sc.counts.items()],
            "means": [[k, enc_float(v)] for k, v in sc.means.items()],
            "vars": [[k, enc_float(v)] for k, v in sc.vars.items()],
        },
        "regression": {
            "intercept": enc_float(lr.intercept),
            "weights": [[k, enc_float(v)] for k, v in lr._weights.to_dict().items()],
            "n_iterations": int(lr.optimizer.n_iterations),
        },
    }


def _snarimax_restore(m: time_series.SNARIMAX, data: object, path: str, n_model: int) -> None:
    """Load the fields into ``m`` (freshly built from the same parameters)."""
    o = Obj(data, path, _SN_KEYS)
    o.check_class(SNARIMAX_CLASS, "model 'snarimax'")
    sc, lr = _default_parts(m)
    n_fit = max(0, n_model - m.differencer.n_required_past_values)  # values the regressor learnt
    y_hist = o.get_floats("y_hist", length=min(n_model, m.y_hist.maxlen or 0))
    y_diff = o.get_floats("y_diff", length=min(n_fit, m.y_diff.maxlen or 0))
    errors = o.get_floats("errors", length=min(n_fit, m.errors.maxlen or 0))
    names = _feature_names(m)
    so = o.get_obj("scaler", ("counts", "means", "vars"))
    counts = so.get_pairs("counts", names, lambda v, p: as_int(v, p, 0, n_fit))
    means = so.get_pairs("means", names, as_float)
    variances = so.get_pairs("vars", names, _variance)
    ro = o.get_obj("regression", ("intercept", "weights", "n_iterations"))
    intercept = ro.get_float("intercept")
    weights = ro.get_pairs("weights", names, as_float)
    ro.get_int("n_iterations", n_fit, n_fit)
    m.y_hist.extend(y_hist)
    m.y_diff.extend(y_diff)
    m.errors.extend(errors)
    sc.counts = Counter()
    for k, n in counts:
        sc.counts[k] = n
    sc.means = defaultdict(float, means)
    sc.vars = defaultdict(float, variances)
    lr.intercept = intercept
    lr._weights = utils.VectorDict(dict(weights))
    lr.optimizer.n_iterations = n_fit


def _variance(value: object, path: str) -> float:
    x = as_float(value, path)
    if x < 0.0:  # a negative variance would make the scaler's square root complex
        raise ParameterError(f"{path}={x!r}: must be >= 0")
    return x
