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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from controllers.errors import ParameterError, check_number
from controllers.fpid import gl_weights

__all__ = [
    "CONTROLLERS",
    "DIRECTIONS",
    "MAX_ORDER",
    "Array",
    "LoopModel",
    "Margins",
    "OperatingPoint",
    "closed_loop_matrix",
    "delay_response",
    "fpid_memory",
    "frequency_response",
    "gain_of",
    "margins",
    "recurrence",
]

CONTROLLERS = ("pid", "fpid")
DIRECTIONS = ("up", "down")
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
        direction: str = "up",
        alpha: float | None = None,
    ) -> LoopModel:
        """The loop of ``gains`` (``kp``, ``ki``, ``kd``; fpid also ``alpha``,
        ``memory``) for ``controller`` in :data:`CONTROLLERS`.  ``direction``
        ``"down"`` reads the scale-down gains ``kp_down``, ``ki_down``,
        ``kd_down`` (an absent one is the up gain: docs/model.md §4).  fpid's
        ``time_scale_s`` defaults to ``dt_s`` (``h = 1``, as the scaler runs it);
        ``alpha`` overrides the gains' order (the adaptation moves it).

        >>> LoopModel.from_gains({"ki": 0.02, "ki_down": 0.01}, "pid", plant_gain=1.0, delay_s=10.0,
        ...                      dt_s=10.0, direction="down").coeffs[0]
        0.1
        """
        if controller not in CONTROLLERS:
            raise ParameterError(f"controller={controller!r}: choose one of {', '.join(CONTROLLERS)}")
        if direction not in DIRECTIONS:
            raise ParameterError(f"direction={direction!r}: choose one of {', '.join(DIRECTIONS)}")
        if not check_number("dt_s", dt_s) > 0.0:
            raise ParameterError(f"dt_s={dt_s}: must be > 0")
        if check_number("delay_s", delay_s) < 0.0:
            raise ParameterError(f"delay_s={delay_s}: must be >= 0")
        if not isinstance(gains, Mapping):
            raise ParameterError(f"gains: need a mapping of gain names to numbers, got {type(gains).__name__}")
        g = {name: gain_of(gains, name, direction) for name in ("kp", "ki", "kd")}
        d = math.ceil(delay_s / dt_s - 1e-9)
        coeffs: tuple[float, ...]
        if controller == "pid":
            kp, ki, kd = g["kp"], g["ki"], g["kd"]
            coeffs = (kp + ki * dt_s + kd / dt_s, -kp - 2.0 * kd / dt_s, kd / dt_s)
        else:
            order = check_number("alpha", gains.get("alpha", 1.0) if alpha is None else alpha)
            if not 0.1 <= order <= 1.9:
                raise ParameterError(f"alpha={order}: must lie in [0.1, 1.9]")
            memory = fpid_memory(gains)
            ts = dt_s if time_scale_s is None else check_number("time_scale_s", time_scale_s)
            if ts <= 0.0:
                raise ParameterError(f"time_scale_s={ts}: must be > 0")
            h = dt_s / ts
            c = g["ki"] * h**order * gl_weights(1.0 - order, memory)
            c = c + g["kd"] * h ** (-order) * gl_weights(1.0 + order, memory)
            c[0] += g["kp"]
            c[1] -= g["kp"]
            # weights that are exactly zero (alpha = 1: (1, 0, ...) and (1, -2, 1, 0, ...)) add
            # states that never act: dropping them is the same law in fewer dimensions
            last = int(np.flatnonzero(c)[-1]) if np.any(c) else 0
            coeffs = tuple(float(x) for x in c[: max(last + 1, 1)])
        return cls(coeffs, float(plant_gain), d, float(dt_s), compensated)


def fpid_memory(gains: Mapping[str, Any]) -> int:
    """fpid's ``memory`` from ``gains`` (default 64, as FpidParams), validated."""
    memory = gains.get("memory", 64)
    if isinstance(memory, float) and memory.is_integer():
        memory = int(memory)
    if isinstance(memory, bool) or not isinstance(memory, int) or not 3 <= memory <= MAX_ORDER:
        raise ParameterError(f"memory={memory!r}: must be an int in [3, {MAX_ORDER}]")
    return memory


def gain_of(gains: Mapping[str, Any], name: str, direction: str = "up") -> float:
    """Gain ``name`` (``kp``, ``ki``, ``kd``) for ``direction``: ``down`` reads
    ``name_down`` and falls back on the up gain when it is absent (or ``None``)."""
    if direction == "down" and gains.get(f"{name}_down") is not None:
        return _gain(gains, f"{name}_down")
    return _gain(gains, name)


def _gain(gains: Mapping[str, Any], name: str) -> float:
    value = check_number(name, gains.get(name, 0.0))
    if value < 0.0:
        raise ParameterError(f"{name}={value}: gain must be >= 0")
    return value


