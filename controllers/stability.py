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

**Neglected**: the clamp ``[a_min, a_max]``, the slew limit, the deadband,
the replica bounds and the integer rounding.  Around the operating point the
error is a few per cent, so ``delta`` is a few hundredths: far inside the
clamp (``|delta| <= ln 2``) and the slew (``|a_k - a_{k-1}| <= 0.3``); that
small-signal region is where the loop spends its time, and there the linear
recurrence *is* the controller, apart from the deadband (which only lowers
the loop gain, to zero inside the band) and the rounding (a bounded
disturbance of half a replica).  The slew limit adds nothing to stability
near the point; it bounds how fast a large excursion is corrected (the
multiplier ramps by at most 0.3 per window), so it shapes the large-signal
transient, which this certificate does not cover.

**Margins** (plain loop): ``L`` on the unit circle, on a fine grid refined
by bisection at each crossing: gain margin (factor and dB) at the phase
crossover(s) ``Im L = 0, Re L < 0`` (the smallest), phase margin (deg) at the
gain crossover(s) ``|L| = 1`` (the smallest), and the delay margin
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

from controllers.errors import ParameterError
from controllers.loop_model import (
    CONTROLLERS,
    Array,
    LoopModel,
    Margins,
    OperatingPoint,
    closed_loop_matrix,
    frequency_response,
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
    "solve_discrete_lyapunov",
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
    a replica takes effect without a start-up).  A common ``P`` for the
    switching between them is not sought (that needs an LMI solver).

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
        )
        r = float(np.max(np.abs(np.linalg.eigvals(closed_loop_matrix(model)))))
        cert = certify(gains, controller, operating_point, dl, dt_s, compensated=comp, time_scale_s=time_scale_s)
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
