"""Latency-aware routing: prediction, weights, fallback with hysteresis, SLA tiers."""

from __future__ import annotations

import json
import math
import pickle
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import optimize

from controllers.errors import ParameterError
from controllers.routing import RoutingParams, RoutingState, Target, step
from controllers.routing_model import (
    BATCH,
    DEFAULT_CLASSES,
    TRADING,
    VOICE,
    RequestClass,
    TargetObs,
    held_latency_ms,
    min_latency_split,
    predict_ms,
)

DT = 10.0
BIG, SMALL = "llama2-70b", "llama2-13b"
A70, B70, A13 = Target(BIG, "az-a"), Target(BIG, "az-b"), Target(SMALL, "az-a")
P = RoutingParams(primary=BIG, fallback=SMALL)


@pytest.mark.parametrize(
    ("obs", "prev_queue", "expected"),
    [
        (TargetObs(200.0, 900.0), None, (200.0, 900.0)),  # no queue: the windowed P95s
        # 30 queued, capacity 10 rps, forecast = capacity: 3 s of FIFO wait
        (TargetObs(200.0, None, queue_len=30, capacity_rps=10, forecast_rps=10), None, (3200.0, None)),
        # forecast 5 rps above capacity 10 for 30 s: 150 more queued, 15 s
        (TargetObs(200.0, None, capacity_rps=10, forecast_rps=15), None, (15_200.0, None)),
        # forecast below capacity drains the queue within the horizon: no wait
        (TargetObs(200.0, None, queue_len=30, capacity_rps=10, forecast_rps=8), None, (200.0, None)),
        # no capacity: drains at the completion rate (4 rps); queue grew 10 -> 20 in 10 s
        # (+1 rps): 20 + 1*30 = 50 waiting / 4 rps = 12.5 s
        (TargetObs(100.0, None, queue_len=20, rate_rps=4), 10.0, (12_600.0, None)),
        # nothing completes yet requests wait: infinite wait
        (TargetObs(100.0, None, queue_len=5, rate_rps=0), None, (math.inf, None)),
        # no latency data: unknown
        (TargetObs(None, None, queue_len=5, rate_rps=1), None, (None, None)),
    ],
)
def test_prediction(obs, prev_queue, expected) -> None:
    assert predict_ms(P, obs, prev_queue, DT) == pytest.approx(expected)


def weights_for(obs, classes=(TRADING,), params=P, state=None):
    state, d = step(params, state or RoutingState(), obs, classes, DT)
    return state, d


@pytest.mark.parametrize(
    ("obs", "expected"),
    [
        # x = 0.5 vs 0.75 at T = 0.25: softmax 1/(1+e^-1) = 0.7311, then the 2 % floors:
        # 0.02 + 0.96 * 0.7311 = 0.7218
        ({A70: TargetObs(150.0), B70: TargetObs(225.0)}, {A70: 0.7218, B70: 0.2782}),
        # equal latency, capacity 30 vs 10 rps: 0.02 + 0.96 * 0.75 = 0.74
        ({A70: TargetObs(150.0, capacity_rps=30), B70: TargetObs(150.0, capacity_rps=10)}, {A70: 0.74, B70: 0.26}),
        # the breaker opened az-b: 0 (absent); az-a takes everything
        ({A70: TargetObs(150.0), B70: TargetObs(100.0, breaker="open")}, {A70: 1.0}),
        # half-open az-b gets the probe floor only
        ({A70: TargetObs(150.0), B70: TargetObs(100.0, breaker="half_open")}, {A70: 0.98, B70: 0.02}),
        # no latency data for az-b: the floor, a way back in
        ({A70: TargetObs(150.0), B70: TargetObs(None)}, {A70: 0.98, B70: 0.02}),
        # no ready replicas in az-b: not eligible
        ({A70: TargetObs(150.0), B70: TargetObs(100.0, capacity_rps=0.0)}, {A70: 1.0}),
        # no data anywhere: equal split
        ({A70: TargetObs(None), B70: TargetObs(None)}, {A70: 0.5, B70: 0.5}),
    ],
)
def test_weights(obs, expected) -> None:
    _, d = weights_for(obs)
    assert d.weights["trading"] == pytest.approx(expected, abs=1e-4)


