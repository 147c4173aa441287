"""DDSketch against the numpy oracle, merge properties and round-trips."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controllers.errors import ParameterError
from controllers.sketch import DDSketch

QS = (0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0)
ALPHA = 0.01
MIN_VALUE = 1e-6


def _rng() -> np.random.Generator:
    return np.random.default_rng(20240601)


def _with_zeros() -> np.ndarray:
    data = _rng().exponential(50.0, 5_000)
    data[::4] = 0.0  # a quarter exact zeros
    data[1::7] = 1e-9  # below min_value: the zero bucket
    return data


DISTRIBUTIONS = [
    # latency-like: lognormal body, moderate tail (median ~ 400 ms)
    pytest.param(lambda: _rng().lognormal(6.0, 1.0, 20_000), id="lognormal"),
    # memoryless inter-arrival / service times
    pytest.param(lambda: _rng().exponential(120.0, 20_000), id="exponential"),
    # heavy tail (alpha=1.1): p999 orders of magnitude above the median
    pytest.param(lambda: (_rng().pareto(1.1, 20_000) + 1.0) * 10.0, id="pareto-heavy"),
    # all values identical: every quantile is the constant
    pytest.param(lambda: np.full(1_000, 42.0), id="constant"),
    # zeros and sub-min_value values mixed with positives
    pytest.param(_with_zeros, id="with-zeros"),
    # tiny sample: rank arithmetic of method='lower' matters
    pytest.param(lambda: np.array([3.0, 1.0, 2.0]), id="three-values"),
    # values spanning 12 decades
    pytest.param(lambda: 10.0 ** _rng().uniform(-5, 7, 5_000), id="wide-range"),
]


def _bound(true: float) -> float:
    """The documented guarantee, with slack for float rounding at edges."""
    if true < MIN_VALUE:
        return MIN_VALUE
    return ALPHA * true * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize("make", DISTRIBUTIONS)
def test_quantiles_match_numpy_lower_within_alpha(make) -> None:
    data = make()
    sk = DDSketch(alpha=ALPHA, min_value=MIN_VALUE)
    sk.add_many(data)
    for q in QS:
        true = float(np.quantile(data, q, method="lower"))
        est = sk.quantile(q)
        assert est is not None
        assert abs(est - true) <= _bound(true), (q, est, true)
    assert sk.count == data.size
    assert sk.sum == pytest.approx(float(data.sum()))
    assert sk.min == data.min() and sk.max == data.max()
    assert sk.mean == pytest.approx(float(data.mean()))


def test_add_one_by_one_equals_add_many() -> None:
    data = _rng().lognormal(3.0, 2.0, 500)
    a, b = DDSketch(), DDSketch()
    for x in data:
        a.add(float(x))
    b.add_many(data)
    assert a.bucket_counts() == b.bucket_counts()
    assert a.quantiles(QS) == b.quantiles(QS)


def test_empty_sketch() -> None:
    sk = DDSketch()
    assert sk.quantile(0.5) is None
    assert (sk.count, sk.min, sk.max, sk.mean) == (0, None, None, None)
    sk.add_many(np.array([]))
    assert sk.count == 0


@pytest.mark.parametrize(
    "bad",
    [
        np.array([1.0, -0.5]),  # negative
        np.array([np.nan]),  # NaN
        np.array([1.0, np.inf]),  # infinite
    ],
)
def test_bad_values_rejected_atomically(bad: np.ndarray) -> None:
    sk = DDSketch()
    sk.add(1.0)
    with pytest.raises(ValueError):
        sk.add_many(bad)
    assert sk.count == 1 and sk.bucket_counts() == {0: 1}


@pytest.mark.parametrize("q", [-0.1, 1.5])
def test_quantile_domain(q: float) -> None:
    sk = DDSketch()
    sk.add(1.0)
    with pytest.raises(ValueError, match="q="):
        sk.quantile(q)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": 1.0}, "alpha"),
        ({"min_value": 0.0}, "min_value"),
        ({"min_value": float("inf")}, "min_value"),
    ],
)
def test_parameter_errors_name_the_parameter(kwargs: dict, name: str) -> None:
    with pytest.raises(ParameterError, match=name):
        DDSketch(**kwargs)


def test_merge_requires_same_alpha() -> None:
    with pytest.raises(ParameterError, match="alpha"):
        DDSketch(alpha=0.01).merge(DDSketch(alpha=0.02))


def test_merge_does_not_alias_and_copy_is_independent() -> None:
    a, b = DDSketch(), DDSketch()
    b.add_many(np.array([1.0, 100.0]))
    a.merge(b)
    a.add(5.0)
    assert b.count == 2
    c = a.copy()
    c.add(7.0)
    assert a.count == 3 and c.count == 4


values = st.lists(
    st.one_of(
        st.just(0.0),
        st.floats(min_value=1e-9, max_value=1e9, allow_nan=False, allow_infinity=False),
    ),
    max_size=200,
)


@settings(max_examples=150, deadline=None)
@given(values, values, values)
def test_merged_sketches_equal_sketch_of_concatenation(xs, ys, zs) -> None:
    parts = [DDSketch() for _ in range(3)]
    for sk, data in zip(parts, (xs, ys, zs), strict=True):
        sk.add_many(np.array(data, dtype=float))
    merged = parts[0].copy()
    merged.merge(parts[1])
    merged.merge(parts[2])
    whole = DDSketch()
    whole.add_many(np.array(xs + ys + zs, dtype=float))
    assert merged.bucket_counts() == whole.bucket_counts()
    assert merged.zero_count == whole.zero_count
    assert merged.count == whole.count
    assert merged.quantiles(QS) == whole.quantiles(QS)
    assert merged.sum == pytest.approx(whole.sum)


@settings(max_examples=100, deadline=None)
@given(values)
def test_to_dict_round_trip_is_json_safe(xs) -> None:
    sk = DDSketch()
    sk.add_many(np.array(xs, dtype=float))
    wire = json.loads(json.dumps(sk.to_dict(), allow_nan=False))
    back = DDSketch.from_dict(wire)
    assert back == sk
    assert back.quantiles(QS) == sk.quantiles(QS)


def test_pickle_round_trip() -> None:
    sk = DDSketch(alpha=0.02)
    sk.add_many(_rng().lognormal(5.0, 1.0, 1_000))
    back = pickle.loads(pickle.dumps(sk))
    assert back == sk and back.alpha == 0.02
    assert back.quantiles(QS) == sk.quantiles(QS)
    back.add(1.0)
    assert back.count == sk.count + 1


def test_from_dict_rejects_inconsistent_counts() -> None:
    sk = DDSketch()
    sk.add(1.0)
    bad = sk.to_dict() | {"count": 5}
    with pytest.raises(ValueError, match="count"):
        DDSketch.from_dict(bad)
