"""Delay compensation: a linear Kalman filter, RK4 look-ahead, loop delay.

docs/model.md §9 (observer).  The hidden state is ``x = [u, q, eps]``:
utilisation (0..1), queue length per replica, SLO-violation rate.  The
measurement is the same three signals, noisy (``H = I``); a missing signal
(``None``) is skipped for that update.

Process model (linear, per component ``i``, no coupling)::

    dx_i/dt = (s_i - x_i) / lag_i    where a steady state s_i is supplied
    dx_i/dt = 0                      where it is not (random walk)

plus white process noise of intensity ``q_i`` per second.  ``s`` is an
*input*: the level the system relaxes to under the current load, e.g. from
:func:`load_steady_state` (utilisation ``min(rho, 1)`` and the M/M/1 queue
``rho^2 / (1 - rho)`` for load/capacity ratio ``rho``; an approximation, not
a fitted model) or from a load forecast (feed-forward).  Without inputs the
filter is a plain random-walk smoother.  The model is deliberately simple:
it is honest about what is known (a lag toward a load-determined level),
and the lags and noises are parameters to fit, not claims.

Discretisation over ``dt`` is exact: ``F_i = exp(-dt/lag_i)``,
``x' = F x + (1 - F) s``, ``Q_i = q_i lag_i (1 - F_i^2) / 2`` (``q_i dt`` for
a random walk).  :func:`predict_ahead` integrates the same ODE forward over
the loop delay ``tau`` with classical RK4 (docs/model.md §9 (observer)), so the
controller can act on ``x(t + tau)``; it ignores noise (the mean path).  Given
the measurement, it starts a component with no steady state from it: a random
walk predicts no change, and the filter's estimate of one only trails it.
Estimates are not clipped to their physical ranges (clipping would bias a
linear filter); callers clip what they display.

Covariance matching (docs/model.md §9): a measurement further from the
prediction than the model's noises allow (normalised innovation squared
``nu_i^2 / S_ii`` above ``KalmanParams.innovation_gate``, 25 = five standard
deviations) means the model's uncertainty was too small, not that the
measurement is wrong: the prior variance of that component is raised until
``S_ii = nu_i^2`` before the correction, so the estimate lands on the
measurement (within ``r_i / |nu_i|``) in that window instead of trailing it
for several (a violation rate gone from 0.8 to 0 is seen as gone at once).
A delay compensation must start from the current best estimate, and a filter
that lags a step of the measurement by windows is not one.

:class:`LoopDelay` estimates ``tau = tau_ctrl + tau_net + tau_act`` as EWMAs
of the measured parts of each command's life: basis -> issued (control),
issued -> applied (network and queueing to the executor), applied ->
effective (actuation: replicas loading until they serve).

Examples
--------
>>> p = KalmanParams()
>>> s = KalmanState.initial((0.5, 2.0, 0.02))
>>> s = update(p, s, (0.6, 2.5, 0.03), dt_s=10.0)
>>> [round(v, 3) for v in predict_ahead(p, s, 0.0)] == [round(v, 3) for v in s.x]
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from controllers.errors import ParameterError, check_number

__all__ = [
    "KalmanParams",
    "KalmanState",
    "LoopDelay",
    "load_steady_state",
    "predict_ahead",
    "update",
]

Vec3 = tuple[float, float, float]
Steady = Sequence[float | None] | None
_Arr = npt.NDArray[np.float64]


def _vec3(name: str, values: Sequence[float], positive: bool) -> Vec3:
    if len(values) != 3:
        raise ParameterError(f"{name}={values!r}: need 3 values (u, q, eps)")
    out = tuple(check_number(name, v) for v in values)
    if positive and min(out) <= 0.0:
        raise ParameterError(f"{name}={values!r}: every value must be > 0")
    return out[0], out[1], out[2]


@dataclass(frozen=True)
class KalmanParams:
    """Noise and lag of the model, per component (u, q, eps); validated.

    ``q_diag``: process-noise intensity (variance per second); ``r_diag``:
    measurement-noise variance; ``lag_s``: relaxation time constants toward
    the steady state when one is given.  The defaults are placeholders of the
    right order (utilisation measured to +-5 %, queue to +-0.5, violation
    rate to +-1 %), not fitted values.  ``innovation_gate``: the normalised
    innovation squared above which a component's prior variance is matched
    to its innovation (see the module doc; ``math.inf``: a plain filter).

    Examples
    --------
    >>> KalmanParams(r_diag=(1e-3, 0.0, 1e-4))
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: r_diag=(0.001, 0.0, 0.0001): every value must be > 0
    """

    q_diag: Vec3 = (2e-5, 5e-3, 1e-6)
    r_diag: Vec3 = (2.5e-3, 0.25, 1e-4)
    lag_s: Vec3 = (30.0, 30.0, 60.0)
    innovation_gate: float = 25.0

    def __post_init__(self) -> None:
        for name in ("q_diag", "r_diag", "lag_s"):
            object.__setattr__(self, name, _vec3(name, getattr(self, name), positive=True))
        gate = self.innovation_gate
        if isinstance(gate, bool) or not isinstance(gate, int | float) or math.isnan(gate) or gate < 1.0:
            raise ParameterError(f"innovation_gate={gate!r}: must be >= 1 (math.inf: no matching)")


@dataclass(frozen=True)
class KalmanState:
    """Estimate ``x`` and covariance ``p`` (3x3, nested tuples); plain data via to_dict/from_dict.

    Examples
    --------
    >>> s = KalmanState.initial((0.5, 1.0, 0.0), var=(0.1, 1.0, 0.01))
    >>> KalmanState.from_dict(s.to_dict()) == s, s.p[1][1]
    (True, 1.0)
    """

    x: Vec3
    p: tuple[Vec3, Vec3, Vec3]
    steps: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "x", _vec3("x", self.x, positive=False))
        if len(self.p) != 3:
            raise ParameterError(f"p={self.p!r}: need a 3x3 covariance")
        rows = tuple(_vec3("p", row, positive=False) for row in self.p)
        m = np.array(rows)
        if not np.allclose(m, m.T, rtol=1e-9, atol=1e-12) or min(np.diag(m)) < 0.0:
            raise ParameterError(f"p={self.p!r}: covariance must be symmetric with diag >= 0")
        object.__setattr__(self, "p", rows)

    @classmethod
    def initial(cls, x0: Sequence[float], var: Sequence[float] = (1.0, 100.0, 1.0)) -> KalmanState:
        """Start at ``x0`` with a diagonal covariance ``var`` (vague by default)."""
        v = _vec3("var", var, positive=True)
        return cls(x=_vec3("x0", x0, positive=False), p=_as_p(np.diag(v)))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields."""
        return {"x": list(self.x), "p": [list(r) for r in self.p], "steps": self.steps}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KalmanState:
        """Inverse of :meth:`to_dict`."""
        p = data["p"]
        return cls(x=tuple(data["x"]), p=(tuple(p[0]), tuple(p[1]), tuple(p[2])), steps=data["steps"])