def test_temperature_is_relative_to_the_class_slo() -> None:
    """The same 75 ms gap steers trading (300 ms SLO) harder than voice (800 ms)."""
    obs = {A70: TargetObs(150.0), B70: TargetObs(225.0)}
    _, d = weights_for(obs, classes=(TRADING, VOICE, BATCH))
    w = {c: d.weights[c][A70] for c in ("trading", "voice", "batch")}
    assert w["trading"] > w["voice"] > w["batch"] > 0.5
    assert w["batch"] == pytest.approx(0.5, abs=0.01)  # 10 s SLO: nearly an even split


# -- the min-latency split (the prior of the weights) ------------------------------------
@pytest.mark.parametrize(
    ("latency", "capacity", "load", "expected"),
    [
        # equal latencies: by capacity, 3:1
        ((100.0, 100.0), (30.0, 10.0), 20.0, (15.0, 5.0)),
        # 4x slower, light load: u = (10 - 3) / (10 * 10) = 0.07, 0.07 * 20 >= 1: idle
        ((100.0, 400.0), (10.0, 10.0), 3.0, (3.0, 0.0)),
        # 4x slower, 6 rps: u = (20 - 6) / (100 + 200) = 0.04667: 10 (1 - 0.4667), 10 (1 - 0.9333)
        ((100.0, 400.0), (10.0, 10.0), 6.0, (5.3333, 0.6667)),
        # at or over the total capacity: by capacity
        ((100.0, 400.0), (10.0, 10.0), 25.0, (10.0, 10.0)),
        # three targets: u = (20 - 10) / (10 * 10 + 10 * sqrt 150) = 0.044949; 0.044949 * 30 >= 1
        ((100.0, 150.0, 900.0), (10.0, 10.0, 10.0), 10.0, (5.5051, 4.4949, 0.0)),
    ],
)
def test_min_latency_split_by_hand(latency, capacity, load, expected) -> None:
    assert min_latency_split(latency, capacity, load) == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("seed", range(5))
def test_min_latency_split_minimises_the_mean_latency(seed) -> None:
    """Oracle: scipy's SLSQP on sum_i l_i s_i / (1 - l_i / mu_i) subject to sum_i l_i = load."""
    rng = np.random.default_rng(seed)
    s, mu = rng.uniform(50, 800, 4), rng.uniform(2, 20, 4)
    load = float(rng.uniform(0.1, 0.9) * mu.sum())

    def cost(lam: np.ndarray) -> float:
        return float(np.sum(lam * s / (1.0 - lam / mu)))

    ref = optimize.minimize(
        cost,
        mu * load / mu.sum(),
        method="SLSQP",
        bounds=[(0.0, m * 0.999) for m in mu],
        constraints=[{"type": "eq", "fun": lambda lam: lam.sum() - load}],
        options={"ftol": 1e-12, "maxiter": 500},
    )
    ours = np.array(min_latency_split(list(s), list(mu), load))
    assert ours.sum() == pytest.approx(load)
    assert cost(ours) <= ref.fun * (1 + 1e-6)
    assert ours == pytest.approx(ref.x, abs=1e-3 * load)


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (((0.0,), (1.0,), 1.0), "latency_ms"),
        (((1.0,), (0.0,), 1.0), "capacity_rps"),
        (((1.0, 2.0), (1.0,), 1.0), "capacity_rps"),
        (((1.0,), (1.0,), -1.0), "load_rps"),
    ],
)
def test_min_latency_split_validates(args, name) -> None:
    with pytest.raises(ParameterError, match=name):
        min_latency_split(*args)


