"""Plain-data snapshots (no pickle) of the drift detectors, the load forecaster
and the OU fit.

* Round trip: a seeded series with level shifts is cut at several points
  (fresh, before warm-up, mid-run, right after a detection / a reset), the
  state goes through ``json.loads(json.dumps(..., allow_nan=False))``, and the
  original and the restored object then see the same continuation: every
  output (events, forecasts, error statistics, the next states) is identical,
  and identical to an uninterrupted run.
* Malformed states (missing / unknown fields, wrong types, unknown version,
  a class outside the allowlist, shapes that do not fit) raise
  ParameterError naming the field; nothing named by the data is imported.
* Hypothesis: ``from_state`` on arbitrary JSON, and on valid states with one
  part replaced, raises nothing but ParameterError, and what it accepts runs.
* Size: a state stays bounded by the model's own memory (ADWIN: its
  exponential histogram, O(max_buckets log width)).
"""

from __future__ import annotations

import copy
import json
import math
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controllers.drift import DriftDetector
from controllers.errors import ParameterError
from controllers.forecast import LoadForecaster
from controllers.sde_fit import OnlineOuFit

SEASON = 12


def jsonify(state: dict[str, Any]) -> Any:
    """The trip through a store: strict JSON (no NaN / Infinity tokens)."""
    return json.loads(json.dumps(state, allow_nan=False))


def shifted_series(seed: int, n: int, season: int | None = None) -> list[float]:
    """Noisy levels that shift every 150-400 steps (up and down), optionally seasonal."""
    rng = np.random.default_rng(seed)
    out: list[float] = []
    while len(out) < n:
        level, length = rng.uniform(60.0, 160.0), int(rng.integers(150, 400))
        out.extend(level + rng.normal(0.0, 6.0, size=length))
    xs = np.array(out[:n])
    if season:
        xs += 25.0 * np.sin(2.0 * np.pi * np.arange(n) / season)
    return [float(x) for x in xs]


# -- drift detectors -------------------------------------------------------------

DETECTORS = [
    ("adwin", {"delta": 0.01}),  # River's clock (checks every 32 values)
    ("adwin", {"delta": 0.05, "clock": 1, "max_buckets": 2, "grace_period": 5}),  # every value, small rows
    ("page_hinkley", {"delta": 2.0, "threshold": 60.0}),
    ("page_hinkley", {"delta": 1.0, "threshold": 40.0, "mode": "up", "min_instances": 10}),
]
N_DRIFT = 2400


def feed(det: DriftDetector, xs: list[float]) -> list[Any]:
    return [det.update(x) for x in xs]


def drift_cuts(kind: str, params: dict[str, Any], xs: list[float]) -> list[int]:
    """Fresh, before warm-up, mid-run, right after the first and a later detection, late."""
    hits = [i + 1 for i, e in enumerate(feed(DriftDetector(kind, **params), xs)) if e is not None]
    assert len(hits) >= 3, hits  # the series makes the detector fire: the state is not trivial
    return sorted({0, 1, 4, hits[0] - 7, hits[0], hits[0] + 1, hits[1], 1000, hits[-1], len(xs) - 50})


@pytest.mark.parametrize(("kind", "params"), DETECTORS)
@pytest.mark.parametrize("seed", [0, 1])
def test_detector_round_trip_continues_identically(kind: str, params: dict[str, Any], seed: int) -> None:
    xs = shifted_series(seed, N_DRIFT)
    reference = feed(DriftDetector(kind, signal="s", **params), xs)
    after_a_detection = 0
    for cut in drift_cuts(kind, params, xs):
        live = DriftDetector(kind, signal="s", **params)
        feed(live, xs[:cut])
        state = live.to_state()
        restored = DriftDetector.from_state(jsonify(state))
        assert restored.to_state() == state
        after_a_detection += state["detector"]["drift_detected"]
        tail_live, tail_restored = feed(live, xs[cut:]), feed(restored, xs[cut:])
        assert tail_restored == tail_live == reference[cut:], cut
        assert restored.to_state() == live.to_state()
    assert after_a_detection >= 2  # some cuts fell right on a detection (the reset is pending)


