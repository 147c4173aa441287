"""Elastic scaling controller: velocity PID in log-replica space.

docs/model.md §4 (pid), the design source with its Correction: violations
above the reference scale **up**.  The error is ``e_k = eps_k - eps_ref``
(``eps`` the measured SLO-violation rate, ``eps_ref`` default 2 %), so
``e > 0`` grows the fleet.

Form chosen: *velocity* (incremental) PID on ``log(replicas)``::

    delta_k = kp * (e_k - e_{k-1})
            + ki * dt_s * e_k
            + kd * (e_k - 2 e_{k-1} + e_{k-2}) / dt_s
    a_k     = exp(delta_k)                       # per-step replica multiplier

then, in this order:

1. *Clamp* ``a_k`` to ``[a_min, a_max]`` (default [0.5, 3.0]); ``saturated``.
2. *Dead-time compensation* (``hold_while_pending``): the violation rate
   measured this period was produced by the *ready* replicas, not by the
   level already commanded (replicas still loading, or commands not yet
   visible in the fleet).  While such capacity is in flight a scale-up
   therefore multiplies the ready count:
   ``level_k = max(level_{k-1}, ready * a_k)``.  Replicas in flight are not
   multiplied again and again while they load (no pile-up), yet a violation
   that persists still escalates as the slew ramp raises ``a_k``.  When
   ``ready * a_k`` does not exceed the level, the step is a hold;
   ``held_pending``.  A multiplier above 1 that the slew limit leaves over
   after the error turned non-positive does not grow the level (sign guard).
3. *Slew*: ``|a_k - a_{k-1}| <= slew`` (default 0.3, ``a_{-1} = 1``);
   ``slew_limited``.
4. *Target*: the controller integrates a *continuous* replica level
   ``level_k = clamp(level_{k-1} * a_k, min_replicas, max_replicas)``
   (``level_{-1}`` = ``replicas_current``) and commands its rounding
   ``round_half_up(level_k)``.  Keeping the fractional level in the state
   means small multipliers accumulate instead of being lost to (or
   exaggerated by) integer rounding, so the count does not dither by one
   around the reference because of rounding alone.

Anti-windup: the integrator is the replica level itself, which is clamped to
the replica bounds, so there is no stored integral to wind up.  The only
other memory is the slew state ``a_{k-1}``; when the replica bounds or the
pending hold override the level, ``a_k`` is back-calculated toward the
realised ratio (still within the slew), so after a long stay at
``max_replicas`` the first below-reference error scales down at once.  The
first step uses ``e_{k-1} = e_{k-2} = e_k`` (no derivative or proportional
kick).

Default gains are integral-only (``kp = kd = 0``, ``ki = 0.05 /s``, i.e.
``a = exp(0.5 * e)`` at ``dt_s = 10``: +27 % per period at 50 % violations).
*Per-direction gains*: ``kp_down``, ``ki_down``, ``kd_down`` act instead while
the error (after the deadband) is below 0, each ``None`` meaning the up gain.
The shipped ``ki_down = 0.01`` (:data:`core.vocab.DEFAULT_PID_GAINS`) gives
-0.2 % per period when nothing violates: the feedforward's decay towards the
demand's requirement and the scaling law's scale-down stabilisation
(:mod:`controllers.scaling_law`) carry scale-down, the integral only trims.
The plant (violation rate against
log replicas) is static and monotone, so the velocity I term alone converges
without ringing; a velocity P term retracts whenever the error changes, and
the integer rounding above turns that retraction into a +-1 limit cycle.
Note the slew limit bounds the *change* of the per-step multiplier, so
after a fast ramp the loop needs a few steps to stop growing (overshoot is
then removed one replica per step).

Examples
--------
>>> p = PidParams(min_replicas=1, max_replicas=20)
>>> st, out = step(p, PidState(), PidMeasurement(0.30, replicas_current=4), dt_s=30.0)
>>> out.reason, out.target_replicas > 4, out.multiplier <= 1.3
('scale_up', True, True)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, NamedTuple, Protocol

from controllers.errors import ParameterError, check_number
from core.defaults import EPS_REF, MIN_REPLICAS
from core.vocab import DEFAULT_PID_GAINS

__all__ = [
    "Actuation",
    "PidMeasurement",
    "PidOutput",
    "PidParams",
    "PidState",
    "actuate",
    "directed_gains",
    "round_half_up",
    "step",
]

_DELTA_CAP = 50.0  # exp() overflow guard; far beyond any clamp


@dataclass(frozen=True)
class PidParams:
    """Gains, clamps and bounds of the scaling PID (validated).

    Examples
    --------
    >>> PidParams(kp=1.0).eps_ref
    0.02
    >>> PidParams(a_min=1.5)
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: a_min=1.5: need 0 < a_min <= 1 <= a_max (a_max=3.0)
    """

    kp: float = DEFAULT_PID_GAINS["kp"]
    ki: float = DEFAULT_PID_GAINS["ki"]
    kd: float = DEFAULT_PID_GAINS["kd"]
    # Scale-down gains (error < 0 after the deadband); None = the same as the up gain.  The shipped
    # ki_down is in DEFAULT_PID_GAINS (the settings' gains), not here: PidParams(ki=...) stays symmetric.
    kp_down: float | None = None
    ki_down: float | None = None
    kd_down: float | None = None
    eps_ref: float = EPS_REF
    a_min: float = 0.5
    a_max: float = 3.0
    slew: float = 0.3
    min_replicas: int = MIN_REPLICAS
    max_replicas: int = 100
    hold_while_pending: bool = True
    deadband: float = 0.015

    def __post_init__(self) -> None:
        for name in ("kp", "ki", "kd", "kp_down", "ki_down", "kd_down"):
            value = getattr(self, name)
            if value is not None and check_number(name, value) < 0.0:
                raise ParameterError(f"{name}={value}: gain must be >= 0")
        if not 0.0 < check_number("eps_ref", self.eps_ref) < 1.0:
            raise ParameterError(f"eps_ref={self.eps_ref}: reference rate must lie in (0, 1)")
        a_min, a_max = check_number("a_min", self.a_min), check_number("a_max", self.a_max)
        if not 0.0 < a_min <= 1.0:
            raise ParameterError(f"a_min={a_min}: need 0 < a_min <= 1 <= a_max (a_max={a_max})")
        if a_max < 1.0:
            raise ParameterError(f"a_max={a_max}: need 0 < a_min <= 1 <= a_max (a_min={a_min})")
        if check_number("slew", self.slew) <= 0.0:
            raise ParameterError(f"slew={self.slew}: rate limit must be > 0")
        for name in ("min_replicas", "max_replicas"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ParameterError(f"{name}={value!r}: must be an int >= 0")
        if self.min_replicas > self.max_replicas:
            raise ParameterError(f"min_replicas={self.min_replicas}: exceeds max_replicas={self.max_replicas}")
        if not isinstance(self.hold_while_pending, bool):
            raise ParameterError(f"hold_while_pending={self.hold_while_pending!r}: must be a bool")
        if check_number("deadband", self.deadband) < 0.0:
            raise ParameterError(f"deadband={self.deadband}: must be >= 0")

    def gains(self, error: float) -> tuple[float, float, float]:
        """``(kp, ki, kd)`` acting at ``error`` (after the deadband): the down gains below 0.

        >>> p = PidParams(ki=0.05, ki_down=0.01)
        >>> p.gains(0.1), p.gains(-0.02), PidParams(ki=0.05, ki_down=None).gains(-0.02)
        ((0.0, 0.05, 0.0), (0.0, 0.01, 0.0), (0.0, 0.05, 0.0))
        """
        return directed_gains(self, error)


class _Gains(Protocol):
    @property
    def kp(self) -> float: ...
    @property
    def ki(self) -> float: ...
    @property
    def kd(self) -> float: ...
    @property
    def kp_down(self) -> float | None: ...
    @property
    def ki_down(self) -> float | None: ...
    @property
    def kd_down(self) -> float | None: ...


def directed_gains(g: _Gains, error: float) -> tuple[float, float, float]:
    """The gains of the direction of ``error``: ``kp``/``ki``/``kd`` at ``error >= 0``, the
    ``*_down`` ones (each None = its up gain) below 0 (docs/model.md §4, per-direction gains)."""
    if error >= 0.0:
        return g.kp, g.ki, g.kd
    return (
        g.kp if g.kp_down is None else g.kp_down,
        g.ki if g.ki_down is None else g.ki_down,
        g.kd if g.kd_down is None else g.kd_down,
    )


@dataclass(frozen=True)
class PidState:
    """Controller memory between steps (plain data via to_dict/from_dict).

    Examples
    --------
    >>> s = PidState(e_prev=0.1, last_target=4, steps=3)
    >>> PidState.from_dict(s.to_dict()) == s
    True
    """

    e_prev: float | None = None
    e_prev2: float | None = None
    a_prev: float = 1.0
    last_target: int | None = None
    steps: int = 0
    level: float | None = None

    def __post_init__(self) -> None:
        for name in ("e_prev", "e_prev2"):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name))
        if check_number("a_prev", self.a_prev) <= 0.0:
            raise ParameterError(f"a_prev={self.a_prev}: multiplier must be > 0")
        if self.last_target is not None and self.last_target < 0:
            raise ParameterError(f"last_target={self.last_target}: must be >= 0")
        if self.level is not None and check_number("level", self.level) < 0.0:
            raise ParameterError(f"level={self.level}: must be >= 0")
        if self.steps < 0:
            raise ParameterError(f"steps={self.steps}: must be >= 0")

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PidState:
        """Inverse of :meth:`to_dict`."""
        return cls(**data)


@dataclass(frozen=True)
class PidMeasurement:
    """One control period's input.

    Examples
    --------
    >>> PidMeasurement(violation_rate=1.5, replicas_current=3)
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: violation_rate=1.5: must lie in [0, 1]
    """

    violation_rate: float
    replicas_current: int
    replicas_pending: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= check_number("violation_rate", self.violation_rate) <= 1.0:
            raise ParameterError(f"violation_rate={self.violation_rate}: must lie in [0, 1]")
        for name in ("replicas_current", "replicas_pending"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ParameterError(f"{name}={value!r}: must be an int >= 0")


@dataclass(frozen=True)
class PidOutput:
    """Decision of one step, with the terms and limiter flags for audit."""

    multiplier: float
    target_replicas: int
    error: float
    delta: float
    p_term: float
    i_term: float
    d_term: float
    saturated: bool
    slew_limited: bool
    held_pending: bool
    at_bound: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe fields."""
        return asdict(self)


