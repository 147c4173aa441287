"""Certified gains: margins and a quadratic Lyapunov certificate of the
linearised scaling loop (docs/model.md §22 (certified); design source §2.5).

**The linear loop.**  State ``y`` = log replicas.  The controller's velocity law
is a finite impulse response on the error, ``delta_k = sum_j c_j e_{k-j}``:
pid.py's ``c = (kp + ki dt + kd/dt, -kp - 2 kd/dt, kd/dt)``; fpid.py's
``c_j = kp (1, -1)_j + ki h^alpha w_j^(1-alpha) + kd h^-alpha w_j^(1+alpha)``
for ``j < memory`` (the weights are :func:`controllers.fpid.gl_weights`).  The
commanded log level integrates it, ``u_k = u_base + delta_k``.  The plant is
linearised around an operating point ``(y*, eps*)``:
``eps = eps* - b (y - y*)`` (``b > 0``: violations fall as replicas rise),
and the level ordered at the close of window ``k`` serves from window
``k + 1 + d``, ``d = ceil(delay_s / dt_s)`` (the one window is the
measurement itself).  In deviations ``v = u - u*``, ``e_k = -b v_{k-1-d}``
and the closed loop is the scalar recurrence::

    plain        v_k = v_{k-1}   - b sum_j c_j v_{k-1-d-j}
    compensated  v_k = v_{k-1-d} - b sum_j c_j v_{k-1-d-j}

*Plain* is the velocity law as written; *compensated* is its dead-time hold
(``hold_while_pending``, docs/model.md §4) while capacity is in flight: a
scale-up multiplies the *ready* level, ``u_k = y_k + delta_k`` with
``y_k = u_{k-1-d}``.  The open loop (plain) is
``L(z) = b z^-(1+d) C(z)``, ``C(z) = sum_j c_j z^-j / (1 - z^-1)``; for a pure
integral ``L(z) = b ki dt z^-d / (z - 1)``.

**Deadband, clamp, slew, rounding** (a sector argument).  Each of them, at
one window, maps the linear law's output to the actuated one by a factor in
``[0, 1]`` or adds a bounded disturbance:

- the *deadband* replaces ``e`` by ``phi(e) = e 1{|e| > band}``: ``phi(e)/e``
  lies in ``{0, 1}``, a sector ``[0, 1]`` (the loop gain is scaled by 0 or 1);
- the *clamp* ``[a_min, a_max]`` on ``a = e^delta`` and the *slew* limit
  ``|a_k - a_{k-1}| <= slew`` both shrink ``delta`` towards 0 without changing
  its sign (``sat(delta)/delta`` in ``[0, 1]``); so does the clip of the
  violation rate to ``[0, 1]`` (below the reference the error is at most
  ``-eps_ref``);
- the *rounding* to whole replicas and the replica bounds add a disturbance
  of at most half a replica to the level (bounded, no gain).

A sector factor ``k(t)`` in ``[0, 1]`` multiplies the plant gain seen by the
loop: ``b k(t)`` lies in ``[0, b_hi]``, which the interval covers down to
``b_lo`` but not to 0 -- so the argument is not a proof (a factor near 0 is a
smaller plant gain; the spectral radius tends to 1 there, it does not exceed
it).  It is therefore stated as an assumption **checked on the simulator**:
``tests/unit/test_stability_nonlinear.py`` runs the real ``pid.step`` /
``fpid.step`` (deadband, clamp, slew, dead-time hold, bounds, rounding) against
``eps = clip(eps* - b(t) (y - y*), 0, 1)`` with ``b(t)`` drawn every window in
the interval, from random starts, and asserts that the loop enters the
deadband and stays there, with a bounded number of reversals.

**Margins** (plain loop; the compensated one below): ``L`` on the unit circle, on a fine grid refined
by bisection at each crossing: gain margin (factor and dB) at the phase
crossover(s) ``Im L = 0, Re L < 0`` (the smallest), phase margin (deg) at the
gain crossover(s) ``|L| = 1`` (the smallest; ``180 - |arg L|``, the lag or
lead that brings ``L`` to -1), and the delay margin
``PM / w_gc`` in windows: how much more dead time the loop takes.

**Certificate.**  ``A`` is the companion matrix of the recurrence (state
``x_k = (v_{k-1}, ..., v_{k-n})``, ``n = 1 + d + len(c) - 1``: the last ``n``
log-level deviations).  With its spectral radius ``r < 1`` choose
``rho = r + margin (1 - r)`` and solve the discrete Lyapunov equation
``(A/rho)^T P (A/rho) - P = -I`` (a doubling iteration: numpy only), so
``A^T P A - rho^2 P = -rho^2 I``: ``V = x^T P x`` falls by at least
``rho^2`` per window, i.e. ``V(t) <= e^(-alpha t) V(0)`` with
``alpha = -2 ln(rho) / dt_s`` per second (design source §2.5:
``dV/dt <= -alpha V``).  ``P`` is scaled to ``||P||_2 = 1`` so that
``beta ||x||^2 <= V <= ||x||^2`` with ``beta = lambda_min(P) = 1 / cond(P)``:
``||x_k|| <= rho^k ||x_0|| / sqrt(beta)``.  The trade-off (the source's
"larger alpha recovers faster, larger beta gives a wider robustness margin"):
pushing ``rho`` down to ``r`` raises ``alpha`` to ``-2 ln(r)/dt`` but the sum
``P = sum_k (A/rho)^Tk (A/rho)^k`` then converges slowly, ``P`` grows
ill-conditioned and ``beta`` falls (a larger transient bound); ``rho`` near
1 gives a round ``P`` (large ``beta``) and a slow certified rate.  The
default ``margin = 0.5`` takes the middle.  No certificate when ``r >= 1``,
or when the checks (``P`` symmetric positive definite by Cholesky,
``rho^2 P - A^T P A >= 0`` by its eigenvalues) fail numerically.

**Robust certificate** (:func:`robust_certificate`, ``governor analyze
gains``).  The plant gain is an interval ``[b_lo, b_hi]`` (measured:
``bench.analyze_gains.PLANT_GAIN_RANGE``).  Two modes, each with its own
gains (the ``*_down`` gains for scale-down; absent = the up gains): **up**,
the compensated loop at the start-up delay, and **down**, the plain loop at
one window.  Required at every ``b`` of a grid of ``B_GRID`` points (ends
included), in both modes: spectral radius < 1, gain margin >= 2 (6 dB),
phase margin >= 30 deg, delay margin >= 2 windows; the worst of each, and
where, is reported.  The up mode's open loop is read off its recurrence
(:func:`controllers.loop_model.recurrence`): ``L_b = b E / (1 - O - R)``
where ``b`` enters, for the gain and phase margins, and ``L_d = (b E - R) /
(1 - O)`` at the actuator, where a longer start-up enters (it delays the
ready level and the violations alike), for the delay margin.  For the plain
loop the two are one.  (A delay of the violations *alone*, relative to the
ready count, is not covered: the compensated loop's crossovers sit next to
its ``(1+d)``-th roots of one and its delay margin at ``L_b`` is below one
window for any gain.)

*Switching.*  Both modes are written in one state (the last ``n`` levels,
the shorter recurrence padded with zero coefficients), and one ``P`` is
sought with ``A^T P A < P`` for the four vertices (two modes x two ends of
the interval) by an SDP (cvxpy, Clarabel; checked here with numpy).  ``A``
is affine in ``b`` and ``X -> x^T X^T P X x`` is convex, so ``A(b)^T P A(b) <
rho^2 P`` at the two ends gives it at every ``b`` between them: ``V = x^T P
x`` then falls under *any* switching between the modes with ``b`` varying in
the interval from window to window.  Where no such ``P`` exists,
:func:`dwell_certificate` gives a dwell ``N`` (windows in the up mode before
a scale-down), and the certificate holds iff the controller enforces it
(``scale_down_dwell_windows >= N``).

*PID^alpha.*  The adaptation changes ``alpha`` only (``kp``, ``ki``, ``kd``
fixed); the orders it can reach are ``alpha`` itself when ``eta = 0``, else
the clip ``[max(alpha_floor, alpha_lo), alpha_hi]``, sampled every
``ALPHA_STEP`` (``A`` is not affine in ``alpha``: this part is a grid, said
so in the result); the margins and the SDP's vertices run over every sampled
order.  At ``alpha = 1`` the weights beyond the third are exactly zero and
the state is small; at any other order the whole memory (64) is state, and
the SDP (68 x 68, minutes) is refused (``MAX_SDP_ORDER``), not faked.

Examples
--------
>>> m = LoopModel.from_gains({"ki": 0.05}, "pid", plant_gain=1.0, delay_s=10.0, dt_s=10.0)
>>> mg = margins(m)
>>> round(mg.gain_margin, 3), round(mg.phase_margin_deg, 1)   # L = 0.5 / (z (z - 1))
(2.0, 46.6)
>>> cert = certify({"ki": 0.05}, "pid", OperatingPoint(plant_gain=1.0), 10.0, 10.0)
>>> cert is not None and cert.beta > 0 and cert.alpha_per_s > 0
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from controllers.errors import ParameterError, check_number
from controllers.loop_model import (
    CONTROLLERS,
    Array,
    LoopModel,
    Margins,
    OperatingPoint,
    closed_loop_matrix,
    companion,
    frequency_response,
    gain_of,
    margins,
)

__all__ = [
    "CONTROLLERS",
    "Assessment",
    "Certificate",
    "LoopModel",
    "Margins",
    "OperatingPoint",
    "assess",
    "certify",
    "closed_loop_matrix",
    "frequency_response",
    "lyapunov_certificate",
    "margins",
    "PlantGainRange",
    "ModeReport",
    "RobustCertificate",
    "Switching",
    "SolverMissing",
    "common_lyapunov",
    "reachable_alphas",
    "robust_certificate",
    "solve_discrete_lyapunov",
    "switching_certificate",
]


def solve_discrete_lyapunov(a: Array, q: Array, *, tol: float = 1e-13, max_iter: int = 200) -> Array:
    """``P`` with ``a^T P a - P = -q`` (``a`` of spectral radius < 1), by doubling:
    ``P = sum_k (a^T)^k q a^k``, summed as ``P <- P + (a^T)^(2^i) P a^(2^i)``.

    >>> solve_discrete_lyapunov(np.array([[0.5]]), np.array([[3.0]])).tolist()
    [[4.0]]
    """
    p, ak = q.copy(), a.copy()
    for _ in range(max_iter):
        inc = ak.T @ p @ ak
        p = p + inc
        ak = ak @ ak
        if np.linalg.norm(inc) <= tol * np.linalg.norm(p):
            break
    else:
        raise ParameterError("lyapunov: doubling did not converge (spectral radius too close to 1)")
    out: Array = 0.5 * (p + p.T)
    return out


@dataclass(frozen=True)
class Certificate:
    """A checked quadratic Lyapunov certificate of one loop, with its margins."""

    controller: str
    mode: str
    plant_gain: float
    delay_s: float
    dt_s: float
    delay_windows: int
    order: int
    spectral_radius: float
    rho: float
    alpha_per_s: float
    beta: float
    residual: float
    margins: Margins | None
    p: Array

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe summary (without ``P``; infinities as ``None``)."""
        d = {k: v for k, v in asdict(self).items() if k != "p"}
        if self.margins is not None:
            d["margins"] = {
                k: _finite(v) if isinstance(v, float) else [list(x) for x in v] for k, v in asdict(self.margins).items()
            }
        return {k: _finite(v) if isinstance(v, float) else v for k, v in d.items()}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def lyapunov_certificate(a: Array, *, margin: float = 0.5) -> tuple[float, float, Array, float] | None:
    """``(rho, beta, P, residual)`` for ``x' = a x``, or ``None`` when ``a`` is not
    Schur stable or a check fails: ``P`` (``||P|| = 1``) is positive definite
    and ``rho^2 P - a^T P a >= 0``; ``residual`` is the Lyapunov equation's
    relative residual."""
    if not 0.0 < margin < 1.0:
        raise ParameterError(f"margin={margin}: must lie in (0, 1)")
    r = float(np.max(np.abs(np.linalg.eigvals(a))))
    if not r < 1.0 - 1e-9:
        return None
    rho = max(r + margin * (1.0 - r), 1e-6)
    n = a.shape[0]
    try:
        p = solve_discrete_lyapunov(a / rho, np.eye(n))
    except ParameterError:
        return None
    residual = float(np.linalg.norm((a / rho).T @ p @ (a / rho) - p + np.eye(n)) / np.linalg.norm(p))
    scale = float(np.linalg.norm(p, 2))
    p = p / scale
    try:
        np.linalg.cholesky(p)
    except np.linalg.LinAlgError:
        return None
    beta = float(np.min(np.linalg.eigvalsh(p)))
    decay = rho**2 * p - a.T @ p @ a
    if beta <= 0.0 or float(np.min(np.linalg.eigvalsh(0.5 * (decay + decay.T)))) < -1e-9 or residual > 1e-6:
        return None
    return rho, beta, p, residual