def test_detector_state_is_plain_data_and_names_the_allowed_class() -> None:
    for kind, params in DETECTORS:
        det = DriftDetector(kind, **params)
        feed(det, shifted_series(3, 500))
        state = det.to_state()
        assert jsonify(state) == state  # only JSON types, no NaN
        assert state["type"] == "DriftDetector" and state["version"] == 1
        cls = {"adwin": "river.drift.ADWIN", "page_hinkley": "river.drift.PageHinkley"}[kind]
        assert state["detector"]["class"] == cls


def test_page_hinkley_infinite_minimum_is_encoded() -> None:
    # before any value Page-Hinkley's running minimum is +inf: stored as a string, not a bare Infinity
    state = DriftDetector("page_hinkley").to_state()
    assert state["detector"]["min_increase"] == "inf"
    assert json.dumps(state, allow_nan=False)
    assert DriftDetector.from_state(jsonify(state))._model._min_increase == math.inf


def test_adwin_state_is_bounded_by_its_window() -> None:
    """ADWIN's exponential histogram: <= max_buckets entries per row, <= log2(width) + 1 rows."""
    rng = np.random.default_rng(0)
    det = DriftDetector("adwin")  # stationary: the window only grows
    sizes = {}
    for n in (200, 2_000, 20_000):
        feed(det, [float(x) for x in np.exp(rng.normal(math.log(80.0), 0.6, size=n - det.n_seen))])
        d = det.to_state()["detector"]
        width, rows = d["width"], d["buckets"]
        assert width == n  # no detection: the window holds everything
        assert len(rows) <= math.log2(width) + 1
        assert all(len(r["totals"]) == len(r["variances"]) <= 5 for r in rows)
        sizes[n] = len(json.dumps(det.to_state()))
    assert sizes[20_000] < 3_000  # a few rows of numbers, not 20,000 values
    assert sizes[20_000] - sizes[2_000] < sizes[2_000]  # logarithmic growth


# -- load forecaster -------------------------------------------------------------

FORECASTERS = [
    ("holtwinters", None),
    ("holtwinters", SEASON),
    ("snarimax", None),
    ("snarimax", SEASON),
    ("ewma", None),
]
HORIZON = 3
N_FORECAST = 900


def resets_for(xs: list[float]) -> set[int]:
    """Where the Scaler would reset the forecaster: Page-Hinkley detections on the same series."""
    det = DriftDetector("page_hinkley", delta=2.0, threshold=60.0)
    return {i + 1 for i, e in enumerate(feed(det, xs)) if e is not None}


def run_forecaster(f: LoadForecaster, xs: list[float], start: int, resets: set[int]) -> list[Any]:
    """Learn xs[start:] (reset where the detector fired); everything observable after each value."""
    out = []
    for i in range(start, len(xs)):
        if i in resets:
            f.reset()
        f.learn(xs[i])
        out.append((f.forecast(), f.forecast(1), f.forecast(2 * HORIZON + 1), f.ready, f.errors_1.mae, f.errors_h.mape))
    return out


@pytest.mark.parametrize(("model", "season"), FORECASTERS)
@pytest.mark.parametrize("seed", [0, 1])
def test_forecaster_round_trip_continues_identically(model: str, season: int | None, seed: int) -> None:
    xs = shifted_series(seed, N_FORECAST, season)
    resets = resets_for(xs)
    assert len(resets) >= 2
    r0 = min(resets)
    warm = LoadForecaster(model, HORIZON, season).warmup_steps
    reference = run_forecaster(LoadForecaster(model, HORIZON, season), xs, 0, resets)
    cuts = {0, 1, warm - 1, warm, warm + 1, 100, r0, r0 + 1, r0 + warm - 1, r0 + warm + 2, max(resets), 800}
    for cut in sorted(cuts):
        live = LoadForecaster(model, HORIZON, season)
        run_forecaster(live, xs[:cut], 0, resets)
        if cut in resets:
            live.reset()  # cut right after the reset, before the next value
        state = live.to_state()
        restored = LoadForecaster.from_state(jsonify(state))
        assert restored.to_state() == state
        assert restored.forecast() == live.forecast()
        rest = resets - {cut}
        tail_live, tail_restored = run_forecaster(live, xs, cut, rest), run_forecaster(restored, xs, cut, rest)
        assert tail_restored == tail_live == reference[cut:], cut
        assert restored.to_state() == live.to_state()
        assert (restored.errors_1, restored.errors_h, restored.errors_hmean) == (
            live.errors_1,
            live.errors_h,
            live.errors_hmean,
        )
    assert reference[-1][4] is not None  # the errors were scored: the forecasts were real