def _round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5 + 1e-9))


# Public alias for the other scaling laws in controllers/ (same behaviour).
round_half_up = _round_half_up


class Actuation(NamedTuple):
    """What :func:`actuate` decided from one step's log-multiplier ``delta``."""

    multiplier: float
    level: float
    target_replicas: int
    saturated: bool
    slew_limited: bool
    held_pending: bool
    at_bound: bool
    reason: str


def actuate(params: PidParams, state: PidState, meas: PidMeasurement, error: float, delta: float) -> Actuation:
    """Steps 1-4 of the module docstring (clamp, dead-time hold and sign guard,
    slew, continuous level with back-calculation) for a given ``delta``.

    Shared by :func:`step` and by the other scaling laws (e.g.
    :mod:`controllers.fpid`), which differ only in how ``delta`` is computed.
    Uses ``a_prev``, ``last_target`` and ``level`` of ``state``; ``error`` (after
    the deadband) only for the sign guard.

    Examples
    --------
    >>> act = actuate(PidParams(), PidState(), PidMeasurement(0.5, replicas_current=4), 0.48, 1.0)
    >>> round(act.multiplier, 6), act.target_replicas, act.slew_limited
    (1.3, 5, True)
    """
    e = error
    a_raw = math.exp(min(max(delta, -_DELTA_CAP), _DELTA_CAP))
    a_des = min(max(a_raw, params.a_min), params.a_max)
    saturated = a_des != a_raw
    held = False
    lo, hi = state.a_prev - params.slew, state.a_prev + params.slew
    a = min(max(a_des, lo), hi)
    slew_limited = a != a_des
    base = state.last_target if state.last_target is not None else meas.replicas_current
    level0 = state.level if state.level is not None else float(base)
    if level0 == 0.0 and a > 1.0:
        level0 = 1.0 / a  # scaling up from zero: the first replica
    level_wanted = level0 * a
    guarded = a > 1.0 and e <= 0.0
    if guarded:
        # Sign guard: a multiplier above 1 left over from the slew ramp must not
        # grow the fleet once the error is no longer positive (no overshoot).
        level_wanted = level0
    elif params.hold_while_pending and a > 1.0:
        ready = meas.replicas_current - meas.replicas_pending
        # Capacity in flight: replicas loading, or a commanded level the fleet
        # does not show yet.  Only then does the measurement lag the level.
        in_flight = meas.replicas_pending > 0 or level0 > meas.replicas_current + 0.5
        if in_flight and (ready > 0 or meas.replicas_pending > 0):
            level_wanted = max(level0, ready * a)
            held = level_wanted <= level0
    level = min(max(level_wanted, float(params.min_replicas)), float(params.max_replicas))
    at_bound = level != level_wanted
    target = _round_half_up(level)
    if (at_bound or held or guarded) and level0 > 0:
        # Back-calculation: track the realised ratio, within clamp and slew.
        realised = min(max(level / level0, params.a_min), params.a_max)
        a = min(max(realised, lo), hi)
    reason = "scale_up" if target > base else "scale_down" if target < base else "hold"
    return Actuation(a, level, target, saturated, slew_limited, held, at_bound, reason)


