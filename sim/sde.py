"""Latency as an Ito SDE (docs/model.md §10 (sde)): presets, simulation, OU fit, jitter.

``dL = mu(L, t) dt + sigma(L, t) dW``. Drift and diffusion are pluggable
callables ``f(L, t) -> array``; the presets are small frozen dataclasses so
parameter sets pickle. Two presets:

- :meth:`SdeParams.article`: ``mu = 0.8 max(0, L - 150)``,
  ``sigma = 12 (1 + 0.02 t)``, ``dt = 0.01 s`` (the design source's form; no
  reversion, so it explodes once past the knee).
- :meth:`SdeParams.mean_reverting`: ``mu = theta (L_bar - L) + k max(0, L - L_knee)``,
  constant ``sigma0`` (the design source's Correction; stable while ``k < theta``).

:class:`JitterProcess` is the per-replica service-time multiplier the fleet
uses: ``factor = clip(L / L_bar, 0.5, 3)`` with L advanced lazily by the exact
Ornstein-Uhlenbeck transition for the linear part and an explicit Euler step
(at most ``max_substep_s`` long) for the knee term.

Examples
--------
>>> rng = np.random.default_rng(0)
>>> path = simulate(SdeParams.mean_reverting(L_bar=100.0), 100.0, 60.0, rng=rng)
>>> path.shape
(6001,)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Field = Callable[[np.ndarray, float], np.ndarray]


class SdeParamError(ValueError):
    """An SDE parameter is invalid (names the parameter)."""


@dataclass(frozen=True)
class KneeDrift:
    """The design source's drift ``gain * max(0, L - knee)`` (docs/model.md §10 (sde))."""

    gain: float = 0.8
    knee: float = 150.0

    def __call__(self, L: np.ndarray, t: float) -> np.ndarray:
        return self.gain * np.maximum(0.0, L - self.knee)


@dataclass(frozen=True)
class MeanRevertingDrift:
    """``theta (L_bar - L) + k max(0, L - L_knee)``."""

    theta: float = 0.03
    L_bar: float = 100.0
    k: float = 0.0
    L_knee: float = 150.0

    def __call__(self, L: np.ndarray, t: float) -> np.ndarray:
        return self.theta * (self.L_bar - L) + self.k * np.maximum(0.0, L - self.L_knee)


@dataclass(frozen=True)
class GrowingDiffusion:
    """The design source's diffusion ``sigma0 (1 + growth t)`` (docs/model.md §10 (sde))."""

    sigma0: float = 12.0
    growth: float = 0.02

    def __call__(self, L: np.ndarray, t: float) -> np.ndarray:
        return np.full_like(L, self.sigma0 * (1.0 + self.growth * t), dtype=float)


@dataclass(frozen=True)
class ConstantDiffusion:
    """Constant diffusion ``sigma``."""

    sigma: float = 8.0

    def __call__(self, L: np.ndarray, t: float) -> np.ndarray:
        return np.full_like(L, self.sigma, dtype=float)


