"""Fractional-order scaling PID (PID^alpha) with an adaptive order.

docs/model.md §5 (fpid), as a drop-in alternative to :mod:`controllers.pid`:
the same measurement (:class:`~controllers.pid.PidMeasurement`), the same
output (:class:`~controllers.pid.PidOutput`), the same sign (``e = eps -
eps_ref``, violations above the reference scale **up**), the same deadband,
and the same limiter chain, imported from :func:`controllers.pid.actuate`:
clamp ``a`` to ``[a_min, a_max]`` (default [0.5, 3.0]), dead-time hold on
ready replicas and sign guard, slew ``|a_k - a_{k-1}| <= 0.3``, continuous
replica level within ``[min_replicas, max_replicas]`` with back-calculation.

Control law.  One order ``alpha`` for both operators (the design source's single
"derivative/integral order"): ``lambda = mu = alpha``.  Positional form in
log-replica space, ``log level = kp e + ki I^alpha e + kd D^alpha e``, taken
in *velocity* form like pid.py.  With GL weights ``w_j^(r)`` of order ``r``
(``w_0 = 1``, ``w_j = w_{j-1} (1 - (r + 1) / j)``, the coefficients of
``(1 - z)^r``), the backward difference of ``I^alpha = GL^(-alpha)`` is
``GL^(1 - alpha)`` and that of ``D^alpha`` is ``GL^(1 + alpha)``, so::

    h       = dt_s / time_scale_s
    delta_k = kp (e_k - e_{k-1})
            + ki h^alpha       sum_{j<M} w_j^(1 - alpha) e_{k-j}
            + kd h^(-alpha)    sum_{j<M} w_j^(1 + alpha) e_{k-j}

with ``M = memory`` (default 64): the Grünwald–Letnikov sums are truncated
to the last ``M`` errors (short-memory principle), so state and work per
step are bounded.  At ``alpha = 1`` the weights are ``(1, 0, ...)`` and
``(1, -2, 1, 0, ...)`` and the law *is* pid.py's velocity PID (a test pins
this).  Before ``M`` errors exist the history is padded with the first error,
pid.py's "no kick" start.  On an error held constant at ``e`` the integral
term settles at ``ki h^alpha e w_{M-1}^(-alpha)`` per step (the partial sum
of the weights): weaker than pid.py's ``ki h e`` for ``alpha < 1`` and
stronger for ``alpha > 1``, and never zero, so the level still integrates
any persistent error away.  ``ki`` has units ``time_scale_s^-alpha`` and
``kd`` ``time_scale_s^alpha``: a change of order rescales the terms by
``h^(delta alpha)``; choose ``time_scale_s = dt_s`` (``h = 1``) when the order
should change the kernel's shape only.

Adaptive order, applied after every step (the order used at step ``k`` is
``state.alpha``; the returned state carries the next one)::

    alpha' = clip(alpha + eta (e_k + gamma sum(e) - beta (e_k - e_{k-1}) / dt_s),
                  max(alpha_floor, alpha_lo), alpha_hi)

``sum(e)`` runs over the bounded history (at most ``M`` errors).
``alpha_floor = max(0.1, 2 ki / kp)`` (just above it): the design source's constraint
``ki / kp < 0.5 alpha`` is validated at construction (``ParameterError``)
and *kept* during adaptation by clipping alpha, never by changing a gain.
``kp = 0`` with ``ki > 0`` violates it (the ratio is infinite), so the
default gains are ``kp = 0.2, ki = 0.05`` (ratio 0.25 < 0.5 at alpha 1).
The scale-down gains ``kp_down``, ``ki_down``, ``kd_down`` (error below 0
after the deadband; None = the up gain; default ``ki_down = 0.01``, as
pid.py's) act instead of kp/ki/kd there, and the ratio constraint (and the
floor) hold for both directions.
``eta = 0`` by default: untuned, adaptation is off unless asked for.
``[alpha_lo, alpha_hi]`` (default [0.1, 1.9]) bounds the adaptation to the orders a
certificate covers (``governor analyze gains``; docs/model.md §22 (certified)).

Examples
--------
>>> from controllers.pid import PidMeasurement
>>> p = FpidParams(alpha=1.2, max_replicas=20)
>>> st, out = step(p, FpidState(), PidMeasurement(0.30, replicas_current=4), dt_s=30.0)
>>> out.reason, out.target_replicas > 4, out.multiplier <= 1.3, len(st.errors)
('scale_up', True, True, 1)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from controllers.errors import ParameterError, check_number
from controllers.pid import PidMeasurement, PidOutput, PidParams, PidState, actuate, directed_gains
from core.defaults import EPS_REF, MIN_REPLICAS

__all__ = ["FpidParams", "FpidState", "gl_differintegral", "gl_weights", "step"]

ALPHA_MIN = 0.1
ALPHA_MAX = 1.9


def gl_weights(order: float, n: int) -> npt.NDArray[np.float64]:
    """First ``n`` Grünwald–Letnikov weights of ``order`` (``(1 - z)^order``).

    Examples
    --------
    >>> gl_weights(1.0, 3).tolist(), gl_weights(2.0, 4).tolist()
    ([1.0, -1.0, -0.0], [1.0, -2.0, 1.0, 0.0])
    >>> gl_weights(-0.5, 3).tolist()
    [1.0, 0.5, 0.375]
    """
    if n < 1:
        raise ParameterError(f"n={n}: need at least one weight")
    j = np.arange(1, n, dtype=np.float64)
    return np.concatenate(([1.0], np.cumprod(1.0 - (order + 1.0) / j)))


def gl_differintegral(order: float, values: npt.ArrayLike, h: float, memory: int | None = None) -> float:
    """GL differintegral of ``order`` at the last sample of ``values``.

    ``values`` are ``f(t_0), f(t_0 + h), ..., f(t)`` in time order; ``order > 0``
    differentiates, ``order < 0`` integrates, ``0`` is the identity.  With
    ``memory`` only the last ``memory`` samples enter (truncated sum).

    Examples
    --------
    >>> t = np.linspace(0.0, 1.0, 1001)
    >>> round(gl_differintegral(0.5, t, 0.001), 3), round(2 * math.sqrt(1 / math.pi), 3)
    (1.128, 1.128)
    """
    v = np.asarray(values, dtype=np.float64)[::-1]
    if memory is not None:
        v = v[:memory]
    return float(np.dot(gl_weights(order, v.size), v) * h ** (-order))


@dataclass(frozen=True)
class FpidParams:
    """Gains, fractional order, adaptation and limiter settings (validated).

    The limiter fields mean what they mean in :class:`~controllers.pid.PidParams`.

    Examples
    --------
    >>> FpidParams().alpha_floor
    0.9750000000000001
    >>> FpidParams(kp=0.1, ki=0.05, alpha=0.9)
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: ki=0.05: need ki/kp < 0.5*alpha (kp=0.1, alpha=0.9)
    """

    kp: float = 0.08
    ki: float = 0.039
    kd: float = 0.0
    # Scale-down gains (error < 0 after the deadband); None = the up gain (controllers.pid.directed_gains).
    kp_down: float | None = None
    ki_down: float | None = None
    kd_down: float | None = None
    alpha: float = 1.0
    memory: int = 64
    eta: float = 0.0
    gamma: float = 0.0
    beta: float = 0.0
    time_scale_s: float = 1.0
    alpha_lo: float = ALPHA_MIN
    alpha_hi: float = ALPHA_MAX
    eps_ref: float = EPS_REF
    a_min: float = 0.5
    a_max: float = 3.0
    slew: float = 0.3
    min_replicas: int = MIN_REPLICAS
    max_replicas: int = 100
    hold_while_pending: bool = True
    deadband: float = 0.015
    limits: PidParams = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        limits = PidParams(
            kp=self.kp,
            ki=self.ki,
            kd=self.kd,
            kp_down=self.kp_down,
            ki_down=self.ki_down,
            kd_down=self.kd_down,
            eps_ref=self.eps_ref,
            a_min=self.a_min,
            a_max=self.a_max,
            slew=self.slew,
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            hold_while_pending=self.hold_while_pending,
            deadband=self.deadband,
        )  # validates the shared fields with pid.py's messages
        object.__setattr__(self, "limits", limits)
        if not ALPHA_MIN <= check_number("alpha", self.alpha) <= ALPHA_MAX:
            raise ParameterError(f"alpha={self.alpha}: must lie in [{ALPHA_MIN}, {ALPHA_MAX}]")
        for ki_name, kp_name, ki, kp in self._ratios():
            if ki > 0.0 and not (kp > 0.0 and ki / kp < 0.5 * self.alpha):
                raise ParameterError(
                    f"{ki_name}={ki}: need {ki_name}/{kp_name} < 0.5*alpha ({kp_name}={kp}, alpha={self.alpha})"
                )
        if (
            not ALPHA_MIN
            <= check_number("alpha_lo", self.alpha_lo)
            <= check_number("alpha_hi", self.alpha_hi)
            <= ALPHA_MAX
        ):
            raise ParameterError(f"alpha_lo={self.alpha_lo}: need {ALPHA_MIN} <= alpha_lo <= alpha_hi <= {ALPHA_MAX}")
        if isinstance(self.memory, bool) or not isinstance(self.memory, int):
            raise ParameterError(f"memory={self.memory!r}: must be an int")
        if not 3 <= self.memory <= 100_000:
            raise ParameterError(f"memory={self.memory}: must lie in [3, 100000]")
        for name in ("eta", "gamma", "beta"):
            if check_number(name, getattr(self, name)) < 0.0:
                raise ParameterError(f"{name}={getattr(self, name)}: must be >= 0")
        if check_number("time_scale_s", self.time_scale_s) <= 0.0:
            raise ParameterError(f"time_scale_s={self.time_scale_s}: must be > 0")

    def _ratios(self) -> tuple[tuple[str, str, float, float], ...]:
        """``(ki name, kp name, ki, kp)`` of each direction whose gains are set (the down one when it differs)."""
        up = ("ki", "kp", self.ki, self.kp)
        if self.kp_down is None and self.ki_down is None:
            return (up,)
        kp_down = self.kp if self.kp_down is None else self.kp_down
        ki_down = self.ki if self.ki_down is None else self.ki_down
        return up, ("ki_down", "kp_down" if self.kp_down is not None else "kp", ki_down, kp_down)

    @property
    def alpha_floor(self) -> float:
        """Lowest order the adaptation may reach: ``max(0.1, 2 ki / kp)`` over both directions, exclusive."""
        ratios = [ki / kp for _, _, ki, kp in self._ratios() if ki != 0.0]
        if not ratios:
            return ALPHA_MIN
        return max(ALPHA_MIN, math.nextafter(2.0 * max(ratios), math.inf))


@dataclass(frozen=True)
class FpidState:
    """Controller memory (plain data via to_dict/from_dict).

    ``errors`` is the bounded error history, newest first, at most ``memory``
    long (a ring buffer kept as a shifted tuple: O(memory) per step).
    ``alpha`` is the order the next step uses (``None``: ``params.alpha``).

    Examples
    --------
    >>> s = FpidState(errors=(0.1, 0.0), alpha=1.2, last_target=4, steps=2, level=4.2)
    >>> FpidState.from_dict(s.to_dict()) == s
    True
    """

    errors: tuple[float, ...] = ()
    alpha: float | None = None
    a_prev: float = 1.0
    last_target: int | None = None
    steps: int = 0
    level: float | None = None

    def __post_init__(self) -> None:
        for e in self.errors:
            check_number("errors", e)
        if self.alpha is not None and not ALPHA_MIN <= check_number("alpha", self.alpha) <= ALPHA_MAX:
            raise ParameterError(f"alpha={self.alpha}: must lie in [{ALPHA_MIN}, {ALPHA_MAX}]")
        # a_prev, last_target, steps and level are checked by PidState.
        self.as_pid_state()

    def as_pid_state(self) -> PidState:
        """The fields :func:`controllers.pid.actuate` reads."""
        e1 = self.errors[0] if self.errors else None
        e2 = self.errors[1] if len(self.errors) > 1 else None
        return PidState(
            e_prev=e1,
            e_prev2=e2,
            a_prev=self.a_prev,
            last_target=self.last_target,
            steps=self.steps,
            level=self.level,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields (``errors`` as a list)."""
        d = asdict(self)
        d["errors"] = list(self.errors)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FpidState:
        """Inverse of :meth:`to_dict`."""
        return cls(**{**data, "errors": tuple(float(e) for e in data.get("errors", ()))})