def step(params: PidParams, state: PidState, meas: PidMeasurement, dt_s: float) -> tuple[PidState, PidOutput]:
    """Advance the controller one period (pure).

    Parameters
    ----------
    params : PidParams
    state : PidState
        Memory from the previous step (``PidState()`` to start).
    meas : PidMeasurement
        Violation rate and replica counts of the period just closed.
    dt_s : float
        Control period in seconds, > 0.

    Returns
    -------
    (PidState, PidOutput)

    Examples
    --------
    >>> p = PidParams(min_replicas=1, max_replicas=50)
    >>> st, out = step(p, PidState(), PidMeasurement(0.0, replicas_current=10), 30.0)
    >>> out.multiplier < 1.0, st.level < 10   # the level falls; the target follows later
    (True, True)
    """
    if not check_number("dt_s", dt_s) > 0.0:
        raise ParameterError(f"dt_s={dt_s}: control period must be > 0")
    e = meas.violation_rate - params.eps_ref
    if abs(e) <= params.deadband:
        e = 0.0
    e1 = e if state.e_prev is None else state.e_prev
    e2 = e1 if state.e_prev2 is None else state.e_prev2
    kp, ki, kd = params.gains(e)
    p_term = kp * (e - e1)
    i_term = ki * dt_s * e
    d_term = kd * (e - 2.0 * e1 + e2) / dt_s
    delta = p_term + i_term + d_term
    act = actuate(params, state, meas, e, delta)
    new_state = replace(
        state,
        e_prev=e,
        e_prev2=e1,
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