@dataclass(frozen=True)
class SdeParams:
    """Drift, diffusion and integration step of the latency SDE.

    Parameters
    ----------
    drift, diffusion : callable
        ``f(L: ndarray, t: float) -> ndarray`` in ms/s and ms/sqrt(s).
    dt_s : float
        Euler-Maruyama step (s).
    name : str
        Label.
    """

    drift: Field
    diffusion: Field
    dt_s: float = 0.01
    name: str = "custom"

    def __post_init__(self) -> None:
        if not (self.dt_s > 0 and math.isfinite(self.dt_s)):
            raise SdeParamError(f"dt_s: must be positive and finite, got {self.dt_s}")
        if not callable(self.drift) or not callable(self.diffusion):
            raise SdeParamError("drift/diffusion: must be callables f(L, t)")

    @classmethod
    def article(cls) -> SdeParams:
        """The design source's preset: knee drift at 150 ms, diffusion growing with t.

        See docs/model.md §10 (sde).

        Examples
        --------
        >>> p = SdeParams.article()
        >>> float(p.drift(np.array([200.0]), 0.0)[0]), float(p.diffusion(np.array([0.0]), 50.0)[0])
        (40.0, 24.0)
        """
        return cls(KneeDrift(0.8, 150.0), GrowingDiffusion(12.0, 0.02), 0.01, "article")

    @classmethod
    def mean_reverting(
        cls,
        theta: float = 0.03,
        L_bar: float = 100.0,
        k: float = 0.0,
        L_knee: float = 150.0,
        sigma0: float = 8.0,
        dt_s: float = 0.01,
    ) -> SdeParams:
        """Mean-reverting preset with an optional self-feeding knee.

        Examples
        --------
        >>> p = SdeParams.mean_reverting(theta=0.5, L_bar=100.0)
        >>> float(p.drift(np.array([120.0]), 0.0)[0])
        -10.0
        """
        for nm, v in (("theta", theta), ("sigma0", sigma0), ("L_bar", L_bar)):
            if not (v >= 0 and math.isfinite(v)):
                raise SdeParamError(f"{nm}: must be finite and >= 0, got {v}")
        if k < 0:
            raise SdeParamError(f"k: must be >= 0, got {k}")
        return cls(MeanRevertingDrift(theta, L_bar, k, L_knee), ConstantDiffusion(sigma0), dt_s, "mean_reverting")