@pytest.mark.parametrize(
    ("held", "latency", "completions", "expected"),
    [
        (None, 300.0, 1.0, 300.0),  # first reading
        (300.0, 1200.0, 1.0, 1200.0),  # a rise counts at once, on one request
        (1200.0, 300.0, 20.0, 750.0),  # 20 completions: n / (n + 20) = half way
        (1200.0, 300.0, 1.0, 1157.14),  # one fast probe: 1/21 of the way
        (1200.0, 300.0, 0.0, 1200.0),  # no completions: no evidence
    ],
)
def test_held_latency(held, latency, completions, expected) -> None:
    assert held_latency_ms(P, held, latency, completions) == pytest.approx(expected, abs=0.01)


def _two_primaries(ttft_a: float, ttft_b: float, rate: float = 3.0) -> dict[Target, TargetObs]:
    return {
        A70: TargetObs(ttft_a, capacity_rps=10.0, rate_rps=rate),
        B70: TargetObs(ttft_b, capacity_rps=10.0, rate_rps=rate),
    }


@pytest.mark.parametrize(
    ("split", "expected_b"),
    [
        # prior 5.333 : 0.667 (the split above), tilt exp(-(0.04 - 0.01) / 0.25) = 0.8869:
        # 0.667 * 0.8869 / (5.333 + 0.5913) = 0.0998; 0.02 + 0.96 * 0.0998 = 0.1158
        ("min-latency", 0.1158),
        # by capacity: 0.8869 / 1.8869 = 0.4700; 0.02 + 0.96 * 0.4700 = 0.4712
        ("capacity", 0.4712),
    ],
)
def test_batch_leaves_a_slowed_target_only_with_the_min_latency_split(split, expected_b) -> None:
    """Batch (10 s SLO) barely feels 100 vs 400 ms in its softmax; the split moves it."""
    _, d = step(replace(P, split=split), RoutingState(), _two_primaries(100.0, 400.0), [BATCH], DT)
    assert d.weights["batch"][B70] == pytest.approx(expected_b, abs=1e-4)


def test_split_follows_the_held_latency_after_a_spike() -> None:
    """400 ms, then one window at 100 ms with 2 completions: held 400 - 300 * 2/22 = 372.7."""
    s, _ = step(P, RoutingState(), _two_primaries(100.0, 400.0), [BATCH], DT)
    s, d = step(
        P,
        s,
        {
            A70: TargetObs(100.0, capacity_rps=10.0, rate_rps=5.8),
            B70: TargetObs(100.0, capacity_rps=10.0, rate_rps=0.2),
        },
        [BATCH],
        DT,
    )
    assert s.held_ttft_ms[B70.key] == pytest.approx(400.0 - 300.0 * 2 / 22)
    assert d.weights["batch"][B70] < 0.2  # not yet trusted: still well under half
    _, d = step(P, RoutingState(), _two_primaries(100.0, 100.0), [BATCH], DT)
    assert d.weights["batch"][B70] == pytest.approx(0.5)  # fresh state, equal: by capacity


# Fallback hysteresis for trading (SLO 300 ms, h = 0.2 -> recover below 240 ms, 3 windows).
# Each row: primary TTFT P95 this window, and whether trading is in fallback after it.
HYSTERESIS = [
    (250.0, False),  # below SLO: stay on the primary
    (350.0, True),  # predicted 350 > 300: enter fallback at once
    (290.0, True),  # below SLO but not below 240: stay
    (230.0, True),  # 1st window below 240
    (230.0, True),  # 2nd
    (250.0, True),  # above 240: the streak resets
    (230.0, True),  # 1st again
    (230.0, True),  # 2nd
    (230.0, False),  # 3rd consecutive: back to the primary
    (299.0, False),  # under SLO: no re-entry (only > SLO enters)
]


def test_fallback_enters_above_slo_and_exits_after_recover_windows() -> None:
    s = RoutingState()
    for i, (ttft, in_fb) in enumerate(HYSTERESIS):
        obs = {A70: TargetObs(ttft), A13: TargetObs(100.0)}
        s, d = step(P, s, obs, [TRADING], DT)
        assert ("trading" in d.fallback) is in_fb, (i, ttft, d.reasons)
        w = d.weights["trading"]
        assert w == pytest.approx({A13: 0.95, A70: 0.05} if in_fb else {A70: 1.0})
    assert [i for i, (_, f) in enumerate(HYSTERESIS) if i and f != HYSTERESIS[i - 1][1]] == [1, 8]


