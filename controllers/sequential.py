"""Sequential tests on counts: a one-sided binomial SPRT, and counts from quantiles.

General and pure: a stream of yes/no outcomes (here, a request's latency over
a threshold or not) judged as its counts grow, window after window.
:mod:`controllers.canary` uses it to judge a new version's latency at the
small stages of a rollout (it holds the rollout state machine and picks the
thresholds and the ``p0``, ``p1`` of each test).

**SPRT** (:func:`sprt_llr`, :func:`sprt_bound`): with ``k`` of ``n``
outcomes positive, a one-sided, open-ended sequential probability ratio test
of ``H0: p <= p0`` against ``H1: p = p1`` (``p0 < p1``)::

    llr = k ln(p1 / p0) + (n - k) ln((1 - p1) / (1 - p0))   reject H0 when llr >= ln(1 / alpha)

Under ``H0`` the likelihood ratio is a (super)martingale, so by Ville's
inequality ``H0`` is rejected with probability at most ``alpha`` however
many times the counts are looked at.

**Counts from quantiles** (:func:`quantile_exceedances`): a window reports
quantiles, not its values, so the count over a threshold is a lower bound:
if the window's ``q`` quantile of ``n`` values is over the threshold, at
least ``n - ceil((n - 1) q)`` values are (the rank of the interpolated
quantile).  A lower ``k`` lowers the ratio, so the bound on false rejections
holds (up to the quantile sketch's relative accuracy).

Examples
--------
>>> k = quantile_exceedances(4, [(0.50, 850.0), (0.99, 900.0)], threshold=800.0)
>>> k, sprt_llr(k, 4, p0=0.05, p1=0.5) >= sprt_bound(0.001)     # 2 of 4 over: not yet
(2, False)
>>> sprt_llr(8, 8, p0=0.05, p1=0.5) >= sprt_bound(0.001)        # 8 of 8 over: rejected
True
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from controllers.errors import ParameterError

__all__ = ["quantile_exceedances", "sprt_bound", "sprt_llr"]


def sprt_llr(k: int, n: int, p0: float, p1: float) -> float:
    """Log-likelihood ratio of ``k`` exceedances in ``n`` under ``p1`` against ``p0``.

    >>> round(sprt_llr(4, 4, 0.05, 0.5), 3)        # 4 of 4 over: 4 ln 10
    9.21
    >>> round(sprt_llr(0, 100, 0.01, 0.05), 3)     # 100 under: 100 ln(0.95 / 0.99)
    -4.124
    """
    return k * math.log(p1 / p0) + (n - k) * math.log((1.0 - p1) / (1.0 - p0))


def sprt_bound(alpha: float) -> float:
    """The rejection bound ``ln(1 / alpha)`` of a test with false-rejection rate ``alpha``.

    >>> round(sprt_bound(0.001), 3)
    6.908
    >>> sprt_bound(1.0)
    Traceback (most recent call last):
    ...
    controllers.errors.ParameterError: alpha=1.0: must lie in (0, 1)
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha < 1.0:
        raise ParameterError(f"alpha={alpha!r}: must lie in (0, 1)")
    return math.log(1.0 / alpha)


def quantile_exceedances(n: int, quantiles: Iterable[tuple[float, float | None]], threshold: float) -> int:
    """At least how many of ``n`` values are over ``threshold``, from their quantiles.

    ``quantiles`` holds ``(q, value)`` pairs (value None: unknown).  From the
    lowest ``q`` whose value is over the threshold: the linearly interpolated
    ``q`` quantile of ``n`` values (at rank ``h = (n - 1) q``) exceeds it
    only if the ``n - ceil(h)`` largest values do.

    Examples
    --------
    >>> qs = [(0.50, 500.0), (0.99, 900.0)]
    >>> quantile_exceedances(4, qs, 800.0)                          # only the largest
    1
    >>> quantile_exceedances(4, [(0.50, 850.0), (0.99, 900.0)], 800.0)   # the 2 largest
    2
    >>> quantile_exceedances(1, [(0.99, 900.0)], 800.0)             # a single value
    1
    >>> quantile_exceedances(100, [(0.50, 100.0), (0.99, 700.0)], 800.0)
    0
    """
    pairs = sorted(quantiles, key=lambda qv: qv[0])
    for q, _ in pairs:
        if not 0.0 <= q <= 1.0:
            raise ParameterError(f"q={q!r}: a quantile must lie in [0, 1]")
    for q, v in pairs:
        if n and v is not None and v > threshold:
            return n - math.ceil(round((n - 1) * q, 9))
    return 0