@pytest.mark.parametrize(("model", "season"), FORECASTERS)
def test_forecaster_state_is_plain_data_and_bounded(model: str, season: int | None) -> None:
    xs = shifted_series(4, 6000, season)
    f = LoadForecaster(model, HORIZON, season)
    sizes = []
    for lo, hi in ((0, 600), (600, 6000)):
        for x in xs[lo:hi]:
            f.learn(x)
        state = f.to_state()
        assert jsonify(state) == state
        sizes.append(len(json.dumps(state)))
    assert sizes[1] < 1.2 * sizes[0] + 100  # ten times the values, no growth (histories are bounded)
    learner = f.to_state()["learner"]
    cls = {
        "holtwinters": "river.time_series.HoltWinters",
        "snarimax": "river.time_series.SNARIMAX",
        "ewma": "controllers.forecast.Ewma",
    }[model]
    assert learner["class"] == cls


def test_non_finite_values_survive_the_trip() -> None:
    f = LoadForecaster("ewma", 2)
    for y in [1e308, 1e308, -1e308]:
        f.learn(y)  # the error sums overflow to inf
    state = f.to_state()
    assert state["errors_1"]["sum_abs"] == "inf"
    g = LoadForecaster.from_state(jsonify(state))
    assert g.errors_1.sum_abs == math.inf and g.to_state() == state


def test_ou_fit_round_trip() -> None:
    rng = np.random.default_rng(0)
    fit, x = OnlineOuFit(), 400.0
    for k in range(300):
        if k in (0, 1, 150):
            back = OnlineOuFit.from_state(jsonify(fit.to_state()))
            assert back == fit
        fit = fit.update(x, 1.0)
        x = 400.0 + 0.9 * (x - 400.0) + 5.0 * rng.standard_normal()
    assert OnlineOuFit.from_state(jsonify(fit.to_state())).estimate() == fit.estimate() is not None


# -- malformed states ------------------------------------------------------------


def detector_state(kind: str = "adwin") -> dict[str, Any]:
    det = DriftDetector(kind, **dict(DETECTORS[1 if kind == "adwin" else 2][1]))
    feed(det, shifted_series(5, 700))
    return jsonify(det.to_state())


def forecaster_state(model: str = "snarimax", season: int | None = SEASON) -> dict[str, Any]:
    f = LoadForecaster(model, HORIZON, season)
    for x in shifted_series(5, 200, season):
        f.learn(x)
    return jsonify(f.to_state())


def ou_state() -> dict[str, Any]:
    return OnlineOuFit().update(1.0, 1.0).update(2.0, 1.0).to_state()


STATES = {
    "adwin": (DriftDetector, detector_state),
    "page_hinkley": (DriftDetector, lambda: detector_state("page_hinkley")),
    "snarimax": (LoadForecaster, forecaster_state),
    "holtwinters": (LoadForecaster, lambda: forecaster_state("holtwinters")),
    "ewma": (LoadForecaster, lambda: forecaster_state("ewma", None)),
    "ou": (OnlineOuFit, ou_state),
}


@pytest.mark.parametrize("which", sorted(STATES))
def test_every_missing_or_unknown_field_is_named(which: str) -> None:
    cls, make = STATES[which]
    state = make()
    for key in state:
        broken = {k: v for k, v in state.items() if k != key}
        with pytest.raises(ParameterError, match=f"state.{key}"):
            cls.from_state(broken)
    with pytest.raises(ParameterError, match="state.surprise: unknown field"):
        cls.from_state({**state, "surprise": 1})


@pytest.mark.parametrize("which", sorted(STATES))
@pytest.mark.parametrize("version", [2, 0, "1", 1.0, True, None])
def test_unknown_version_is_refused(which: str, version: object) -> None:
    cls, make = STATES[which]
    with pytest.raises(ParameterError, match="state.version"):
        cls.from_state({**make(), "version": version})