def _as_p(m: _Arr) -> tuple[Vec3, Vec3, Vec3]:
    m = 0.5 * (m + m.T)
    r = [(float(a), float(b), float(c)) for a, b, c in m]
    return r[0], r[1], r[2]


def _steady(steady: Steady) -> list[float | None]:
    if steady is None:
        return [None, None, None]
    if len(steady) != 3:
        raise ParameterError(f"steady={steady!r}: need 3 values (u, q, eps) or None each")
    return [None if s is None else check_number("steady", s) for s in steady]


def _deriv(params: KalmanParams, x: _Arr, s: list[float | None]) -> _Arr:
    return np.array([0.0 if s[i] is None else (s[i] - x[i]) / params.lag_s[i] for i in range(3)])


def update(
    params: KalmanParams,
    state: KalmanState,
    z: Sequence[float | None],
    dt_s: float,
    steady: Steady = None,
) -> KalmanState:
    """Predict over ``dt_s`` with the model, then correct with measurement ``z``.

    Parameters
    ----------
    params, state
    z : three floats (u, q, eps); ``None`` where a signal is missing.
    dt_s : seconds since the previous update, >= 0.
    steady : steady state per component (``None``: random walk), see module doc.

    Examples
    --------
    >>> p, s = KalmanParams(), KalmanState.initial((0.0, 0.0, 0.0))
    >>> for _ in range(50):
    ...     s = update(p, s, (0.7, 3.0, 0.05), dt_s=10.0)
    >>> [round(v, 2) for v in s.x]
    [0.7, 3.0, 0.05]
    """
    if check_number("dt_s", dt_s) < 0.0:
        raise ParameterError(f"dt_s={dt_s}: must be >= 0")
    if len(z) != 3:
        raise ParameterError(f"z={z!r}: need 3 values (u, q, eps) or None each")
    s = _steady(steady)
    x, p = np.array(state.x), np.array(state.p)
    lag, q = np.array(params.lag_s), np.array(params.q_diag)
    lagged = np.array([v is not None for v in s])
    f = np.where(lagged, np.exp(-dt_s / lag), 1.0)
    target = np.array([x[i] if s[i] is None else s[i] for i in range(3)])
    x = f * x + (1.0 - f) * target
    qd = np.where(lagged, q * lag * (1.0 - f**2) / 2.0, q * dt_s)
    p = f[:, None] * p * f[None, :] + np.diag(qd)
    rows = [i for i in range(3) if z[i] is not None]
    if rows:
        zv = np.array([check_number("z", z[i]) for i in rows])
        h = np.eye(3)[rows]
        innov = zv - h @ x
        r = np.array(params.r_diag)[rows]
        s_diag = np.diag(p)[rows] + r
        # Covariance matching: an innovation beyond the gate raises that prior variance to explain it.
        p = p + np.diag(h.T @ np.where(innov**2 > params.innovation_gate * s_diag, innov**2 - s_diag, 0.0))
        s_cov = h @ p @ h.T + np.diag(r)
        k = np.linalg.solve(s_cov, h @ p).T  # P H^T S^-1 (S, P symmetric)
        x = x + k @ innov
        ikh = np.eye(3) - k @ h
        p = ikh @ p @ ikh.T + k @ np.diag(r) @ k.T  # Joseph form
    return KalmanState(x=(float(x[0]), float(x[1]), float(x[2])), p=_as_p(p), steps=state.steps + 1)