def recurrence(model: LoopModel) -> tuple[Array, Array, Array]:
    """The closed loop ``v_k = sum_i (own_i + ready_i - b eps_i) v_{k-i}`` split by
    the path each term takes, as three arrays over the lag ``i = 0..order``:

    - ``own``: the controller's own memory (plain: its level ``v_{k-1}``);
    - ``ready``: the plant's ready level, gain 1 (compensated: ``v_{k-1-d}``);
    - ``eps``: the violation rate, per unit of the plant gain ``b``
      (``c_j`` at lag ``1 + d + j``).

    Every open loop below is a ratio of these polynomials in ``z^-1``.

    >>> [x.tolist() for x in recurrence(LoopModel((0.5,), 1.0, 1, 10.0, compensated=True))]
    [[0.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.5]]
    """
    n = model.order
    own, ready, eps = np.zeros(n + 1), np.zeros(n + 1), np.zeros(n + 1)
    (ready if model.compensated else own)[1 + (model.d if model.compensated else 0)] = 1.0
    eps[1 + model.d : 1 + model.d + len(model.coeffs)] = model.coeffs
    return own, ready, eps


def closed_loop_matrix(model: LoopModel) -> Array:
    """Companion matrix ``A`` of the closed loop, ``x_{k+1} = A x_k`` with
    ``x_k = (v_{k-1}, ..., v_{k-n})``.

    >>> closed_loop_matrix(LoopModel((0.5,), 1.0, 0, 10.0)).tolist()   # v_k = 0.5 v_{k-1}
    [[0.5]]
    """
    own, ready, eps = recurrence(model)
    return companion(own[1:] + ready[1:] - model.plant_gain * eps[1:])


def companion(a: Array) -> Array:
    """Companion matrix of ``v_k = sum_i a_i v_{k-i}`` (``a`` over lags 1..n)."""
    n = a.shape[0]
    A = np.zeros((n, n))
    A[0, :] = a
    A[1:, :-1] = np.eye(n - 1)
    return A


def frequency_response(model: LoopModel, w: npt.ArrayLike) -> npt.NDArray[np.complex128]:
    """Open loop at the violation rate, where the plant gain enters:
    ``L_b(z) = b E(z) / (1 - O(z) - R(z))`` (:func:`recurrence`'s polynomials in
    ``z^-1``) at ``z = e^{jw}``, ``w`` in rad per window in ``(0, pi]``.
    ``1 + k L_b`` is the characteristic polynomial with ``b`` multiplied by
    ``k``.  Plain: ``b z^-(1+d) C(z) / (1 - z^-1)``; compensated:
    ``b z^-(1+d) C(z) / (1 - z^-(1+d))`` (poles on the unit circle at the
    ``(1+d)``-th roots of one)."""
    return _open_loops(model)[0](w)


def delay_response(model: LoopModel, w: npt.ArrayLike) -> npt.NDArray[np.complex128]:
    """Open loop at the actuator, where a longer dead time of the plant enters
    (a start-up longer than modelled delays the ready level *and* the
    violations): ``L_d(z) = (b E(z) - R(z)) / (1 - O(z))``; ``1 + z^-tau L_d``
    is the characteristic polynomial with ``tau`` more windows of dead time.
    The plain loop has no ready path: ``L_d = L_b``."""
    return _open_loops(model)[1](w)


Response = Callable[[npt.ArrayLike], npt.NDArray[np.complex128]]


def _open_loops(model: LoopModel) -> tuple[Response, Response]:
    """``(L_b, L_d)`` of ``model`` as functions of ``w`` (the polynomials built once;
    a scalar ``w``, as bisection asks, by one dot product with the powers of ``z^-1``)."""
    own, ready, eps = recurrence(model)
    stack = np.stack((model.plant_gain * eps, own, ready))  # ascending in z^-1
    powers = np.arange(stack.shape[1])

    def parts(w: npt.ArrayLike) -> npt.NDArray[np.complex128]:
        wa = np.asarray(w, dtype=np.float64)
        if wa.ndim == 0:
            out: npt.NDArray[np.complex128] = stack @ np.exp(-1j * float(wa) * powers)
            return out
        zi = np.exp(-1j * wa)
        return np.stack([np.polyval(row[::-1], zi) for row in stack])

    def lb(w: npt.ArrayLike) -> npt.NDArray[np.complex128]:
        e, o, r = parts(w)
        with np.errstate(divide="ignore", invalid="ignore"):
            out: npt.NDArray[np.complex128] = e / (1.0 - o - r)
        return out

    def ld(w: npt.ArrayLike) -> npt.NDArray[np.complex128]:
        e, o, r = parts(w)
        with np.errstate(divide="ignore", invalid="ignore"):
            out: npt.NDArray[np.complex128] = (e - r) / (1.0 - o)
        return out

    return lb, ld


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