def test_enter_windows_delays_entry() -> None:
    p = RoutingParams(primary=BIG, fallback=SMALL, enter_windows=2)
    s = RoutingState()
    flags = []
    for ttft in (350.0, 250.0, 350.0, 350.0):  # over, reset, over, over -> enters on the 4th
        s, d = step(p, s, {A70: TargetObs(ttft), A13: TargetObs(100.0)}, [TRADING], DT)
        flags.append("trading" in d.fallback)
    assert flags == [False, False, False, True]


@pytest.mark.parametrize(
    ("cls", "obs", "in_fallback", "why"),
    [
        # batch is not degradable: stays on the primary even far over SLO
        (BATCH, {A70: TargetObs(20_000.0), A13: TargetObs(100.0)}, False, "primary"),
        # voice: 900 ms > 800 ms SLO -> smaller variant
        (VOICE, {A70: TargetObs(900.0), A13: TargetObs(300.0)}, True, "enter fallback"),
        # the fallback is predicted worse than the primary: stay
        (TRADING, {A70: TargetObs(400.0), A13: TargetObs(500.0)}, False, "fallback not better"),
        # every fallback target open: nowhere to go
        (TRADING, {A70: TargetObs(400.0), A13: TargetObs(100.0, breaker="open")}, False, "primary"),
        # every primary target open: degrade at once
        (TRADING, {A70: TargetObs(100.0, breaker="open"), A13: TargetObs(100.0)}, True, "unavailable"),
        # e2e SLO counts too: 130 s > 120 s for a degradable class with e2e SLO
        (
            RequestClass("report", 10_000.0, 120_000.0),
            {A70: TargetObs(200.0, 130_000.0), A13: TargetObs(100.0, 60_000.0)},
            True,
            "enter",
        ),
    ],
)
def test_fallback_per_class(cls, obs, in_fallback, why) -> None:
    _, d = step(P, RoutingState(), obs, [cls], DT)
    assert (cls.name in d.fallback) is in_fallback
    assert why in d.reasons[cls.name]


def test_non_degradable_class_without_primary_is_unroutable() -> None:
    obs = {A70: TargetObs(100.0, breaker="open"), A13: TargetObs(100.0)}
    _, d = step(P, RoutingState(), obs, [BATCH, TRADING], DT)
    assert d.unroutable == ("batch",) and d.weights["batch"] == {}
    assert d.weights["trading"] == {A13: 1.0}  # no primary left to probe


def test_fallback_exits_when_the_fallback_becomes_unavailable() -> None:
    s, d = step(P, RoutingState(), {A70: TargetObs(400.0), A13: TargetObs(100.0)}, [TRADING], DT)
    assert d.changed == ("trading",)
    s, d = step(P, s, {A70: TargetObs(400.0), A13: TargetObs(100.0, breaker="open")}, [TRADING], DT)
    assert "trading" not in d.fallback and d.changed == ("trading",)
    assert d.weights["trading"] == {A70: 1.0}


def test_a_window_without_primary_data_neither_counts_nor_resets() -> None:
    s, _ = step(P, RoutingState(), {A70: TargetObs(400.0), A13: TargetObs(100.0)}, [TRADING], DT)
    for ttft in (200.0, None, 200.0, None, 200.0):  # three good windows among two empty ones
        s, d = step(P, s, {A70: TargetObs(ttft), A13: TargetObs(100.0)}, [TRADING], DT)
    assert "trading" not in d.fallback


