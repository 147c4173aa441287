"""Drift detectors: step changes found within N samples (both directions),
no false alarm on long stationary streams, snapshots resume identically."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from controllers.drift import DriftDetector, DriftEvent
from controllers.errors import ParameterError

CHANGE_AT = 2000
PH_PARAMS = {"delta": 5.0, "threshold": 200.0}  # k = 0.5 sigma, h = 20 sigma for Poisson(100)


def latency_ms(rng: np.random.Generator, median_ms: float, n: int) -> np.ndarray:
    """Heavy-tailed latency: lognormal, sigma 0.6 (p99/p50 ~ 4)."""
    return np.exp(rng.normal(math.log(median_ms), 0.6, size=n))


def arrivals(rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
    """Per-interval arrival counts: Poisson."""
    return rng.poisson(rate, size=n).astype(float)


def events(det: DriftDetector, xs) -> list[DriftEvent]:
    return [e for e in (det.update(float(x)) for x in xs) if e is not None]


@pytest.mark.parametrize(
    ("kind", "gen", "before", "after", "within", "direction"),
    [
        ("adwin", latency_ms, 80.0, 120.0, 200, "up"),  # latency median +50 %
        ("adwin", latency_ms, 120.0, 80.0, 200, "down"),  # latency recovers
        ("page_hinkley", arrivals, 100.0, 115.0, 40, "up"),  # arrival rate +1.5 sigma
        ("page_hinkley", arrivals, 115.0, 100.0, 40, "down"),  # arrival rate drops
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_step_change_is_detected_within_n_samples(kind, gen, before, after, within, direction, seed) -> None:
    rng = np.random.default_rng(seed)
    xs = np.concatenate([gen(rng, before, CHANGE_AT), gen(rng, after, CHANGE_AT)])
    params = PH_PARAMS if kind == "page_hinkley" else {}
    evs = events(DriftDetector(kind, signal="sig", **params), xs)
    assert evs, "no detection"
    first = evs[0]
    # measured delays: ADWIN 16-144 samples (it checks every 32), Page-Hinkley 15-23
    assert CHANGE_AT < first.n_seen <= CHANGE_AT + within
    assert first.direction == direction and first.kind == kind and first.signal == "sig"
    assert first.value == xs[first.n_seen - 1]


@pytest.mark.parametrize(
    ("kind", "gen", "level", "n"),
    [
        ("adwin", latency_ms, 80.0, 20_000),  # heavy tails alone do not trigger ADWIN
        ("page_hinkley", arrivals, 100.0, 20_000),  # Poisson noise alone does not trigger PH
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_false_alarm_on_stationary_data(kind, gen, level, n, seed) -> None:
    params = PH_PARAMS if kind == "page_hinkley" else {}
    det = DriftDetector(kind, **params)
    assert events(det, gen(np.random.default_rng(seed), level, n)) == []
    assert det.n_seen == n and det.n_detections == 0


def test_rivers_forgetting_default_would_false_alarm() -> None:
    # why alpha defaults to 1 here: River's 1 - 1e-4 fires on this stationary stream
    xs = arrivals(np.random.default_rng(0), 100.0, 20_000)
    assert events(DriftDetector("page_hinkley", alpha=1 - 1e-4, **PH_PARAMS), xs)
    assert not events(DriftDetector("page_hinkley", **PH_PARAMS), xs)


@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("adwin", {"delta": 0.01}),  # more sensitive ADWIN: several detections
        ("page_hinkley", {"delta": 2.0, "threshold": 60.0}),  # jumpy PH
    ],
)
def test_snapshot_resumes_identically(kind, params) -> None:
    rng = np.random.default_rng(5)
    xs = np.concatenate([arrivals(rng, r, 700) for r in (100.0, 130.0, 90.0, 140.0)])
    live = DriftDetector(kind, signal="arrival_rps", **params)
    head = events(live, xs[:1400])
    restored = DriftDetector.from_state(json.loads(json.dumps(live.to_state(), allow_nan=False)))
    tail_live, tail_restored = events(live, xs[1400:]), events(restored, xs[1400:])
    assert tail_live == tail_restored
    assert restored.to_state() == live.to_state()
    assert len(head) + len(tail_live) >= 3  # the snapshot carried real detector state
    assert restored.n_seen == live.n_seen == len(xs)


def test_event_to_dict() -> None:
    rng = np.random.default_rng(0)
    xs = np.concatenate([arrivals(rng, 100.0, 500), arrivals(rng, 150.0, 100)])
    ev = events(DriftDetector("page_hinkley", **PH_PARAMS), xs)[0]
    d = ev.to_dict()
    assert d["direction"] == "up" and d["n_seen"] == ev.n_seen and d["kind"] == "page_hinkley"
    assert d["mean_after"] > d["mean_before"]


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: DriftDetector("kswin"), "kind"),  # not offered
        (lambda: DriftDetector("adwin", signal=""), "signal"),  # unnamed signal
        (lambda: DriftDetector("adwin", recent_weight=0.0), "recent_weight"),  # EWMA weight
        (lambda: DriftDetector("page_hinkley", mode="sideways"), "params"),  # River rejects
        (lambda: DriftDetector("adwin", bogus=1), "params"),  # unknown River parameter
        (lambda: DriftDetector("adwin").update(float("nan")), "x=nan"),  # not finite
        (lambda: DriftDetector("adwin", clock=0), "params.clock"),  # River would divide by zero
        (lambda: DriftDetector("adwin", max_buckets=1), "params.max_buckets"),  # River would index out
        (lambda: DriftDetector("adwin", delta=1.5), "params.delta"),  # a confidence in (0, 1)
        (lambda: DriftDetector("page_hinkley", alpha="1"), "params.alpha"),  # River takes it, then fails
        (lambda: DriftDetector.from_state([1]), "state"),  # not a detector's state
        (lambda: DriftDetector.from_state({"type": "LoadForecaster", "version": 1}), "state.type"),
    ],
)
def test_validation(build, needle: str) -> None:
    with pytest.raises(ParameterError, match=needle):
        build()