def certify(
    gains: Mapping[str, Any],
    controller: str,
    operating_point: OperatingPoint,
    delay_s: float,
    dt_s: float,
    *,
    compensated: bool = False,
    margin: float = 0.5,
    time_scale_s: float | None = None,
    direction: str = "up",
) -> Certificate | None:
    """Certificate of the loop of ``gains`` at ``operating_point`` with the loop
    delay ``delay_s`` and the window ``dt_s``, or ``None`` when the linear loop
    is not stable.  Bad inputs raise :class:`~controllers.errors.ParameterError`.

    >>> certify({"ki": 0.5}, "pid", OperatingPoint(plant_gain=2.0), 40.0, 10.0) is None   # b ki dt = 10
    True
    """
    if not isinstance(operating_point, OperatingPoint):
        raise ParameterError("operating_point: need an OperatingPoint")
    model = LoopModel.from_gains(
        gains,
        controller,
        plant_gain=operating_point.plant_gain,
        delay_s=delay_s,
        dt_s=dt_s,
        compensated=compensated,
        time_scale_s=time_scale_s,
        direction=direction,
    )
    found = lyapunov_certificate(closed_loop_matrix(model), margin=margin)
    if found is None:
        return None
    rho, beta, p, residual = found
    return Certificate(
        controller=controller,
        mode="compensated" if compensated else "plain",
        plant_gain=model.plant_gain,
        delay_s=float(delay_s),
        dt_s=model.dt_s,
        delay_windows=model.d,
        order=model.order,
        spectral_radius=float(np.max(np.abs(np.linalg.eigvals(closed_loop_matrix(model))))),
        rho=rho,
        alpha_per_s=-2.0 * math.log(rho) / model.dt_s,
        beta=beta,
        residual=residual,
        margins=None if compensated else margins(model),
        p=p,
    )


