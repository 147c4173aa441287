"""Online fit of the latency SDE's mean-reverting (Ornstein-Uhlenbeck) part.

docs/model.md §10 (sde), the design source with its Correction: latency follows
``dL = theta (L_bar - L) dt + sigma dW`` plus a queueing knee; the project fits
the parameters from observed latency instead of assuming them.  Sampled every
``dt``, an OU path is an AR(1) process ``L_{k+1} = a + b L_k + e`` with
``b = exp(-theta dt)``, ``a = L_bar (1 - b)`` and
``Var(e) = sigma^2 (1 - b^2) / (2 theta)``; least squares on (L_k, L_{k+1})
is the maximum-likelihood estimate.  :class:`OnlineOuFit` keeps the five
running sums that regression needs, so it costs O(1) per sample; its snapshot
is plain data (:meth:`OnlineOuFit.to_state` / :meth:`OnlineOuFit.from_state`,
the conventions of :mod:`controllers.state`).

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> theta, mu, sigma, dt = 0.05, 400.0, 30.0, 1.0
>>> b = np.exp(-theta * dt); sd = sigma * np.sqrt((1 - b * b) / (2 * theta))
>>> fit, x = OnlineOuFit(), mu
>>> for _ in range(20000):
...     fit = fit.update(x, dt); x = mu + b * (x - mu) + sd * rng.standard_normal()
>>> est = fit.estimate()
>>> bool(abs(est.theta - theta) < 0.01 and abs(est.mu - mu) < 10 and abs(est.sigma - sigma) < 3)
True
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from controllers.errors import ParameterError
from controllers.state import enc_float, header, open_state, show

__all__ = ["OnlineOuFit", "OuEstimate"]


@dataclass(frozen=True)
class OuEstimate:
    theta: float  # mean-reversion rate, 1/s
    mu: float  # long-run level (L_bar)
    sigma: float  # diffusion, units of L per sqrt(s)
    n: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class OnlineOuFit:
    """Running AR(1) regression of consecutive samples (fixed sampling step)."""

    n: int = 0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    syy: float = 0.0
    last: float | None = None
    dt_s: float | None = None

    def update(self, x: float, dt_s: float) -> OnlineOuFit:
        if not (isinstance(x, (int, float)) and math.isfinite(x)):
            raise ParameterError(f"x={x!r}: must be a finite number")
        if not dt_s > 0:
            raise ParameterError(f"dt_s={dt_s}: must be > 0")
        if self.last is None:
            return replace(self, last=float(x), dt_s=float(dt_s))
        p, y = self.last, float(x)
        return replace(
            self,
            n=self.n + 1,
            sx=self.sx + p,
            sy=self.sy + y,
            sxx=self.sxx + p * p,
            sxy=self.sxy + p * y,
            syy=self.syy + y * y,
            last=y,
            dt_s=float(dt_s),
        )

    def estimate(self) -> OuEstimate | None:
        """The ML estimate, or None until it exists (>= 3 pairs, mean reversion seen)."""
        n = self.n
        if n < 3 or self.dt_s is None:
            return None
        var_x = self.sxx - self.sx * self.sx / n
        if var_x <= 0:
            return None
        b = (self.sxy - self.sx * self.sy / n) / var_x
        a = (self.sy - b * self.sx) / n
        if not 0.0 < b < 1.0:
            return None  # no mean reversion visible (or oscillation): no OU fit
        rss = self.syy - 2 * a * self.sy - 2 * b * self.sxy + a * a * n + 2 * a * b * self.sx + b * b * self.sxx
        var_e = max(rss / n, 0.0)
        theta = -math.log(b) / self.dt_s
        sigma = math.sqrt(var_e * 2 * theta / (1 - b * b))
        return OuEstimate(theta=theta, mu=a / (1 - b), sigma=sigma, n=n)

    def to_state(self) -> dict[str, Any]:
        """Plain data (JSON-able, no NaN): ``type``, ``version`` and the fields.

        >>> import json
        >>> fit = OnlineOuFit().update(400.0, 1.0).update(410.0, 1.0)
        >>> OnlineOuFit.from_state(json.loads(json.dumps(fit.to_state()))) == fit
        True
        >>> OnlineOuFit.from_state({**fit.to_state(), "n": -1})
        Traceback (most recent call last):
        ...
        controllers.errors.ParameterError: state.n=-1: must lie in [0, 9223372036854775808]
        """
        return {
            **header("OnlineOuFit"),
            "n": self.n,
            **{k: enc_float(getattr(self, k)) for k in _SUMS},
            "last": None if self.last is None else enc_float(self.last),
            "dt_s": None if self.dt_s is None else enc_float(self.dt_s),
        }

    @classmethod
    def from_state(cls, data: Any) -> OnlineOuFit:
        """Inverse of :meth:`to_state`; :class:`ParameterError` names the bad field."""
        o = open_state(data, "OnlineOuFit", ("n", *_SUMS, "last", "dt_s"))
        n = o.get_int("n", 0, 2**63)
        last = None if o.raw("last") is None else o.get_float("last", finite=True)
        dt_s = None if o.raw("dt_s") is None else o.get_float("dt_s", 0.0, finite=True)
        if dt_s is not None and dt_s <= 0.0:
            raise ParameterError(f"state.dt_s={dt_s!r}: must be > 0")
        if (last is None) != (dt_s is None) or (last is None and n != 0):
            raise ParameterError(
                f"state.last={show(o.raw('last'))}: null exactly when no sample was seen (dt_s null, n 0)"
            )
        sums = {k: o.get_float(k) for k in _SUMS}
        return cls(n=n, last=last, dt_s=dt_s, **sums)


_SUMS = ("sx", "sy", "sxx", "sxy", "syy")