@pytest.mark.parametrize("cls", [DriftDetector, LoadForecaster, OnlineOuFit])
@pytest.mark.parametrize("data", [None, [], "state", 3, {}, {"type": "DriftDetector"}, {"version": 1}])
def test_not_a_state_at_all(cls: Any, data: object) -> None:
    with pytest.raises(ParameterError, match="state"):
        cls.from_state(data)


@pytest.mark.parametrize(
    ("which", "part", "name"),
    [
        ("adwin", "detector", "river.drift.PageHinkley"),  # allowed class, wrong kind
        ("adwin", "detector", "antigravity.fly"),  # would import a module if looked up
        ("adwin", "detector", "builtins.eval"),
        ("page_hinkley", "detector", "river.drift.ADWIN"),
        ("page_hinkley", "detector", "river.drift.KSWIN"),  # River, but not on the list
        ("snarimax", "learner", "river.time_series.HoltWinters"),
        ("holtwinters", "learner", "os.system"),
        ("ewma", "learner", "river.time_series.SNARIMAX"),
        ("ewma", "learner", ["controllers.forecast.Ewma"]),  # not even a string
    ],
)
def test_class_outside_the_allowlist_is_refused_without_import(which: str, part: str, name: object) -> None:
    cls, make = STATES[which]
    state = make()
    state[part]["class"] = name
    before = set(sys.modules)
    with pytest.raises(ParameterError, match=f"state.{part}.class"):
        cls.from_state(state)
    assert set(sys.modules) == before and "antigravity" not in sys.modules


def _set(state: dict[str, Any], path: tuple[Any, ...], value: object) -> dict[str, Any]:
    state = copy.deepcopy(state)
    node: Any = state
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return state


@pytest.mark.parametrize(
    ("which", "path", "value", "needle"),
    [
        # top level: types and consistency
        ("adwin", ("kind",), "kswin", "state.kind"),
        ("adwin", ("signal",), 5, "state.signal"),
        ("adwin", ("recent_weight",), True, "state.recent_weight"),
        ("adwin", ("n_seen",), "700", "state.n_seen"),
        ("adwin", ("n_seen",), 10**40, "state.n_seen"),
        ("adwin", ("n_detections",), 10**6, "state.n_detections"),  # more than values seen
        ("adwin", ("params",), "delta=0.05", "state.params"),
        ("adwin", ("params", "clock"), 0, "params.clock"),
        ("adwin", ("params", "signal"), "x", "params.signal"),  # a constructor argument, not River's
        ("adwin", ("params", "__class__"), "x", "params.__class__"),
        ("adwin", ("mean",), [700, 1.0], "state.mean"),
        ("adwin", ("mean", "n"), 1e9, "state.mean.n"),
        ("adwin", ("recent",), None, "state.recent"),
        ("adwin", ("recent",), "NaN", "state.recent"),  # only "nan" / "inf" / "-inf" spell non-finite
        # ADWIN's window
        ("adwin", ("detector", "buckets"), [], "state.detector.buckets"),
        ("adwin", ("detector", "buckets", 0, "totals"), [1.0, 2.0, 3.0], "state.detector.buckets\\[0\\].totals"),
        ("adwin", ("detector", "buckets", 0, "variances"), [], "state.detector.buckets\\[0\\].variances"),
        ("adwin", ("detector", "buckets", 1, "totals", 0), "x", "state.detector.buckets\\[1\\].totals\\[0\\]"),
        ("adwin", ("detector", "width"), 3.0, "state.detector.width"),
        ("adwin", ("detector", "tick"), 2**31, "state.detector.tick"),
        ("adwin", ("detector", "n_buckets"), -1, "state.detector.n_buckets"),
        ("adwin", ("detector", "drift_detected"), 1, "state.detector.drift_detected"),
        # Page-Hinkley
        ("page_hinkley", ("detector", "x_mean", "n"), -1.0, "state.detector.x_mean.n"),
        ("page_hinkley", ("detector", "sum_increase"), None, "state.detector.sum_increase"),
        ("page_hinkley", ("params", "mode"), "sideways", "params.mode"),
        # forecaster
        ("snarimax", ("model",), "prophet", "state.model"),
        ("snarimax", ("horizon_steps",), 0, "state.horizon_steps"),
        ("snarimax", ("season_length",), 1, "state.season_length"),
        ("snarimax", ("params", "regressor"), "river.linear_model.LinearRegression", "params.regressor"),
        ("snarimax", ("params", "m"), 7, "params.m"),
        ("snarimax", ("n_model",), 10**6, "state.n_model"),
        ("snarimax", ("pending",), [], "state.pending"),
        ("snarimax", ("pending", 0), [1.0], "state.pending\\[0\\]"),
        ("snarimax", ("errors_1", "n_pct"), 10**6, "state.errors_1.n_pct"),
        ("snarimax", ("errors_h", "sum_abs"), -1.0, "state.errors_h.sum_abs"),
        ("snarimax", ("errors_hmean", "n"), 10**7, "state.errors_hmean.n"),
        ("snarimax", ("recent",), [1.0], "state.recent"),
        ("snarimax", ("recent", 0), "nan", "state.recent\\[0\\]"),
        ("snarimax", ("learner", "y_hist"), [1.0], "state.learner.y_hist"),
        ("snarimax", ("learner", "scaler", "counts", 0, 0), "x-1", "state.learner.scaler.counts\\[0\\]\\[0\\]"),
        ("snarimax", ("learner", "scaler", "vars", 0, 1), -1.0, "state.learner.scaler.vars\\[0\\]\\[1\\]"),
        ("snarimax", ("learner", "regression", "weights", 1, 0), "y-1", "state.learner.regression.weights\\[1\\]"),
        ("snarimax", ("learner", "regression", "n_iterations"), 3, "state.learner.regression.n_iterations"),
        ("holtwinters", ("learner", "season"), None, "state.learner.season"),
        ("holtwinters", ("learner", "level"), [1.0, 2.0, 3.0], "state.learner.level"),
        ("holtwinters", ("learner", "initialized"), False, "state.learner.initialized"),
        ("holtwinters", ("learner", "first_values"), [], "state.learner.first_values"),
        ("ewma", ("learner", "level"), None, "state.learner.level"),
        ("ewma", ("params", "alpha"), 0.0, "params.alpha"),
        # OU fit
        ("ou", ("dt_s",), 0.0, "state.dt_s"),
        ("ou", ("last",), None, "state.last"),
        ("ou", ("sx",), {}, "state.sx"),
    ],
)
def test_malformed_field_is_named(which: str, path: tuple[Any, ...], value: object, needle: str) -> None:
    cls, make = STATES[which]
    with pytest.raises(ParameterError, match=needle):
        cls.from_state(_set(make(), path, value))