@dataclass(frozen=True)
class Assessment:
    """One mode of the loop: its spectral radius, margins (plain mode) and
    certificate (``None``: not certified, ``why`` says why)."""

    mode: str
    delay_s: float
    delay_windows: int
    spectral_radius: float
    margins: Margins | None
    certificate: Certificate | None
    why: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe summary."""
        return {
            "mode": self.mode,
            "delay_s": self.delay_s,
            "delay_windows": self.delay_windows,
            "spectral_radius": self.spectral_radius,
            "certified": self.certificate is not None,
            "why": self.why,
            "certificate": None if self.certificate is None else self.certificate.to_dict(),
        }


def assess(
    gains: Mapping[str, Any],
    controller: str,
    operating_point: OperatingPoint,
    delay_s: float,
    dt_s: float,
    *,
    dead_time_comp: bool = True,
    down_delay_s: float | None = None,
    time_scale_s: float | None = None,
) -> list[Assessment]:
    """The modes the gains must be certified in.  Without dead-time
    compensation: the plain loop at ``delay_s``.  With it (the default, as
    ``hold_while_pending``), two modes, each certified on its own: ``up``, the
    compensated loop at ``delay_s`` (scale-ups wait for replicas to start), and
    ``down``, the plain loop at ``down_delay_s`` (default one window: removing
    a replica takes effect without a start-up) with the scale-down gains.  One
    plant gain, no required margin, no switching: ``governor tune``'s check;
    :func:`robust_certificate` is the certificate.

    >>> [(a.mode, a.certificate is not None) for a in assess({"ki": 0.05}, "pid", OperatingPoint(1.0), 40.0, 10.0)]
    [('up', True), ('down', True)]
    """
    modes = (
        [("up", float(delay_s), True), ("down", float(dt_s if down_delay_s is None else down_delay_s), False)]
        if dead_time_comp
        else [("plain", float(delay_s), False)]
    )
    out = []
    for mode, dl, comp in modes:
        model = LoopModel.from_gains(
            gains,
            controller,
            plant_gain=operating_point.plant_gain,
            delay_s=dl,
            dt_s=dt_s,
            compensated=comp,
            time_scale_s=time_scale_s,
            direction="down" if mode == "down" else "up",
        )
        r = float(np.max(np.abs(np.linalg.eigvals(closed_loop_matrix(model)))))
        cert = certify(
            gains, controller, operating_point, dl, dt_s, compensated=comp, time_scale_s=time_scale_s,
            direction="down" if mode == "down" else "up",
        )  # fmt: skip
        why = (
            ""
            if cert is not None
            else (
                f"spectral radius {r:.4f} >= 1: the linear loop is unstable"
                if r >= 1.0 - 1e-9
                else f"spectral radius {r:.4f} < 1 but the Lyapunov checks failed numerically"
            )
        )
        out.append(Assessment(mode, dl, model.d, r, None if comp else margins(model), cert, why))
    return out


# -- the robust certificate: an interval of plant gain, required margins, both modes and their switching --

#: Required at every plant gain of the interval, in every mode (issue 35): 6 dB, 30 deg, 2 windows.
REQUIRED_GAIN_MARGIN = 2.0
REQUIRED_PHASE_MARGIN_DEG = 30.0
REQUIRED_DELAY_MARGIN_WINDOWS = 2.0
B_GRID = 41  # plant gains on the interval, ends included
ALPHA_STEP = 0.05  # the adaptation's reachable orders are sampled this finely (ends included)
_MARGIN_GRID = 4_000
MAX_SDP_ORDER = 32  # state dimension above which the switching SDP is refused (68: about 4 minutes)  # frequencies per margin evaluation in the sweep (each crossing is bisected)


class SolverMissing(ParameterError):
    """cvxpy (the SDP for a common Lyapunov function) is not installed."""


@dataclass(frozen=True)
class PlantGainRange:
    """The interval of ``b = -d eps / d log(replicas)`` the loop must be certified
    over, and how it was measured (printed with the certificate)."""

    lo: float
    hi: float
    source: str = ""

    def __post_init__(self) -> None:
        if not check_number("plant_gain_range", self.lo) > 0.0:
            raise ParameterError(f"plant_gain_range={self.lo},{self.hi}: the low end must be > 0")
        if not check_number("plant_gain_range", self.hi) >= self.lo:
            raise ParameterError(f"plant_gain_range={self.lo},{self.hi}: need LO <= HI")

    def grid(self, n: int = B_GRID) -> Array:
        """``n`` plant gains from ``lo`` to ``hi`` (one when the interval is a point)."""
        out: Array = np.linspace(self.lo, self.hi, n if self.hi > self.lo else 1)
        return out


@dataclass(frozen=True)
class Worst:
    """The worst value of one margin over the sweep, and where (plant gain, order)."""

    value: float
    plant_gain: float
    alpha: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"value": _finite(self.value), "plant_gain": self.plant_gain, "alpha": self.alpha}


@dataclass(frozen=True)
class ModeReport:
    """One mode over the plant-gain interval (and the reachable orders)."""

    mode: str
    direction: str
    compensated: bool
    delay_s: float
    delay_windows: int
    gain_margin: Worst
    phase_margin_deg: Worst
    delay_margin_windows: Worst
    spectral_radius: Worst  # the largest over the sweep
    spectral_radius_ends: tuple[float, float]  # the largest over the orders, at b = lo and b = hi
    failures: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "direction": self.direction,
            "compensated": self.compensated,
            "delay_s": self.delay_s,
            "delay_windows": self.delay_windows,
            "gain_margin": self.gain_margin.to_dict(),
            "phase_margin_deg": self.phase_margin_deg.to_dict(),
            "delay_margin_windows": self.delay_margin_windows.to_dict(),
            "spectral_radius": self.spectral_radius.to_dict(),
            "spectral_radius_ends": list(self.spectral_radius_ends),
            "certified": self.ok,
            "failures": list(self.failures),
        }


@dataclass(frozen=True)
class Switching:
    """How the switching between the modes is covered: ``common`` (one quadratic
    Lyapunov function of every vertex), ``dwell`` (per-mode functions and a
    dwell in the up mode, enforced by the controller), ``none``, or ``skipped``
    (the SDP not run: the margins alone were asked for)."""

    kind: str
    order: int
    vertices: int
    dwell_windows_enforced: int
    rho: float | None = None  # certified decay of V per window (common: every vertex; dwell: the up mode)
    cond_p: float | None = None
    dwell_windows_needed: int | None = None
    mu: float | None = None
    why: str = ""

    @property
    def ok(self) -> bool:
        return self.kind == "common" or (
            self.kind == "dwell"
            and self.dwell_windows_needed is not None
            and self.dwell_windows_enforced >= self.dwell_windows_needed
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["certified"] = self.ok
        return {k: _finite(v) if isinstance(v, float) else v for k, v in d.items()}


@dataclass(frozen=True)
class RobustCertificate:
    """The certificate of ``governor analyze gains``: every mode meets the required
    margins at every plant gain of the interval (and every reachable order), and
    the switching is covered."""

    controller: str
    plant_gain_range: PlantGainRange
    alphas: tuple[float, ...]
    alpha_note: str
    modes: tuple[ModeReport, ...]
    switching: Switching

    @property
    def certified(self) -> bool:
        return all(m.ok for m in self.modes) and self.switching.ok

    @property
    def reasons(self) -> list[str]:
        """Why not certified (empty when it is)."""
        out = [f"{m.mode}: {f}" for m in self.modes for f in m.failures]
        if not self.switching.ok:
            out.append(f"switching: {self.switching.why}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "controller": self.controller,
            "plant_gain_range": asdict(self.plant_gain_range),
            "required": {
                "gain_margin": REQUIRED_GAIN_MARGIN,
                "phase_margin_deg": REQUIRED_PHASE_MARGIN_DEG,
                "delay_margin_windows": REQUIRED_DELAY_MARGIN_WINDOWS,
            },
            "alphas": list(self.alphas),
            "alpha_note": self.alpha_note,
            "modes": [m.to_dict() for m in self.modes],
            "switching": self.switching.to_dict(),
            "certified": self.certified,
            "reasons": self.reasons,
        }


def reachable_alphas(
    gains: Mapping[str, Any], controller: str, step: float = ALPHA_STEP
) -> tuple[tuple[float, ...], str]:
    """The orders fpid can run at, sampled, and a sentence saying how: only
    ``alpha`` when the adaptation is off (``eta = 0``), else the clip interval
    ``[max(alpha_floor, alpha_lo), alpha_hi]`` (FpidParams' defaults where
    ``gains`` has none) every ``step``, ends and ``alpha`` included.  pid: ``()``."""
    if controller != "fpid":
        return (), ""
    from controllers.fpid import FpidParams  # the clip the controller applies

    shipped = FpidParams()
    alpha = check_number("alpha", gains.get("alpha", shipped.alpha))
    if check_number("eta", gains.get("eta", shipped.eta)) == 0.0:
        return (alpha,), f"adaptation off (eta = 0): alpha = {alpha:g} only"
    lo = check_number("alpha_lo", gains.get("alpha_lo", shipped.alpha_lo))
    hi = check_number("alpha_hi", gains.get("alpha_hi", shipped.alpha_hi))
    kp, ki = gain_of(gains, "kp"), gain_of(gains, "ki")
    floor = max(0.1, 2.0 * ki / kp) if ki > 0.0 and kp > 0.0 else 0.1
    lo = max(lo, floor)
    if not lo <= hi:
        raise ParameterError(f"alpha_lo={lo:g}: above alpha_hi={hi:g}")
    n = max(1, math.ceil((hi - lo) / step - 1e-9))
    grid = sorted({*(float(x) for x in np.linspace(lo, hi, n + 1)), alpha})
    return tuple(grid), (
        f"adaptation on: alpha clipped to [{lo:g}, {hi:g}], sampled every {(hi - lo) / n:.3g} "
        "(the loop is not affine in alpha: the orders between the samples are not certified)"
    )


def _mode_report(
    models: list[tuple[float, float | None, LoopModel]], mode: str, direction: str, delay_s: float
) -> tuple[ModeReport, list[Array]]:
    """Margins and spectral radii of one mode over its sweep; the vertices (b ends) for the SDP."""
    lo_b, hi_b = min(b for b, _, _ in models), max(b for b, _, _ in models)
    worst: dict[str, Worst] = {}
    ends = {lo_b: 0.0, hi_b: 0.0}
    verts = []
    for b, alpha, m in models:
        a = closed_loop_matrix(m)
        r = float(np.max(np.abs(np.linalg.eigvals(a))))
        mg = margins(m, grid=_MARGIN_GRID)
        if b in ends:
            ends[b] = max(ends[b], r)
            verts.append(a)
        # the smallest margins and the largest spectral radius over the sweep
        for name, key in (("gm", mg.gain_margin), ("pm", mg.phase_margin_deg), ("dm", mg.delay_margin_windows)):
            if name not in worst or key < worst[name].value:
                worst[name] = Worst(key, b, alpha)
        if "sr" not in worst or r > worst["sr"].value:
            worst["sr"] = Worst(r, b, alpha)
    gm, pm, dm, sr = worst["gm"], worst["pm"], worst["dm"], worst["sr"]
    at = " (alpha {a:g})"
    fails = []
    if not sr.value < 1.0 - 1e-9:
        fails.append(
            f"spectral radius {sr.value:.4f} >= 1 at b = {sr.plant_gain:.3g}"
            + (at.format(a=sr.alpha) if sr.alpha is not None else "")
        )
    for label, w, need, unit in (
        ("gain margin", gm, REQUIRED_GAIN_MARGIN, ""),
        ("phase margin", pm, REQUIRED_PHASE_MARGIN_DEG, " deg"),
        ("delay margin", dm, REQUIRED_DELAY_MARGIN_WINDOWS, " windows"),
    ):
        if not w.value >= need:
            fails.append(
                f"{label} {w.value:.3f}{unit} < {need:g}{unit} at b = {w.plant_gain:.3g}"
                + (at.format(a=w.alpha) if w.alpha is not None else "")
            )
    first = models[0][2]
    report = ModeReport(
        mode=mode,
        direction=direction,
        compensated=first.compensated,
        delay_s=delay_s,
        delay_windows=first.d,
        gain_margin=gm,
        phase_margin_deg=pm,
        delay_margin_windows=dm,
        spectral_radius=sr,
        spectral_radius_ends=(ends[lo_b], ends[hi_b]),
        failures=tuple(fails),
    )
    return report, verts


def _pad(a: Array, n: int) -> Array:
    """``a`` (a companion matrix) in the ``n``-dimensional state of the longer recurrence."""
    return companion(np.concatenate((a[0], np.zeros(n - a.shape[0]))))


def common_lyapunov(mats: list[Array]) -> tuple[Array, float] | None:
    """``(P, rho)``: one ``P > 0`` with ``A^T P A <= rho^2 P``, ``rho < 1``, for every
    ``A`` in ``mats`` (an SDP, cvxpy with Clarabel: ``min t`` subject to
    ``I <= P <= t I`` and ``A^T P A - P <= -I``), checked here with numpy
    (Cholesky of ``P``; ``rho^2`` = the largest generalised eigenvalue of
    ``(A^T P A, P)`` over the vertices).  ``None`` when none is found."""
    try:
        import cvxpy as cp
    except ImportError:  # pragma: no cover - exercised where cvxpy is absent
        raise SolverMissing("the switching certificate needs cvxpy (an SDP): pip install 'governor[bench]'") from None
    n = mats[0].shape[0]
    eye = np.eye(n)
    p: Any = cp.Variable((n, n), symmetric=True)
    t: Any = cp.Variable()
    cons = [p >> eye, p << t * eye]
    for a in mats:
        m = a.T @ p @ a - p
        cons.append(0.5 * (m + m.T) << -eye)
    prob = cp.Problem(cp.Minimize(t), cons)
    if not _solve(prob):
        return None
    if prob.status not in ("optimal", "optimal_inaccurate") or p.value is None:
        return None
    pv = 0.5 * (np.asarray(p.value, dtype=np.float64) + np.asarray(p.value, dtype=np.float64).T)
    rho = _decay(pv, mats)
    if rho is None or not rho < 1.0 - 1e-9:
        return None
    return pv, rho


def _decay(p: Array, mats: list[Array]) -> float | None:
    """``max_A sqrt(lambda_max(A^T P A, P))``, or ``None`` when ``P`` is not positive definite."""
    try:
        low = np.linalg.cholesky(p)
    except np.linalg.LinAlgError:
        return None
    li = np.linalg.inv(low)
    worst = max(float(np.max(np.linalg.eigvalsh(li @ a.T @ p @ a @ li.T))) for a in mats)
    return math.sqrt(max(worst, 0.0))


def _gen_eig_max(p1: Array, p2: Array) -> float:
    """``max_x x^T p1 x / x^T p2 x``."""
    li = np.linalg.inv(np.linalg.cholesky(p2))
    return float(np.max(np.linalg.eigvalsh(li @ p1 @ li.T)))


def _dwell_pair(up: list[Array], down: list[Array], rho: float, s: float) -> tuple[Array, Array] | None:
    """``(P_up, P_down)`` with ``A_u^T P_up A_u <= rho^2 P_up`` (every up vertex),
    ``A_d^T P_down A_d <= P_down`` (every down vertex), ``I <= P_down <= P_up <= s P_down``
    (an SDP feasibility problem), or ``None``."""
    import cvxpy as cp

    n = up[0].shape[0]
    eye = np.eye(n)
    pu: Any = cp.Variable((n, n), symmetric=True)
    pd: Any = cp.Variable((n, n), symmetric=True)
    cons = [pd >> eye, pd << pu, pu << s * pd]
    for a in up:
        m = a.T @ pu @ a - rho**2 * pu
        cons.append(0.5 * (m + m.T) << 0)
    for a in down:
        m = a.T @ pd @ a - pd
        cons.append(0.5 * (m + m.T) << 0)
    prob = cp.Problem(cp.Minimize(0), cons)
    if not _solve(prob):
        return None
    if prob.status != "optimal" or pu.value is None or pd.value is None:
        return None
    return _sym(pu.value), _sym(pd.value)


def _solve(prob: Any) -> bool:
    """Solve with Clarabel; ``False`` on a solver error (the caller reads the status;
    its "may be inaccurate" warnings are not shown: every ``P`` is checked with numpy)."""
    import warnings

    import cvxpy as cp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            prob.solve(solver=cp.CLARABEL)
        except cp.error.SolverError:
            return False
    return True


def _sym(x: Any) -> Array:
    a = np.asarray(x, dtype=np.float64)
    out: Array = 0.5 * (a + a.T)
    return out


def dwell_certificate(up: list[Array], down: list[Array]) -> tuple[int, float, float, Array] | None:
    """The shortest dwell in the up mode found: ``(N, rho_up, mu, P_up)``.

    ``V_up = x^T P_up x`` falls by ``rho_up^2`` a window in the up mode (every
    vertex), ``V_down`` does not rise in the down mode, and a switch multiplies
    ``V`` by at most ``mu_ud`` (up to down) and ``mu_du`` (down to up), the
    largest generalised eigenvalues of the pair.  Over a cycle of ``n_up >= N``
    windows up and any number down, ``V`` is multiplied by at most
    ``mu rho_up^(2 n_up)``, ``mu = mu_ud mu_du``: it falls once
    ``N >= ln(mu) / (-2 ln rho_up)``.  ``rho_up`` is tried at a few points
    between the up vertices' largest spectral radius and 1, ``mu`` bisected for
    each (SDP feasibility); ``N``, ``rho_up`` and ``mu`` are recomputed with
    numpy from the returned ``P`` (not taken from the solver)."""
    r = max(float(np.max(np.abs(np.linalg.eigvals(a)))) for a in up)
    best: tuple[int, float, float, Array] | None = None
    for f in (0.1, 0.2, 0.35, 0.5):
        rho = r + f * (1.0 - r)
        lo, hi, found = 0.0, 12.0, None
        for _ in range(10):
            mid = 0.5 * (lo + hi)
            pair = _dwell_pair(up, down, rho, math.exp(mid))
            if pair is None:
                lo = mid
            else:
                hi, found = mid, pair
        if found is None:
            continue
        p_up, p_down = found
        rho_up, rho_down = _decay(p_up, up), _decay(p_down, down)
        if rho_up is None or rho_down is None or not rho_up < 1.0 - 1e-9 or rho_down > 1.0 + 1e-7:
            continue
        mu = _gen_eig_max(p_up, p_down) * _gen_eig_max(p_down, p_up) * max(rho_down, 1.0) ** 2
        need = max(1, math.ceil(math.log(max(mu, 1.0)) / (-2.0 * math.log(rho_up)) + 1e-9))
        if best is None or need < best[0]:
            best = (need, rho_up, mu, p_up)
    return best


def switching_certificate(up: list[Array], down: list[Array], dwell_windows: int) -> Switching:
    """A common quadratic Lyapunov function of every vertex of both modes, or else
    the dwell the up mode needs (:func:`dwell_certificate`), compared with the
    dwell the controller enforces (``dwell_windows``)."""
    n = max(a.shape[0] for a in up + down)
    up_n, down_n = [_pad(a, n) for a in up], [_pad(a, n) for a in down]
    head = {"order": n, "vertices": len(up_n + down_n), "dwell_windows_enforced": dwell_windows}
    if n > MAX_SDP_ORDER:
        why = (
            f"the loop's state has {n} dimensions: the SDP is too slow above {MAX_SDP_ORDER} (minutes at 68); "
            "the switching is not certified (fpid at alpha != 1 keeps its whole memory)"
        )
        return Switching("none", **head, why=why)
    common = common_lyapunov(up_n + down_n)
    if common is not None:
        p, rho = common
        return Switching("common", **head, rho=rho, cond_p=float(np.linalg.cond(p)))
    found = dwell_certificate(up_n, down_n)
    if found is None:
        return Switching("none", **head, why="no common quadratic Lyapunov function, and no dwell certificate found")
    need, rho_up, mu, p_up = found
    why = (
        ""
        if dwell_windows >= need
        else f"no common quadratic Lyapunov function; the up mode needs a dwell of {need} windows "
        f"before a scale-down (scale_down_dwell_windows = {dwell_windows})"
    )
    return Switching(
        "dwell", **head, rho=rho_up, cond_p=float(np.linalg.cond(p_up)), dwell_windows_needed=need, mu=mu, why=why
    )


def robust_certificate(
    gains: Mapping[str, Any],
    controller: str,
    plant_gain_range: PlantGainRange,
    delay_s: float,
    dt_s: float,
    *,
    dead_time_comp: bool = True,
    down_delay_s: float | None = None,
    time_scale_s: float | None = None,
    dwell_windows: int = 0,
    b_grid: int = B_GRID,
    sdp: bool = True,
) -> RobustCertificate:
    """The certificate over ``plant_gain_range`` (see the module docstring,
    "Robust certificate").  Bad inputs raise :class:`ParameterError`.

    ``sdp=False``: the margins only; the switching is reported as ``skipped`` (not
    certified) without the SDP, for a caller without cvxpy or one that pre-screens
    candidates (:mod:`controllers.gain_certificate`)."""
    if not isinstance(plant_gain_range, PlantGainRange):
        raise ParameterError("plant_gain_range: need a PlantGainRange")
    if isinstance(dwell_windows, bool) or not isinstance(dwell_windows, int) or dwell_windows < 0:
        raise ParameterError(f"scale_down_dwell_windows={dwell_windows!r}: must be an int >= 0")
    alphas, note = reachable_alphas(gains, controller)
    down_delay = float(dt_s if down_delay_s is None else down_delay_s)
    spec = [("up", "up", float(delay_s), dead_time_comp), ("down", "down", down_delay, False)]
    reports, verts = [], {}
    for mode, direction, dl, comp in spec:
        models = [
            (
                float(b),
                alpha,
                LoopModel.from_gains(
                    gains,
                    controller,
                    plant_gain=float(b),
                    delay_s=dl,
                    dt_s=dt_s,
                    compensated=comp,
                    time_scale_s=time_scale_s,
                    direction=direction,
                    alpha=alpha,
                ),
            )  # fmt: skip
            for b in plant_gain_range.grid(b_grid)
            for alpha in (alphas or (None,))
        ]
        report, v = _mode_report(models, mode, direction, dl)
        reports.append(report)
        verts[mode] = v
    if not sdp:
        n = max(a.shape[0] for v in verts.values() for a in v)
        why = "skipped: the margins only (no SDP)"
        switching = Switching("skipped", n, sum(len(v) for v in verts.values()), dwell_windows, why=why)
    elif all(r.spectral_radius.value < 1.0 for r in reports):
        switching = switching_certificate(verts["up"], verts["down"], dwell_windows)
    else:
        n = max(a.shape[0] for v in verts.values() for a in v)
        why = "a mode is unstable at some plant gain of the interval"
        switching = Switching("none", n, sum(len(v) for v in verts.values()), dwell_windows, why=why)
    return RobustCertificate(controller, plant_gain_range, alphas, note, tuple(reports), switching)
