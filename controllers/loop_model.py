"""The scaling loop linearised around an operating point, and its
gain/phase/delay margins (docs/model.md §22 (certified)).

The model (velocity law as a finite filter of the error, static plant gain
``b``, ``d`` whole windows of delay, plain or dead-time compensated), what it
neglects and why, and how the margins are found are stated in
:mod:`controllers.stability`, which adds the Lyapunov certificate.

Examples
--------
>>> m = LoopModel.from_gains({"ki": 0.05}, "pid", plant_gain=1.0, delay_s=10.0, dt_s=10.0)
>>> m.d, m.order, closed_loop_matrix(m)[0].tolist()   # v_k = v_{k-1} - 0.5 v_{k-2}
(1, 4, [1.0, -0.5, 0.0, 0.0])
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from controllers.errors import ParameterError, check_number
from controllers.fpid import gl_weights

__all__ = [
    "CONTROLLERS",
    "MAX_ORDER",
    "Array",
    "LoopModel",
    "Margins",
    "OperatingPoint",
    "closed_loop_matrix",
    "frequency_response",
    "margins",
]

CONTROLLERS = ("pid", "fpid")
MAX_ORDER = 400  # companion dimension cap: d + memory; beyond it the check is refused, not slow
_GRID = 20_000

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class OperatingPoint:
    """Where the plant is linearised: ``b = -d eps / d log(replicas)`` (> 0)
    at a steady load, with the replicas ``replicas`` and the rate ``eps`` there
    (for the record; the linear loop needs only ``b``)."""

    plant_gain: float
    replicas: float | None = None
    eps: float | None = None

    def __post_init__(self) -> None:
        if not check_number("plant_gain", self.plant_gain) > 0.0:
            raise ParameterError(f"plant_gain={self.plant_gain}: must be > 0 (violations fall as replicas rise)")
        if self.replicas is not None and not check_number("replicas", self.replicas) > 0.0:
            raise ParameterError(f"replicas={self.replicas}: must be > 0")
        if self.eps is not None and not 0.0 <= check_number("eps", self.eps) <= 1.0:
            raise ParameterError(f"eps={self.eps}: must lie in [0, 1]")


@dataclass(frozen=True)
class LoopModel:
    """The linear loop: error coefficients ``c``, plant gain ``b``, extra delay
    ``d`` windows, window ``dt_s``, and the mode (plain or dead-time compensated)."""

    coeffs: tuple[float, ...]
    plant_gain: float
    d: int
    dt_s: float
    compensated: bool = False

    def __post_init__(self) -> None:
        if not self.coeffs:
            raise ParameterError("coeffs: need at least one controller coefficient")
        for c in self.coeffs:
            check_number("coeffs", c)
        if not check_number("plant_gain", self.plant_gain) > 0.0:
            raise ParameterError(f"plant_gain={self.plant_gain}: must be > 0")
        if isinstance(self.d, bool) or not isinstance(self.d, int) or self.d < 0:
            raise ParameterError(f"d={self.d!r}: delay in windows must be an int >= 0")
        if not check_number("dt_s", self.dt_s) > 0.0:
            raise ParameterError(f"dt_s={self.dt_s}: must be > 0")
        if self.order > MAX_ORDER:
            raise ParameterError(f"order {self.order} (delay {self.d} windows + memory): above {MAX_ORDER}")

    @property
    def order(self) -> int:
        """Dimension of the closed-loop state."""
        return 1 + self.d + len(self.coeffs) - 1

    @classmethod
    def from_gains(
        cls,
        gains: Mapping[str, Any],
        controller: str,
        *,
        plant_gain: float,
        delay_s: float,
        dt_s: float,
        compensated: bool = False,
        time_scale_s: float | None = None,
    ) -> LoopModel:
        """The loop of ``gains`` (``kp``, ``ki``, ``kd``; fpid also ``alpha``,
        ``memory``) for ``controller`` in :data:`CONTROLLERS`.  fpid's
        ``time_scale_s`` defaults to ``dt_s`` (``h = 1``, as the scaler runs it)."""
        if controller not in CONTROLLERS:
            raise ParameterError(f"controller={controller!r}: choose one of {', '.join(CONTROLLERS)}")
        if not check_number("dt_s", dt_s) > 0.0:
            raise ParameterError(f"dt_s={dt_s}: must be > 0")
        if check_number("delay_s", delay_s) < 0.0:
            raise ParameterError(f"delay_s={delay_s}: must be >= 0")
        if not isinstance(gains, Mapping):
            raise ParameterError(f"gains: need a mapping of gain names to numbers, got {type(gains).__name__}")
        g = {name: _gain(gains, name) for name in ("kp", "ki", "kd")}
        d = math.ceil(delay_s / dt_s - 1e-9)
        coeffs: tuple[float, ...]
        if controller == "pid":
            kp, ki, kd = g["kp"], g["ki"], g["kd"]
            coeffs = (kp + ki * dt_s + kd / dt_s, -kp - 2.0 * kd / dt_s, kd / dt_s)
        else:
            alpha = check_number("alpha", gains.get("alpha", 1.0))
            if not 0.1 <= alpha <= 1.9:
                raise ParameterError(f"alpha={alpha}: must lie in [0.1, 1.9]")
            memory = gains.get("memory", 64)
            if isinstance(memory, float) and memory.is_integer():
                memory = int(memory)
            if isinstance(memory, bool) or not isinstance(memory, int) or not 3 <= memory <= MAX_ORDER:
                raise ParameterError(f"memory={memory!r}: must be an int in [3, {MAX_ORDER}]")
            ts = dt_s if time_scale_s is None else check_number("time_scale_s", time_scale_s)
            if ts <= 0.0:
                raise ParameterError(f"time_scale_s={ts}: must be > 0")
            h = dt_s / ts
            c = g["ki"] * h**alpha * gl_weights(1.0 - alpha, memory)
            c = c + g["kd"] * h ** (-alpha) * gl_weights(1.0 + alpha, memory)
            c[0] += g["kp"]
            c[1] -= g["kp"]
            coeffs = tuple(float(x) for x in c)
        return cls(coeffs, float(plant_gain), d, float(dt_s), compensated)


def _gain(gains: Mapping[str, Any], name: str) -> float:
    value = check_number(name, gains.get(name, 0.0))
    if value < 0.0:
        raise ParameterError(f"{name}={value}: gain must be >= 0")
    return value


def closed_loop_matrix(model: LoopModel) -> Array:
    """Companion matrix ``A`` of the closed loop, ``x_{k+1} = A x_k`` with
    ``x_k = (v_{k-1}, ..., v_{k-n})``.

    >>> closed_loop_matrix(LoopModel((0.5,), 1.0, 0, 10.0)).tolist()   # v_k = 0.5 v_{k-1}
    [[0.5]]
    """
    n = model.order
    a = np.zeros(n)
    a[(model.d if model.compensated else 0)] += 1.0
    a[model.d : model.d + len(model.coeffs)] -= model.plant_gain * np.asarray(model.coeffs)
    A = np.zeros((n, n))
    A[0, :] = a
    A[1:, :-1] = np.eye(n - 1)
    return A


def frequency_response(model: LoopModel, w: npt.ArrayLike) -> npt.NDArray[np.complex128]:
    """Open loop ``L(e^{jw})`` at ``w`` (rad per window, in ``(0, pi]``)."""
    zi = np.exp(-1j * np.asarray(w, dtype=np.float64))
    num = np.polyval(np.asarray(model.coeffs)[::-1], zi)
    base = 1 + model.d if model.compensated else 1
    out: npt.NDArray[np.complex128] = model.plant_gain * zi ** (1 + model.d) * num / (1.0 - zi**base)
    return out


@dataclass(frozen=True)
class Margins:
    """Stability margins of the plain loop; ``inf`` where no crossover exists.
    Frequencies are in rad per window (divide by ``dt_s`` for rad/s).  With
    several crossovers the worst (smallest) margin is reported; every
    crossover is kept in ``gain_margins`` / ``phase_margins`` as
    ``(w, margin)`` pairs."""

    gain_margin: float
    gain_margin_db: float
    phase_crossover: float
    phase_margin_deg: float
    gain_crossover: float
    delay_margin_windows: float
    delay_margin_s: float
    gain_margins: tuple[tuple[float, float], ...] = ()
    phase_margins: tuple[tuple[float, float], ...] = ()


def _bisect(f: Any, lo: float, hi: float, iters: int = 60) -> float:
    flo = f(lo)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        fm = f(mid)
        if (fm > 0) == (flo > 0):
            lo, flo = mid, fm
        else:
            hi = mid
    return 0.5 * (lo + hi)


def margins(model: LoopModel) -> Margins:
    """Gain, phase and delay margins of ``model`` (plain loop only)."""
    if model.compensated:
        raise ParameterError("margins: the compensated loop has open-loop poles on the unit circle; use the plain one")
    w = np.unique(np.concatenate((np.geomspace(1e-6, math.pi, _GRID), np.linspace(1e-3, math.pi, _GRID))))
    lw = frequency_response(model, w)

    def mag(x: float) -> float:
        return float(np.log(np.abs(frequency_response(model, x))))

    def imag(x: float) -> float:
        return float(frequency_response(model, x).imag)

    pms, wcs = [], []
    lm = np.log(np.abs(lw))
    for i in np.flatnonzero(np.sign(lm[:-1]) != np.sign(lm[1:])):
        wc = _bisect(mag, float(w[i]), float(w[i + 1]))
        phase = math.degrees(float(np.angle(frequency_response(model, wc))))
        pms.append(180.0 + phase if phase <= 0 else phase - 180.0)
        wcs.append(wc)
    gms, wps = [], []
    im = lw.imag
    for i in np.flatnonzero(np.sign(im[:-1]) != np.sign(im[1:])):
        wp = _bisect(imag, float(w[i]), float(w[i + 1]))
        lp = frequency_response(model, wp)
        if lp.real < 0:
            gms.append(float(1.0 / abs(lp)))
            wps.append(wp)
    lpi = complex(frequency_response(model, math.pi))
    if lpi.real < 0 and math.pi not in wps:  # L is real at Nyquist: a phase crossover there
        gms.append(float(1.0 / abs(lpi)))
        wps.append(math.pi)
    gm, wp = min(zip(gms, wps, strict=True)) if gms else (math.inf, math.nan)
    pm, wc = min(zip(pms, wcs, strict=True)) if pms else (math.inf, math.nan)
    dm = min((math.radians(p) / x for p, x in zip(pms, wcs, strict=True)), default=math.inf)
    return Margins(
        gain_margin=gm,
        gain_margin_db=20.0 * math.log10(gm) if math.isfinite(gm) else math.inf,
        phase_crossover=wp,
        phase_margin_deg=pm,
        gain_crossover=wc,
        delay_margin_windows=dm,
        delay_margin_s=dm * model.dt_s,
        gain_margins=tuple(zip(wps, gms, strict=True)),
        phase_margins=tuple(zip(wcs, pms, strict=True)),
    )