# -- hypothesis: nothing but ParameterError ------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=25,
)
VALID = {name: make() for name, (_, make) in STATES.items()}


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += paths(v, (*prefix, i))
    return out


def exercise(obj: Any) -> None:
    """What a restored object must survive: being used."""
    xs = shifted_series(9, 80)
    if isinstance(obj, DriftDetector):
        feed(obj, xs)
    elif isinstance(obj, LoadForecaster):
        for x in xs:
            obj.learn(x)
            obj.forecast()
        obj.reset()
        obj.learn(1.0)
    else:
        for x in xs:
            obj = obj.update(x, 1.0)
        obj.estimate()
    json.dumps(obj.to_state(), allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(data=JSON)
def test_arbitrary_json_raises_only_parameter_error(data: object) -> None:
    for cls in (DriftDetector, LoadForecaster, OnlineOuFit):
        try:
            cls.from_state(data)
        except ParameterError:
            pass


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.sampled_from(sorted(STATES)), pick=st.integers(min_value=0), value=JSON, delete=st.booleans())
def test_one_part_replaced_raises_only_parameter_error(which: str, pick: int, value: object, delete: bool) -> None:
    cls, _ = STATES[which]
    state = copy.deepcopy(VALID[which])
    where = paths(state)
    path = where[pick % len(where)]
    node: Any = state
    for key in path[:-1]:
        node = node[key]
    if delete and isinstance(node, dict):
        del node[path[-1]]
    else:
        node[path[-1]] = value
    try:
        obj = cls.from_state(state)
    except ParameterError:
        return
    exercise(obj)  # accepted: it must also run


@pytest.mark.parametrize("which", sorted(STATES))
def test_valid_states_restore_and_run(which: str) -> None:
    cls, _ = STATES[which]
    obj = cls.from_state(copy.deepcopy(VALID[which]))
    assert obj.to_state() == VALID[which]
    exercise(obj)