def predict_ahead(
    params: KalmanParams,
    state: KalmanState,
    tau_s: float,
    steady: Steady = None,
    max_step_s: float | None = None,
    measured: Sequence[float | None] | None = None,
) -> Vec3:
    """The mean state ``tau_s`` ahead: RK4 on the model ODE (no measurement).

    ``max_step_s`` bounds the RK4 step (default: a twentieth of the shortest lag).
    ``measured`` (u, q, eps; ``None`` where missing): a component with no steady
    state is predicted as measured, not as filtered.  A random walk predicts no
    change, so its prediction is its current value; the window's measurement is
    already a mean over the window, and the filter's estimate of a component it
    has no model for only trails it (docs/model.md §9).

    Examples
    --------
    >>> p, s = KalmanParams(lag_s=(10.0, 10.0, 10.0)), KalmanState.initial((0.0, 0.0, 0.0))
    >>> x = predict_ahead(p, s, 10.0, steady=(1.0, None, 0.5))
    >>> round(x[0], 6), x[1], round(x[2], 6), round(1 - math.exp(-1), 6)
    (0.632121, 0.0, 0.31606, 0.632121)
    """
    if check_number("tau_s", tau_s) < 0.0:
        raise ParameterError(f"tau_s={tau_s}: must be >= 0")
    s = _steady(steady)
    hmax = min(params.lag_s) / 20.0 if max_step_s is None else check_number("max_step_s", max_step_s)
    if hmax <= 0.0:
        raise ParameterError(f"max_step_s={max_step_s}: must be > 0")
    x = np.array(state.x)
    if measured is not None:
        if len(measured) != 3:
            raise ParameterError(f"measured={measured!r}: need 3 values (u, q, eps) or None each")
        for i in range(3):
            if s[i] is None and measured[i] is not None:
                x[i] = check_number("measured", measured[i])
    n = math.ceil(tau_s / hmax) if tau_s > 0.0 else 0
    for _ in range(n):
        h = tau_s / n
        k1 = _deriv(params, x, s)
        k2 = _deriv(params, x + 0.5 * h * k1, s)
        k3 = _deriv(params, x + 0.5 * h * k2, s)
        k4 = _deriv(params, x + h * k3, s)
        x = x + h / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
    return float(x[0]), float(x[1]), float(x[2])


