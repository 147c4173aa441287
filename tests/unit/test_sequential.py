"""controllers.sequential: the SPRT log-likelihood ratio and the quantile exceedance bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from controllers.sequential import quantile_exceedances, sprt_bound, sprt_llr


@pytest.mark.parametrize(
    ("k", "n", "p0", "p1"), [(4, 4, 0.05, 0.5), (3, 200, 0.01, 0.05), (0, 50, 0.01, 0.05), (7, 17, 0.05, 0.5)]
)
def test_sprt_llr_is_the_binomial_likelihood_ratio(k, n, p0, p1) -> None:
    """Oracle: scipy's binomial log-pmf ratio."""
    ref = stats.binom.logpmf(k, n, p1) - stats.binom.logpmf(k, n, p0)
    assert sprt_llr(k, n, p0, p1) == pytest.approx(ref)


def test_sprt_bound_is_log_inverse_alpha() -> None:
    assert sprt_bound(0.001) == pytest.approx(math.log(1000))
    assert sprt_bound(0.05) < sprt_bound(0.001)


def test_quantile_exceedances_never_overcount_samples() -> None:
    """The bound from P50/P95/P99 is at most the true count, on many random samples."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        xs = rng.lognormal(5.0, 1.0, int(rng.integers(1, 400)))
        thr = float(rng.uniform(50, 1000))
        qs = [(q / 100, float(np.percentile(xs, q))) for q in (50, 95, 99)]
        assert 0 <= quantile_exceedances(len(xs), qs, thr) <= int((xs > thr).sum())
