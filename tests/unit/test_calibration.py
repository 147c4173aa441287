"""The fleet's jitter is fitted to the measurements, not assumed."""

from __future__ import annotations

import pytest

from sim.calibration import fit_jitter
from sim.fleet import FleetConfig
from sim.perf_model import PerfModel


def test_fit_matches_the_measured_spread_and_is_the_fleet_default() -> None:
    f = fit_jitter()
    assert f.configs > 100
    # run-to-run variability on the Splitwise testbed is small: ~1 % prefill, ~0.4 % decode
    assert 0.005 < f.prefill_cv_median < 0.02 and f.decode_cv_median < f.prefill_cv_median
    assert f.stationary_cv() == pytest.approx(f.target_cv)
    default = FleetConfig(models={"m": PerfModel.from_splitwise()}).jitter_sigma0
    assert default == pytest.approx(f.sigma, abs=0.01)