def step(params: FpidParams, state: FpidState, meas: PidMeasurement, dt_s: float) -> tuple[FpidState, PidOutput]:
    """Advance the fractional controller one period (pure).

    Parameters
    ----------
    params : FpidParams
    state : FpidState
        Memory from the previous step (``FpidState()`` to start).
    meas : PidMeasurement
        Violation rate and replica counts of the period just closed.
    dt_s : float
        Control period in seconds, > 0.

    Returns
    -------
    (FpidState, PidOutput)
        ``PidOutput.i_term`` / ``d_term`` are the fractional terms; the new
        state's ``alpha`` is the adapted order for the next step.

    Examples
    --------
    >>> p = FpidParams(alpha=1.2, eta=0.5, max_replicas=50)
    >>> st = FpidState()
    >>> for _ in range(3):
    ...     st, out = step(p, st, PidMeasurement(0.5, replicas_current=10), 30.0)
    >>> out.reason, st.alpha > 1.2, st.errors[:2]
    ('scale_up', True, (0.48, 0.48))
    """
    if not check_number("dt_s", dt_s) > 0.0:
        raise ParameterError(f"dt_s={dt_s}: control period must be > 0")
    alpha = params.alpha if state.alpha is None else state.alpha
    m = params.memory
    e = meas.violation_rate - params.eps_ref
    if abs(e) <= params.deadband:
        e = 0.0
    history = ((e,) + state.errors)[:m]
    padded = np.full(m, history[-1], dtype=np.float64)
    padded[: len(history)] = history
    e1 = float(padded[1])
    h = dt_s / params.time_scale_s
    kp, ki, kd = directed_gains(params, e)
    p_term = kp * (e - e1)
    i_term = ki * h**alpha * float(np.dot(gl_weights(1.0 - alpha, m), padded))
    d_term = kd * h ** (-alpha) * float(np.dot(gl_weights(1.0 + alpha, m), padded))
    delta = p_term + i_term + d_term
    act = actuate(params.limits, state.as_pid_state(), meas, e, delta)
    drive = e + params.gamma * math.fsum(history) - params.beta * (e - e1) / dt_s
    alpha_next = min(max(alpha + params.eta * drive, params.alpha_floor, params.alpha_lo), params.alpha_hi)
    new_state = FpidState(
        errors=history,
        alpha=alpha_next,
        a_prev=act.multiplier,
        last_target=act.target_replicas,
        steps=state.steps + 1,
        level=act.level,
    )
    out = PidOutput(
        multiplier=act.multiplier,
        target_replicas=act.target_replicas,
        error=e,
        delta=delta,
        p_term=p_term,
        i_term=i_term,
        d_term=d_term,
        saturated=act.saturated,
        slew_limited=act.slew_limited,
        held_pending=act.held_pending,
        at_bound=act.at_bound,
        reason=act.reason,
    )
    return new_state, out
