"""Online OU fit (docs/model.md §10 (sde): fitted, not assumed) and the bandwidth power-law fit
(docs/model.md §21 (bandwidth))."""

from __future__ import annotations

import numpy as np
import pytest

from bench.bandwidth import SEED_TABLE, fit_power_law
from controllers.errors import ParameterError
from controllers.sde_fit import OnlineOuFit
from sim.sde import fit_ou


@pytest.mark.parametrize(
    ("theta", "mu", "sigma", "dt"),
    [
        (0.03, 150.0, 8.0, 1.0),  # the design source's reversion rate and initial jitter (docs/model.md §10 (sde))
        (0.2, 500.0, 40.0, 10.0),  # fast reversion sampled per 10 s window
    ],
)
def test_online_fit_matches_the_batch_ml_fit_and_the_truth(theta, mu, sigma, dt) -> None:
    rng = np.random.default_rng(1)
    b = np.exp(-theta * dt)
    sd = sigma * np.sqrt((1 - b * b) / (2 * theta))
    x = np.empty(20_000)
    x[0] = mu
    for k in range(1, len(x)):
        x[k] = mu + b * (x[k - 1] - mu) + sd * rng.standard_normal()
    fit = OnlineOuFit()
    for v in x:
        fit = fit.update(float(v), dt)
    est = fit.estimate()
    assert est is not None
    ref = fit_ou(x, dt)  # the simulator's batch ML fit: an independent implementation
    assert est.theta == pytest.approx(ref[0], rel=1e-6)
    assert est.mu == pytest.approx(ref[1], rel=1e-6)
    assert est.theta == pytest.approx(theta, rel=0.15)
    assert est.mu == pytest.approx(mu, rel=0.05)
    assert est.sigma == pytest.approx(sigma, rel=0.05)


def test_no_estimate_without_mean_reversion_and_bad_input_refused() -> None:
    fit = OnlineOuFit()
    for v in range(10):  # a ramp: b >= 1, not an OU path
        fit = fit.update(float(v * v), 1.0)
    assert fit.estimate() is None
    with pytest.raises(ParameterError):
        fit.update(float("nan"), 1.0)


def test_power_law_fit_recovers_exact_law_and_reads_the_seed_table() -> None:
    b = np.array([0.1, 1.0, 10.0])
    eps0, a, r2 = fit_power_law(b, 0.12 * b**-0.85)
    assert (eps0, a, r2) == pytest.approx((0.12, 0.85, 1.0))
    # The design source's table is not its formula (docs/model.md §21 (bandwidth)): a ~ 0.5, eps0 ~ 0.036.
    eps0, a, _ = fit_power_law(np.array(list(SEED_TABLE)), np.array(list(SEED_TABLE.values())))
    assert a == pytest.approx(0.504, abs=0.01) and eps0 == pytest.approx(0.036, abs=0.002)