def test_queue_growth_from_state_raises_the_prediction() -> None:
    """Same P95s; the primary's queue grows 0 -> 50 in a window: predicted over SLO."""
    s, d = step(P, RoutingState(), {A70: TargetObs(200.0, rate_rps=50), A13: TargetObs(100.0)}, [TRADING], DT)
    assert not d.fallback
    s, d = step(P, s, {A70: TargetObs(200.0, queue_len=50, rate_rps=50), A13: TargetObs(100.0)}, [TRADING], DT)
    assert d.predicted_ttft_ms[A70] == pytest.approx(200.0 + 1000.0 * (50 + 5 * 30) / 50)
    assert "trading" in d.fallback


def test_dropped_class_leaves_no_fallback() -> None:
    s, _ = step(P, RoutingState(), {A70: TargetObs(400.0), A13: TargetObs(100.0)}, [TRADING], DT)
    s, _ = step(P, s, {A70: TargetObs(400.0), A13: TargetObs(100.0)}, [VOICE], DT)
    assert "trading" not in s.fallback


def test_default_classes() -> None:
    assert [(c.name, c.ttft_slo_ms, c.degradable) for c in DEFAULT_CLASSES] == [
        ("trading", 300.0, True),
        ("voice", 800.0, True),
        ("batch", 10_000.0, False),
    ]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"primary": ""}, "primary"),
        ({"primary": BIG, "fallback": BIG}, "fallback"),
        ({"primary": BIG, "temperature": 0.0}, "temperature"),
        ({"primary": BIG, "min_share": 1.0}, "min_share"),
        ({"primary": BIG, "hysteresis": -0.1}, "hysteresis"),
        ({"primary": BIG, "recover_windows": 0}, "recover_windows"),
    ],
)
def test_params_are_validated(kwargs, name) -> None:
    with pytest.raises(ParameterError, match=name):
        RoutingParams(**kwargs)


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: RequestClass("x", 0.0), "ttft_slo_ms"),
        (lambda: TargetObs(-1.0), "ttft_p95_ms"),
        (lambda: TargetObs(1.0, breaker="ajar"), "breaker"),
        (lambda: step(P, RoutingState(), {}, [TRADING, TRADING], DT), "classes"),
        (lambda: step(P, RoutingState(), {}, [TRADING], 0.0), "dt_s"),
    ],
)
def test_inputs_are_validated(build, name) -> None:
    with pytest.raises(ParameterError, match=name):
        build()


def test_state_and_decision_serialise() -> None:
    s, d = step(P, RoutingState(), {A70: TargetObs(400.0, queue_len=3), A13: TargetObs(100.0)}, DEFAULT_CLASSES, DT)
    assert RoutingState.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert pickle.loads(pickle.dumps(s)) == s
    assert json.loads(json.dumps(d.to_dict()))["weights"]["trading"]["llama2-13b|az-a"] == 0.95


target_obs = st.builds(
    TargetObs,
    ttft_p95_ms=st.one_of(st.none(), st.floats(0, 5000)),
    e2e_p95_ms=st.one_of(st.none(), st.floats(0, 200_000)),
    queue_len=st.floats(0, 500),
    rate_rps=st.floats(0, 100),
    capacity_rps=st.one_of(st.none(), st.floats(0, 100)),
    forecast_rps=st.one_of(st.none(), st.floats(0, 200)),
    breaker=st.sampled_from(["closed", "open", "half_open"]),
)
targets = st.sampled_from([Target(v, z) for v in (BIG, SMALL) for z in ("az-a", "az-b", "az-c")])


@given(st.lists(st.dictionaries(targets, target_obs, max_size=6), min_size=1, max_size=4))
def test_weights_are_a_distribution_and_open_targets_get_nothing(windows) -> None:
    s = RoutingState()
    for obs in windows:
        s, d = step(P, s, obs, DEFAULT_CLASSES, DT)
        for c in DEFAULT_CLASSES:
            w = d.weights[c.name]
            if c.name in d.unroutable:
                assert w == {}
                continue
            assert sum(w.values()) == pytest.approx(1.0)
            assert all(v >= 0.0 for v in w.values())
            assert all(obs[t].breaker != "open" for t, v in w.items() if v > 0)
            if not c.degradable:
                assert all(t.variant == BIG for t in w)