def _bisect(f: Any, lo: float, hi: float, iters: int = 48) -> float:
    flo = f(lo)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        fm = f(mid)
        if (fm > 0) == (flo > 0):
            lo, flo = mid, fm
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _crossings(
    resp: Any, w: Array, lw: npt.NDArray[np.complex128]
) -> tuple[list[tuple[float, complex]], list[tuple[float, complex]]]:
    """Gain crossovers ``|L| = 1`` and phase crossovers ``Im L = 0, Re L < 0``
    of ``resp`` on the grid ``w`` (values ``lw``), each refined by bisection;
    a sign change of ``Im L`` across a pole of ``L`` is not a crossover."""

    def mag(x: float) -> float:
        return float(np.log(np.abs(resp(x))))

    def imag(x: float) -> float:
        return float(resp(x).imag)

    gains = []
    with np.errstate(divide="ignore", invalid="ignore"):
        lm = np.log(np.abs(lw))
    ok = np.isfinite(lm)
    for i in np.flatnonzero((np.sign(lm[:-1]) != np.sign(lm[1:])) & ok[:-1] & ok[1:]):
        wc = _bisect(mag, float(w[i]), float(w[i + 1]))
        gains.append((wc, complex(resp(wc))))
    phases = []
    im = lw.imag
    for i in np.flatnonzero((np.sign(im[:-1]) != np.sign(im[1:])) & ok[:-1] & ok[1:]):
        wp = _bisect(imag, float(w[i]), float(w[i + 1]))
        lp = complex(resp(wp))
        if lp.real < 0 and abs(lp.imag) <= 1e-6 * max(1.0, abs(lp)) and abs(lp) < 1e12:
            phases.append((wp, lp))
    lpi = complex(resp(math.pi))
    if lpi.real < 0 and abs(lpi.imag) <= 1e-9 * max(1.0, abs(lpi)) and all(x != math.pi for x, _ in phases):
        phases.append((math.pi, lpi))  # L is real at Nyquist: a phase crossover there
    return gains, phases


def _phase_margin_deg(lc: complex) -> float:
    """The phase, lag or lead, that turns ``lc`` (``|lc| = 1``) into ``-1``:
    ``180 - |arg lc|`` (``180 + arg`` when ``arg <= 0``, the textbook case).
    Near a pole on the unit circle (compensated loop) a crossover can lead
    (``arg > 0``): a phase *lead* of ``180 - arg`` would destabilise it."""
    return 180.0 - abs(math.degrees(float(np.angle(lc))))


def margins(model: LoopModel, *, grid: int = _GRID) -> Margins:
    """Gain, phase and delay margins of ``model``, plain or compensated.

    Gain margin: the factor on the plant gain ``b`` that puts a closed-loop
    pole on the unit circle, ``1 / |L_b|`` at the phase crossovers of
    :func:`frequency_response` (the smallest).  Phase margin: ``180 + arg L_b``
    at its gain crossovers (the smallest): phase lag the violation path
    takes.  Delay margin: the dead time the plant may add, ``PM_d / w`` at
    the gain crossovers of :func:`delay_response` (the smallest; ``inf`` when
    ``|L_d| < 1`` everywhere).  For the plain loop both open loops are one.
    """
    w = np.unique(np.concatenate((np.geomspace(1e-6, math.pi, grid), np.linspace(1e-3, math.pi, grid))))
    lb, ld = _open_loops(model)
    gx, px = _crossings(lb, w, lb(w))
    pms = [(wc, _phase_margin_deg(lc)) for wc, lc in gx]
    gms = [(wp, 1.0 / abs(lp)) for wp, lp in px]
    dgx = gx if not model.compensated else _crossings(ld, w, ld(w))[0]
    # a delay is a pure lag: it reaches -1 after 180 + arg L (in (0, 360]) of lag, at w
    dm = min((math.radians(180.0 + math.degrees(float(np.angle(lc)))) / wc for wc, lc in dgx), default=math.inf)
    wp, gm = min(gms, key=lambda t: t[1]) if gms else (math.nan, math.inf)
    wc, pm = min(pms, key=lambda t: t[1]) if pms else (math.nan, math.inf)
    return Margins(
        gain_margin=gm,
        gain_margin_db=20.0 * math.log10(gm) if math.isfinite(gm) else math.inf,
        phase_crossover=wp,
        phase_margin_deg=pm,
        gain_crossover=wc,
        delay_margin_windows=dm,
        delay_margin_s=dm * model.dt_s,
        gain_margins=tuple(gms),
        phase_margins=tuple(pms),
    )