def simulate(
    params: SdeParams,
    L0: float | np.ndarray,
    duration_s: float,
    dt_s: float | None = None,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Euler-Maruyama path(s) of the SDE.

    Vectorised over paths (give ``L0`` as an array); the noise is drawn in one
    call. Returns shape ``(n_steps + 1,)`` for scalar ``L0`` and
    ``(n_steps + 1, n_paths)`` otherwise; row 0 is ``L0``.

    Examples
    --------
    >>> p = SdeParams.mean_reverting(sigma0=0.0)
    >>> float(simulate(p, 100.0, 1.0)[-1])
    100.0
    """
    dt = params.dt_s if dt_s is None else dt_s
    if not dt > 0 or not duration_s >= 0:
        raise SdeParamError(f"dt_s/duration_s: need dt_s > 0 and duration_s >= 0 ({dt}, {duration_s})")
    rng = rng or np.random.default_rng()
    x0 = np.atleast_1d(np.asarray(L0, dtype=float))
    n = int(round(duration_s / dt))
    noise = rng.standard_normal((n, x0.size)) * math.sqrt(dt)
    out = np.empty((n + 1, x0.size))
    out[0] = x = x0
    for i in range(n):
        t = i * dt
        x = x + params.drift(x, t) * dt + params.diffusion(x, t) * noise[i]
        out[i + 1] = x
    return out[:, 0] if np.ndim(L0) == 0 else out


class OUFitError(ValueError):
    """The samples do not support a mean-reverting OU fit."""


def fit_ou(samples: np.ndarray, dt_s: float) -> tuple[float, float, float]:
    """Maximum-likelihood OU parameters ``(theta, mu, sigma)`` by AR(1) regression.

    The exact discretisation ``x[n+1] = a + b x[n] + e`` with
    ``b = exp(-theta dt)``, ``a = mu (1 - b)`` and
    ``var(e) = sigma^2 (1 - b^2) / (2 theta)``; conditional MLE = OLS.

    Examples
    --------
    >>> rng = np.random.default_rng(1)
    >>> x = simulate(SdeParams.mean_reverting(theta=1.0, L_bar=50.0, sigma0=5.0), 50.0, 2000.0, 0.05, rng)
    >>> theta, mu, sigma = fit_ou(x, 0.05)
    >>> abs(theta - 1.0) < 0.2, abs(mu - 50.0) < 1.0, abs(sigma - 5.0) < 0.3
    (True, True, True)
    """
    x = np.asarray(samples, dtype=float).ravel()
    if x.size < 3 or not dt_s > 0:
        raise OUFitError("samples/dt_s: need at least 3 samples and dt_s > 0")
    x0, x1 = x[:-1], x[1:]
    m0, m1 = x0.mean(), x1.mean()
    var0 = np.mean((x0 - m0) ** 2)
    if var0 <= 0:
        raise OUFitError("samples: constant series, theta is unidentifiable")
    b = float(np.mean((x0 - m0) * (x1 - m1)) / var0)
    if not 0 < b < 1:
        raise OUFitError(f"samples: AR(1) coefficient {b:.4f} not in (0, 1): not mean-reverting")
    a = m1 - b * m0
    resid_var = float(np.mean((x1 - a - b * x0) ** 2))
    theta = -math.log(b) / dt_s
    mu = a / (1 - b)
    sigma = math.sqrt(resid_var * 2 * theta / (1 - b * b))
    return theta, float(mu), sigma


class JitterProcess:
    """Per-replica multiplicative service-time factor, advanced lazily.

    ``L`` follows the mean-reverting SDE; ``factor(t) = clip(L(t) / L_bar, lo, hi)``.
    Starts from the stationary law of the linear part so replicas differ at once.

    Parameters
    ----------
    theta, L_bar, sigma0, k, L_knee : float
        As in :meth:`SdeParams.mean_reverting` (ms and 1/s).
    rng : numpy.random.Generator
        Own stream (the fleet gives every replica a spawned generator).
    t0_s : float
        Start time.
    clip : (float, float)
        Factor bounds.
    max_substep_s : float
        Longest step of the knee-term Euler split when ``k > 0``.

    Examples
    --------
    >>> j = JitterProcess(rng=np.random.default_rng(0))
    >>> 0.5 <= j.factor(10.0) <= 3.0
    True
    """

    __slots__ = ("theta", "L_bar", "sigma0", "k", "L_knee", "rng", "t", "L", "lo", "hi", "max_substep_s")

    def __init__(
        self,
        theta: float = 0.03,
        L_bar: float = 100.0,
        sigma0: float = 8.0,
        k: float = 0.0,
        L_knee: float = 150.0,
        rng: np.random.Generator | None = None,
        t0_s: float = 0.0,
        clip: tuple[float, float] = (0.5, 3.0),
        max_substep_s: float = 1.0,
    ) -> None:
        if not theta > 0:
            raise SdeParamError(f"theta: must be > 0 for a lazy OU jitter, got {theta}")
        if not L_bar > 0:
            raise SdeParamError(f"L_bar: must be > 0, got {L_bar}")
        if sigma0 < 0 or k < 0:
            raise SdeParamError("sigma0/k: must be >= 0")
        if not 0 < clip[0] <= clip[1]:
            raise SdeParamError(f"clip: need 0 < lo <= hi, got {clip}")
        self.theta, self.L_bar, self.sigma0, self.k, self.L_knee = theta, L_bar, sigma0, k, L_knee
        self.rng = rng or np.random.default_rng()
        self.lo, self.hi = clip
        self.max_substep_s = max_substep_s
        self.t = t0_s
        self.L = L_bar + sigma0 / math.sqrt(2 * theta) * float(self.rng.standard_normal())

    def _ou(self, h: float) -> None:
        b = math.exp(-self.theta * h)
        sd = self.sigma0 * math.sqrt((1 - b * b) / (2 * self.theta))
        self.L = self.L_bar + (self.L - self.L_bar) * b + sd * float(self.rng.standard_normal())

    def advance(self, t_s: float) -> float:
        """Advance L to ``t_s`` (no-op for earlier times) and return it."""
        h = t_s - self.t
        if h <= 0:
            return self.L
        if self.k == 0:
            self._ou(h)
        else:
            n = max(1, math.ceil(h / self.max_substep_s))
            step = h / n
            for _ in range(n):
                self._ou(step)
                self.L += self.k * max(0.0, self.L - self.L_knee) * step
        self.t = t_s
        return self.L

    def factor(self, t_s: float) -> float:
        """Service-time multiplier at ``t_s``."""
        return min(self.hi, max(self.lo, self.advance(t_s) / self.L_bar))
