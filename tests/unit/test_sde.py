"""Latency SDE: presets, Euler-Maruyama, OU maximum likelihood, lazy jitter."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.sde import (
    JitterProcess,
    OUFitError,
    SdeParamError,
    SdeParams,
    fit_ou,
    simulate,
)

pytestmark = pytest.mark.timeout(120)

# (L, t, drift, diffusion) of the design source's preset, SdeParams.article (docs/model.md §10 (sde))
ARTICLE = [
    (100.0, 0.0, 0.0, 12.0),  # below the knee: no drift
    (150.0, 0.0, 0.0, 12.0),  # at the knee
    (200.0, 0.0, 40.0, 12.0),  # 0.8 * 50
    (100.0, 50.0, 0.0, 24.0),  # 12 * (1 + 0.02 * 50)
]


@pytest.mark.parametrize("L,t,mu,sigma", ARTICLE)
def test_article_preset(L: float, t: float, mu: float, sigma: float) -> None:
    p = SdeParams.article()
    assert p.dt_s == 0.01
    assert float(p.drift(np.array([L]), t)[0]) == pytest.approx(mu)
    assert float(p.diffusion(np.array([L]), t)[0]) == pytest.approx(sigma)


# (theta, L_bar, k, L_knee, L, drift)
MEAN_REVERTING = [
    (0.03, 100.0, 0.0, 150.0, 100.0, 0.0),  # at the mean
    (0.03, 100.0, 0.0, 150.0, 200.0, -3.0),  # pulled back
    (0.03, 100.0, 0.02, 150.0, 200.0, -2.0),  # knee pushes up: -3 + 0.02 * 50
]


@pytest.mark.parametrize("theta,L_bar,k,L_knee,L,mu", MEAN_REVERTING)
def test_mean_reverting_preset(theta, L_bar, k, L_knee, L, mu) -> None:
    p = SdeParams.mean_reverting(theta=theta, L_bar=L_bar, k=k, L_knee=L_knee)
    assert float(p.drift(np.array([L]), 0.0)[0]) == pytest.approx(mu)


def test_presets_pickle() -> None:
    p = SdeParams.mean_reverting()
    assert pickle.loads(pickle.dumps(p)) == p


def test_simulate_deterministic_ode_without_noise() -> None:
    # sigma = 0: Euler on dL = theta (L_bar - L) dt gives L_bar + (L0 - L_bar)(1 - theta dt)^n
    p = SdeParams.mean_reverting(theta=0.5, L_bar=100.0, sigma0=0.0)
    path = simulate(p, 200.0, 10.0, dt_s=0.01)
    assert path.shape == (1001,)
    assert path[-1] == pytest.approx(100.0 + 100.0 * (1 - 0.005) ** 1000)


def test_simulate_seeded_and_vectorised() -> None:
    p = SdeParams.article()
    a = simulate(p, np.array([100.0, 120.0, 140.0]), 5.0, rng=np.random.default_rng(7))
    b = simulate(p, np.array([100.0, 120.0, 140.0]), 5.0, rng=np.random.default_rng(7))
    assert a.shape == (501, 3)
    np.testing.assert_array_equal(a, b)


def test_simulate_article_diffusion_growth() -> None:
    # far below the knee the design source's process is a Brownian motion with sigma 12 (1 + 0.02 t)
    p = SdeParams.article()
    paths = simulate(p, np.full(4000, -1e6), 10.0, rng=np.random.default_rng(3))
    var = np.var(paths[-1] - paths[0])
    expected = sum((12 * (1 + 0.02 * i * 0.01)) ** 2 * 0.01 for i in range(1000))
    assert var == pytest.approx(expected, rel=0.08)


def test_simulate_mean_reverting_stationary_moments() -> None:
    p = SdeParams.mean_reverting(theta=0.5, L_bar=100.0, sigma0=8.0, dt_s=0.01)
    paths = simulate(p, np.full(2000, 100.0), 20.0, rng=np.random.default_rng(11))
    final = paths[-1]
    assert final.mean() == pytest.approx(100.0, abs=0.8)
    assert final.std() == pytest.approx(8.0 / math.sqrt(2 * 0.5), rel=0.06)


# (theta, mu, sigma, dt_s, duration_s): known parameters the fit must recover
OU_CASES = [
    (1.0, 50.0, 5.0, 0.05, 4000.0),
    (0.03, 100.0, 8.0, 1.0, 60000.0),  # the design source's theta and sigma0 (docs/model.md §10 (sde))
    (5.0, 2.0, 1.0, 0.01, 500.0),
]


@pytest.mark.parametrize("theta,mu,sigma,dt,dur", OU_CASES)
def test_fit_ou_recovers_parameters(theta, mu, sigma, dt, dur) -> None:
    rng = np.random.default_rng(2024)
    j = JitterProcess(theta=theta, L_bar=mu, sigma0=sigma, rng=rng)
    x = np.array([j.advance(i * dt) for i in range(int(dur / dt))])
    th, m, s = fit_ou(x, dt)
    assert th == pytest.approx(theta, rel=0.15)
    assert m == pytest.approx(mu, abs=3 * sigma / math.sqrt(2 * theta * dur) + 1e-9)
    assert s == pytest.approx(sigma, rel=0.05)


def test_fit_ou_on_euler_path() -> None:
    p = SdeParams.mean_reverting(theta=0.8, L_bar=120.0, sigma0=6.0, dt_s=0.01)
    x = simulate(p, 120.0, 1200.0, rng=np.random.default_rng(5))[::10]
    th, m, s = fit_ou(x, 0.1)
    assert (th, m, s) == (pytest.approx(0.8, rel=0.15), pytest.approx(120.0, abs=1.5), pytest.approx(6.0, rel=0.05))


@pytest.mark.parametrize(
    "samples,msg",
    [
        (np.ones(100), "constant"),  # no variance
        (np.arange(100.0), "not mean-reverting"),  # a trend: b >= 1
        (np.array([1.0, 2.0]), "at least 3"),  # too short
    ],
)
def test_fit_ou_rejects_unfit_data(samples, msg) -> None:
    with pytest.raises(OUFitError, match=msg):
        fit_ou(samples, 0.1)


def test_jitter_lazy_and_deterministic() -> None:
    a = JitterProcess(rng=np.random.default_rng(9))
    b = JitterProcess(rng=np.random.default_rng(9))
    fa = [a.factor(t) for t in (1.0, 1.0, 0.5, 10.0, 1000.0)]  # earlier time: no-op
    fb = [b.factor(t) for t in (1.0, 1.0, 0.5, 10.0, 1000.0)]
    assert fa == fb
    assert fa[0] == fa[1] == fa[2]


def test_jitter_stationary_law() -> None:
    j = JitterProcess(theta=0.03, L_bar=100.0, sigma0=8.0, rng=np.random.default_rng(1))
    xs = np.array([j.advance(200.0 * i) for i in range(1, 4001)])  # ~independent samples
    assert xs.mean() == pytest.approx(100.0, abs=1.5)
    assert xs.std() == pytest.approx(8.0 / math.sqrt(0.06), rel=0.05)


def test_jitter_knee_stays_bounded_when_k_below_theta() -> None:
    j = JitterProcess(theta=0.5, L_bar=100.0, sigma0=30.0, k=0.3, L_knee=120.0, rng=np.random.default_rng(4))
    xs = np.array([j.advance(0.5 * i) for i in range(1, 20001)])
    assert np.all(np.isfinite(xs)) and xs.max() < 1000.0
    assert xs.mean() > 100.0  # the knee pushes the mean up


@given(seed=st.integers(0, 2**31), times=st.lists(st.floats(0, 1e5), min_size=1, max_size=20))
@settings(max_examples=50, deadline=None)
def test_jitter_factor_within_clip(seed: int, times: list[float]) -> None:
    j = JitterProcess(sigma0=80.0, rng=np.random.default_rng(seed), clip=(0.5, 3.0))
    for t in sorted(times):
        assert 0.5 <= j.factor(t) <= 3.0


@pytest.mark.parametrize(
    "kwargs,param",
    [
        (dict(theta=0.0), "theta"),
        (dict(L_bar=-1.0), "L_bar"),
        (dict(sigma0=-1.0), "sigma0"),
        (dict(clip=(2.0, 1.0)), "clip"),
    ],
)
def test_jitter_validation(kwargs, param) -> None:
    with pytest.raises(SdeParamError, match=param):
        JitterProcess(**kwargs)


@pytest.mark.parametrize(
    "kwargs,param",
    [
        (dict(theta=-0.1), "theta"),
        (dict(sigma0=float("nan")), "sigma0"),
        (dict(k=-1.0), "k"),
        (dict(dt_s=0.0), "dt_s"),
    ],
)
def test_params_validation(kwargs, param) -> None:
    with pytest.raises(SdeParamError, match=param):
        SdeParams.mean_reverting(**kwargs)