def load_steady_state(load_rps: float, capacity_rps: float, q_max: float = 1e3) -> tuple[float, float, None]:
    """Steady (u, q, eps) for load/capacity ``rho``: ``(min(rho, 1), M/M/1 queue, None)``.

    The queue is ``rho^2 / (1 - rho)`` (M/M/1 mean number waiting), capped at
    ``q_max`` (and ``q_max`` when ``rho >= 1``: no steady state).  ``eps`` has
    no load model here, so it stays a random walk.

    Examples
    --------
    >>> load_steady_state(50.0, 100.0)
    (0.5, 0.5, None)
    """
    load, cap = check_number("load_rps", load_rps), check_number("capacity_rps", capacity_rps)
    if load < 0.0 or cap <= 0.0:
        raise ParameterError(f"load_rps={load_rps}, capacity_rps={capacity_rps}: need >= 0, > 0")
    rho = load / cap
    q = q_max if rho >= 1.0 else min(rho * rho / (1.0 - rho), q_max)
    return (min(rho, 1.0), q, None)


@dataclass(frozen=True)
class LoopDelay:
    """EWMA estimate of the loop delay ``tau = tau_ctrl + tau_net + tau_act``.

    Immutable: :meth:`observe` returns the updated estimator.  The first
    observation of each part initialises its average.

    Examples
    --------
    >>> d = LoopDelay(weight=0.5)
    >>> d = d.observe(issued_at_s=10.0, applied_at_s=10.02, effective_at_s=40.0, basis_at_s=9.9)
    >>> d = d.observe(issued_at_s=20.0, applied_at_s=20.04, effective_at_s=50.0)
    >>> round(d.tau_net_s, 3), round(d.tau_ctrl_s, 3), round(d.tau_s, 3)
    (0.03, 0.1, 30.1)
    """

    weight: float = 0.2
    tau_ctrl_s: float = 0.0
    tau_net_s: float = 0.0
    tau_act_s: float = 0.0
    n: int = 0
    n_ctrl: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < check_number("weight", self.weight) <= 1.0:
            raise ParameterError(f"weight={self.weight}: must lie in (0, 1]")

    @property
    def tau_s(self) -> float:
        """Total loop delay estimate in seconds."""
        return self.tau_ctrl_s + self.tau_net_s + self.tau_act_s

    def observe(
        self,
        issued_at_s: float,
        applied_at_s: float,
        effective_at_s: float,
        basis_at_s: float | None = None,
    ) -> LoopDelay:
        """Fold one command's timestamps (seconds, one clock) into the averages."""
        stamps = [
            ("issued_at_s", issued_at_s),
            ("applied_at_s", applied_at_s),
            ("effective_at_s", effective_at_s),
        ]
        if basis_at_s is not None:
            stamps.insert(0, ("basis_at_s", basis_at_s))
        for (n0, t0), (n1, t1) in zip(stamps, stamps[1:], strict=False):
            if check_number(n1, t1) < check_number(n0, t0):
                raise ParameterError(f"{n1}={t1}: earlier than {n0}={t0}")

        def ewma(old: float, new: float, count: int) -> float:
            return new if count == 0 else old + self.weight * (new - old)

        out = replace(
            self,
            tau_net_s=ewma(self.tau_net_s, applied_at_s - issued_at_s, self.n),
            tau_act_s=ewma(self.tau_act_s, effective_at_s - applied_at_s, self.n),
            n=self.n + 1,
        )
        if basis_at_s is not None:
            out = replace(
                out,
                tau_ctrl_s=ewma(self.tau_ctrl_s, issued_at_s - basis_at_s, self.n_ctrl),
                n_ctrl=self.n_ctrl + 1,
            )
        return out
