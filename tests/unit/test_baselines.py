"""Baseline autoscalers: each pinned to its documented behaviour on hand-worked cases.

Every case has a comment with the arithmetic.  The harness contract (decisions
stay within [min_replicas, max_replicas], state pickles) is checked on random
observation sequences for all baselines.
"""

from __future__ import annotations

import inspect
import math
import pickle
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.baselines import BASELINES, Autoscaler, BaselineParameterError, Observation
from sim.baselines.base import BaselineBase, Harness
from sim.baselines.dynamo import (
    DynamoLoadParams,
    DynamoLoadPlanner,
    DynamoThroughputParams,
    DynamoThroughputPlanner,
)
from sim.baselines.hpa import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    HorizontalPodAutoscaler,
    HpaParams,
    ScalingPolicy,
    ScalingRules,
    plain_metric_replicas,
)
from sim.baselines.keda import KedaParams, KedaPrometheus, external_metric_replicas
from sim.baselines.kpa import KnativePodAutoscaler, KpaParams
from sim.baselines.rayserve import RayServeAutoscaler, RayServeParams
from sim.baselines.static import StaticParams, StaticReplicas

pytestmark = pytest.mark.timeout(60)


def ob(
    t: float = 0.0,
    *,
    ready: int = 1,
    starting: int = 0,
    desired: int | None = None,
    ongoing: int = 0,
    queue: int = 0,
    rate: float = 0.0,
    util: float = 0.0,
    window: dict[str, Any] | None = None,
) -> Observation:
    """An observation; ``desired`` defaults to ready + starting."""
    return Observation(
        t_s=float(t),
        zone="az-a",
        model="m",
        replicas_ready=ready,
        replicas_starting=starting,
        desired=ready + starting if desired is None else desired,
        ongoing_requests=ongoing,
        queue_len=queue,
        arrival_rate_rps=rate,
        gpu_util=util,
        window=window,
    )


def run(scaler: Autoscaler, obs_at, t_end: float, t0: float = 0.0, desired: int = 1) -> list[tuple[float, int]]:
    """Call ``decide`` every ``period_s`` from ``t0`` to ``t_end``; the fleet follows at once.

    ``obs_at(t, desired)`` builds the observation; returns the (t, decision) changes.
    """
    changes = []
    n = round((t_end - t0) / scaler.period_s)
    for k in range(n + 1):
        t = t0 + k * scaler.period_s
        out = scaler.decide(obs_at(t, desired))
        if out is not None:
            desired = out
            changes.append((t, out))
    return changes


# --------------------------------------------------------------------------- static


def test_static_fixed_count_clamped_and_idempotent() -> None:
    s = StaticReplicas(StaticParams(replicas=6), max_replicas=4)
    assert s.decide(ob(desired=1)) == 4  # 6 clamped to max_replicas = 4
    assert s.decide(ob(desired=4)) is None  # already there: unchanged
    assert StaticReplicas(StaticParams(replicas=3)).decide(ob(desired=9)) == 3


# --------------------------------------------------------------------------- HPA


@pytest.mark.parametrize(
    ("ready", "starting", "util", "expected"),
    [
        (4, 0, 0.90, 6),  # ratio 0.9/0.7 = 1.286 -> ceil(4 * 1.286) = ceil(5.14) = 6
        (4, 0, 0.75, None),  # ratio 1.071: |1 - ratio| <= 0.1 tolerance -> unchanged
        (4, 0, 0.64, None),  # ratio 0.914: within tolerance downwards -> unchanged
        (4, 1, 1.00, 6),  # unready pod counted at 0: 4*1.0/(0.7*5) = 1.143 -> ceil(5.71) = 6
        (2, 2, 1.00, None),  # 2*1.0/(0.7*4) = 0.714 < 1: direction flips -> keep 4
        (2, 1, 1.00, None),  # 2*1.0/(0.7*3) = 0.952: within tolerance after rebalance -> keep 3
        (0, 3, 0.00, None),  # no ready pod reports a metric -> the HPA keeps the scale
    ],
)
def test_hpa_ratio_rule_and_tolerance(ready: int, starting: int, util: float, expected: int | None) -> None:
    hpa = HorizontalPodAutoscaler(max_replicas=32)
    assert hpa.sync_period_s == 15.0 and hpa.period_s == 1.0  # controller sync period; signal sampled each second
    assert hpa.decide(ob(ready=ready, starting=starting, util=util)) == expected


def test_hpa_plain_metric_replicas_is_the_ratio_rule() -> None:
    assert plain_metric_replicas(90, 70, ready=4, unready=0, current=4) == 6  # ceil(5.14)
    assert plain_metric_replicas(35, 70, ready=4, unready=0, current=4) == 2  # ceil(4 * 0.5)
    assert plain_metric_replicas(50, 70, ready=0, unready=2, current=2) is None


def test_hpa_scale_down_held_for_300s_stabilisation() -> None:
    """4 replicas at 20 % util want ceil(4 * 0.2/0.7) = 2, but the window holds 4.

    No ``behavior``: the legacy path.  The first reconcile seeds the history with
    4 at t = 0; a recommendation counts while it is not older than t - 300 s
    (``stabilizeRecommendation`` drops only those *before* the cutoff), so the
    seed still holds at t = 300 and the first scale-down is at the 315 s sync.
    """
    hpa = HorizontalPodAutoscaler()
    changes = run(hpa, lambda t, d: ob(t, ready=d, util=0.2), t_end=700.0, desired=4)
    assert changes[0] == (315.0, 2)
    # from 2 at 20 %: ceil(2 * 0.286) = 1, held by the recommendations of 2 up to t = 315 -> 630
    assert changes[1] == (630.0, 1)


def test_hpa_scale_down_keeps_highest_recent_recommendation() -> None:
    """A spike inside the window keeps the count up: max over the last 300 s (with ``behavior``)."""
    hpa = HorizontalPodAutoscaler(HpaParams(smoothing_window_s=0.0, scale_down=DEFAULT_SCALE_DOWN))
    assert hpa.decide(ob(0, ready=4, util=0.2)) is None  # wants 2, seed 4 holds
    assert hpa.decide(ob(100, ready=4, util=0.9)) == 6  # up: no window, ceil(5.14)
    # 6 at 20 %: ceil(6 * 0.2/0.7) = ceil(1.71) = 2, but 6 (t = 100) is in the window
    assert hpa.decide(ob(115, ready=6, util=0.2)) is None
    assert hpa.decide(ob(385, ready=6, util=0.2)) is None  # 100 > 385 - 300 (syncs are 15 s apart)
    assert hpa.decide(ob(400, ready=6, util=0.2)) == 2  # 100 is not > 400 - 300


def test_hpa_scale_up_rate_limit_default_policies() -> None:
    """From 2 replicas a huge ratio is capped at max(2 * 2, 2 + 4) = 6 per 15 s."""
    hpa = HorizontalPodAutoscaler(
        HpaParams(target_utilization=0.1, smoothing_window_s=0.0, scale_up=DEFAULT_SCALE_UP), max_replicas=64
    )
    # ratio 1.0 / 0.1 = 10 -> proposal ceil(2 * 10) = 20; Percent 100 % -> 4, Pods 4 -> 6; Max -> 6
    assert hpa.decide(ob(0, ready=2, util=1.0)) == 6
    # 7.5 s later: the +4 event is inside both 15 s periods -> start is 2 again -> limit 6
    assert hpa.decide(ob(7.5, ready=2, starting=4, desired=6, util=1.0)) is None
    # at 15 s the event has left the period: from 6, max(12, 10) = 12 (proposal ceil(6*10) = 60)
    assert hpa.decide(ob(15, ready=6, util=1.0)) == 12
    # and then max(24, 16) = 24
    assert hpa.decide(ob(30, ready=12, util=1.0)) == 24


def test_hpa_scale_down_rate_policy() -> None:
    """A 'Pods 1 per 60 s' scale-down policy removes one replica per minute."""
    rules = ScalingRules(0.0, (ScalingPolicy("Pods", 1, 60.0),))
    hpa = HorizontalPodAutoscaler(HpaParams(scale_down=rules))
    changes = run(hpa, lambda t, d: ob(t, ready=d, util=0.05), t_end=180.0, desired=5)
    # proposal ceil(5 * 0.05/0.7) = 1; limit start - 1 per 60 s: 4 at 0, 3 at 60, 2 at 120, 1 at 180
    assert changes == [(0.0, 4), (60.0, 3), (120.0, 2), (180.0, 1)]


def test_hpa_bounds_and_disabled_at_zero() -> None:
    hpa = HorizontalPodAutoscaler(min_replicas=2, max_replicas=5)
    assert hpa.decide(ob(0, ready=8, util=0.7)) == 5  # current above max: snap to max
    assert hpa.decide(ob(15, ready=1, util=0.7)) == 2  # current below min: snap to min
    assert HorizontalPodAutoscaler().decide(ob(ready=0, desired=0, util=1.0)) is None  # disabled
    assert HorizontalPodAutoscaler(max_replicas=7).decide(ob(ready=4, util=1.0)) == 6  # ceil(5.71)
    assert HorizontalPodAutoscaler(max_replicas=5).decide(ob(ready=4, util=1.0)) == 5  # max


# --------------------------------------------------------------------------- KEDA


def test_keda_value_metric_is_the_hpa_ratio_on_p95_ttft() -> None:
    k = KedaPrometheus(slo_ttft_ms=1000.0)
    assert k.period_s == 15.0
    # threshold = TTFT SLO 1000 ms; Value: ratio 1.5 -> ceil(1.5 * 4 ready) = 6
    assert k.decide(ob(0, ready=4, window={"ttft_p95_ms": 1500.0})) == 6
    k2 = KedaPrometheus(slo_ttft_ms=1000.0)
    assert k2.decide(ob(0, ready=4, window={"ttft_p95_ms": 1080.0})) is None  # within 10 %


def test_keda_average_value_divides_the_query_result() -> None:
    # AverageValue: ratio = 1500 / (1000 * 1) = 1.5 -> ceil(1500 / 1000) = 2 replicas
    k = KedaPrometheus(KedaParams(metric_type="AverageValue"), slo_ttft_ms=1000.0)
    assert k.decide(ob(0, ready=1, window={"ttft_p95_ms": 1500.0})) == 2
    # with 4 replicas the same P95 proposes 2 too: the count is independent of current
    assert external_metric_replicas(1500.0, 1000.0, "AverageValue", ready=4, current=4) == 2
    assert external_metric_replicas(3900.0, 1000.0, "AverageValue", ready=4, current=4) == 4


def test_keda_null_query_reads_zero_then_scales_to_min_after_stabilisation() -> None:
    # no requests -> empty query -> 0 (ignoreNullValues); Value ratio 0 -> proposal 0,
    # held by the legacy HPA window (the seed 3 at t = 0 counts through t = 300),
    # then the HPA floor max(1, minReplicaCount) = 1 at the next 15 s sync
    k = KedaPrometheus(min_replicas=1)
    changes = run(k, lambda t, d: ob(t, ready=d, window=None), t_end=330.0, desired=3)
    assert changes == [(315.0, 1)]


@pytest.mark.parametrize(("cached", "expected"), [(True, 8), (False, None)])
def test_keda_polling_interval_with_cached_metrics(cached: bool, expected: int | None) -> None:
    """The operator polls every 30 s; with useCachedMetrics the HPA reads the poll."""
    k = KedaPrometheus(KedaParams(use_cached_metrics=cached), slo_ttft_ms=1000.0)
    # t=0: poll and HPA both see 2000 ms -> ratio 2 -> ceil(2 * 2) = 4
    assert k.decide(ob(0, ready=2, window={"ttft_p95_ms": 2000.0})) == 4
    # t=15: P95 fell to 500 ms.  Cached: still 2000 -> ceil(2 * 4) = 8 (rate limit 8).
    # Not cached: ratio 0.5 -> proposal 2, a scale-down held by the 300 s window.
    assert k.decide(ob(15, ready=4, window={"ttft_p95_ms": 500.0})) == expected
    if cached:
        # t=30: the next poll refreshes the cache to 500 -> proposal 4, held by the window
        assert k.decide(ob(30, ready=8, window={"ttft_p95_ms": 500.0})) is None
        assert k.cached_value == 500.0


def test_keda_activation_and_cooldown_to_zero() -> None:
    """minReplicaCount 0: a poll over activationThreshold wakes 0 -> 1; 300 s idle -> 0."""
    k = KedaPrometheus(KedaParams(activation_threshold_ms=50.0), min_replicas=0)
    assert k.decide(ob(0, ready=0, desired=0, window={"ttft_p95_ms": 40.0})) is None  # 40 <= 50
    assert k.decide(ob(30, ready=0, desired=0, window={"ttft_p95_ms": 300.0})) == 1  # active
    # idle from t = 45 on: polls at 60, 90, ...; last active poll at 30 -> zero at the first poll
    # strictly after 30 + 300 (lastActiveTime + cooldownPeriod is *before* now): 360
    changes = run(k, lambda t, d: ob(t, ready=d, window=None), t0=45.0, t_end=375.0, desired=1)
    assert changes == [(360.0, 0)]


# --------------------------------------------------------------------------- KPA

KPA10 = KpaParams(target_concurrency=10.0, target_utilization=1.0)  # TargetValue 10


def calm_then(kpa: KnativePodAutoscaler, ready: int, ongoing: int, t_end: float) -> None:
    """Ticks every 2 s from 0 to ``t_end`` at steady load; asserts no change."""
    for k in range(int(t_end / 2) + 1):
        assert kpa.decide(ob(2.0 * k, ready=ready, ongoing=ongoing)) is None


def test_kpa_stable_mode_scales_on_60s_average() -> None:
    kpa = KnativePodAutoscaler(KPA10)
    assert kpa.period_s == 2.0  # tick-interval
    calm_then(kpa, ready=2, ongoing=20, t_end=70)  # 20 in flight / 10 = 2 pods; startup panic ends
    assert not kpa.panicking
    # burst to 50 at t=72: panic window (6 s) = (20+20+50)/3 = 30 -> dppc 3; 3/2 = 1.5 < 2
    # stable (60 s, 30 samples) = (29*20 + 50)/30 = 21 -> dspc ceil(2.1) = 3
    assert kpa.decide(ob(72, ready=2, ongoing=50)) == 3
    assert not kpa.panicking


def test_kpa_panic_entered_at_twice_the_capacity_of_ready_pods() -> None:
    kpa = KnativePodAutoscaler(KPA10)
    calm_then(kpa, ready=2, ongoing=20, t_end=70)
    # burst to 80: panic avg (20+20+80)/3 = 40 = 2x (2 pods * 10) -> dppc 4; 4/2 >= 2.0: panic
    # stable avg (29*20 + 80)/30 = 22 -> 3; panicking uses max(3, 4) = 4
    assert kpa.decide(ob(72, ready=2, ongoing=80)) == 4
    assert kpa.panicking


def test_kpa_no_scale_down_while_panicking_and_exit_after_stable_window() -> None:
    kpa = KnativePodAutoscaler(KPA10)
    calm_then(kpa, ready=2, ongoing=20, t_end=70)
    assert kpa.decide(ob(72, ready=2, ongoing=80)) == 4  # panic at t = 72
    # load drops to 0 with 4 pods ready: never below maxPanicPods = 4 while panicking
    for t in range(74, 133, 2):
        assert kpa.decide(ob(t, ready=4, ongoing=0)) is None, t
    assert kpa.panicking  # 72 + 60 = 132 is not < 132
    # t = 134: 72 + 60 < 134 and not over -> un-panic; stable avg 0 -> dspc 0, but
    # max-scale-down-rate 2 floors it at floor(4 / 2) = 2
    assert kpa.decide(ob(134, ready=4, ongoing=0)) == 2
    assert not kpa.panicking


def test_kpa_starts_in_panic_with_more_than_one_ready_pod() -> None:
    kpa = KnativePodAutoscaler(KPA10)
    # 3 ready, no load: stable wants floor(3/2) = 1, but a new autoscaler starts panicking
    assert kpa.decide(ob(0, ready=3, ongoing=0)) is None
    assert kpa.panicking


def test_kpa_default_target_is_littles_law_times_utilisation() -> None:
    kpa = KnativePodAutoscaler(replica_capacity_rps=2.0)
    assert kpa.params.target_value is None
    assert kpa.decide(ob(0, ready=1, ongoing=40)) is None  # no window yet: target unknown, hold
    # a window at 1.5 req/s per replica (<= 2) with 9 in flight per replica: W = 6 s
    # -> 2 req/s x 6 s = 12 per replica x 0.70 = 8.4; 40 + 0 in flight: ceil(40 / 8.4) = 5
    w = {
        "window_end_ms": 1,
        "count": 30,
        "rate_rps": 1.5,
        "replicas_ready": 1,
        "running_mean": 9.0,
        "queue_len_mean": 0.0,
    }
    assert kpa.target_value() is None
    assert kpa.decide(ob(2, ready=1, ongoing=40, window=w)) == 5
    assert kpa.target_value() == pytest.approx(8.4)


@pytest.mark.parametrize(("delay_s", "expected"), [(0.0, [(2, 2), (4, 1)]), (10.0, [(10, 2), (12, 1)])])
def test_kpa_scale_down_delay_holds_the_max(delay_s: float, expected: list) -> None:
    """Stable window 6 s, panic effectively off (threshold 1000 %), target 10 per pod."""
    kpa = KnativePodAutoscaler(
        KpaParams(
            target_concurrency=10.0,
            target_utilization=1.0,
            stable_window_s=6.0,
            panic_threshold_percentage=1000.0,
            scale_down_delay_s=delay_s,
        )
    )
    assert kpa.decide(ob(0, ready=1, ongoing=30)) == 3  # ceil(30 / 10)
    changes, desired = [], 3
    for t in range(2, 16, 2):  # load gone, 3 pods ready
        out = kpa.decide(ob(t, ready=3, desired=desired, ongoing=0))
        if out is not None:
            changes.append((t, out))
            desired = out
    # no delay: t=2 avg(30, 0) = 15 -> 2; t=4 avg(30, 0, 0) = 10 -> 1 (floor(3/2) = 1 allows it)
    # 10 s delay: the max over the trailing 10 s keeps 3 until the t=0 entry leaves at t=10
    assert changes == expected


# --------------------------------------------------------------------------- Ray Serve

FAST_METRICS = dict(look_back_period_s=1.0, metrics_interval_s=1.0)  # latest sample only


T32 = dict(target_ongoing_requests=32.0)  # a fixed per-replica target (the default is Little's law)


def test_rayserve_upscale_only_after_30s_of_consistent_decisions() -> None:
    rs = RayServeAutoscaler(RayServeParams(**T32))  # target 32 per replica, 1 s loop
    # 2 replicas with 128 ongoing: 128 / 32 = 4 replicas wanted from t = 0
    changes = run(rs, lambda t, d: ob(t, ready=2, desired=d, ongoing=128), t_end=40.0, desired=2)
    # counter must exceed int(30 / 1) = 30: 31st consecutive loop, t = 30
    assert changes == [(30.0, 4)]


def test_rayserve_downscale_after_600s() -> None:
    rs = RayServeAutoscaler(RayServeParams(**T32))
    # 4 replicas with 32 ongoing: 32 / 32 = 1 replica; counter < -600 at t = 600
    changes = run(rs, lambda t, d: ob(t, ready=4, desired=d, ongoing=32), t_end=700.0, desired=4)
    assert changes == [(600.0, 1)]


def test_rayserve_direction_flip_resets_the_counter() -> None:
    rs = RayServeAutoscaler(RayServeParams(**T32, **FAST_METRICS))
    for t in range(20):  # 20 loops wanting 4
        assert rs.decide(ob(t, ready=2, ongoing=128)) is None
    assert rs.decide(ob(20, ready=2, ongoing=64)) is None  # 64/32 = 2 = target: reset
    assert rs.decision_counter == 0
    outs = [rs.decide(ob(t, ready=2, ongoing=128)) for t in range(21, 52)]
    assert outs[:-1] == [None] * 30 and outs[-1] == 4  # another 31 loops


def test_rayserve_metrics_averaged_over_look_back() -> None:
    rs = RayServeAutoscaler(RayServeParams(**T32, upscale_delay_s=0.0, metrics_interval_s=1.0))
    for t in range(10):
        rs.decide(ob(t, ready=4, desired=4, ongoing=128))  # 128 / 32 = 4: no change
    # one sample of 448 among 11 in the 30 s look-back: (10*128 + 448)/11 = 157.1 -> ceil(4.9) = 5
    assert rs.decide(ob(10, ready=4, desired=4, ongoing=448)) == 5


@pytest.mark.parametrize(
    ("params", "ready", "ongoing", "expected"),
    [
        # upscaling_factor 0.5: 2 + 0.5 * (6 - 2) = 4
        (dict(upscaling_factor=0.5), 2, 192, 4),
        # downscaling_factor 0.1: ceil(4 + 0.1 * (3 - 4)) = ceil(3.9) = 4 stuck -> forced to 3
        (dict(downscaling_factor=0.1), 4, 96, 3),
        # no factor: ceil(100 / 32) = ceil(3.125) = 4
        ({}, 2, 100, 4),
    ],
)
def test_rayserve_scaling_factors(params: dict[str, float], ready: int, ongoing: int, expected: int) -> None:
    rs = RayServeAutoscaler(RayServeParams(**T32, upscale_delay_s=0.0, downscale_delay_s=0.0, **FAST_METRICS, **params))
    assert rs.decide(ob(0, ready=ready, ongoing=ongoing)) == expected


def test_rayserve_cold_start_bypasses_the_delay() -> None:
    rs = RayServeAutoscaler(min_replicas=0)
    assert rs.decide(ob(0, ready=0, desired=0, ongoing=3)) == 1  # max(ceil(1 * 1.0), 0)
    assert RayServeAutoscaler(min_replicas=0).decide(ob(0, ready=0, desired=0)) is None


# --------------------------------------------------------------------------- Dynamo load

TTFT0, TTFT_SLOPE, ITL0 = 200.0, 100.0, 20.0  # ttft = 200 + 100 q ; itl = 20 + 1 * (q + r)


def window(k: int) -> dict[str, Any]:
    q, r = float(k), 10.0 * k
    return {
        "window_end_ms": 10_000 * (k + 1),
        "queue_len_mean": q,
        "running_mean": r,
        "ttft_p95_ms": TTFT0 + TTFT_SLOPE * q,
        "itl_p95_ms": ITL0 + (q + r),
    }


def trained(n_windows: int = 5) -> DynamoLoadPlanner:
    """A load planner whose regressions saw ``n_windows`` windows (while scaling was in flight)."""
    # P95 regressions on hand-made windows (the default mean-like estimate is in test_peer_dynamo_load.py)
    dl = DynamoLoadPlanner(DynamoLoadParams(estimate="p95"), slo_ttft_ms=1000.0, slo_itl_ms=150.0)
    for k in range(n_windows):
        assert dl.decide(ob(5 * k, ready=2, starting=1, window=window(k))) is None
    return dl


def test_dynamo_load_waits_for_min_observations() -> None:
    dl = trained(4)
    assert dl.period_s == 5.0
    # TTFT estimate would be far above the SLA, but 4 < 5 samples: no decision
    assert dl.decide(ob(20, ready=2, queue=40, ongoing=40, window=window(3))) is None
    assert dl.decide(ob(25, ready=2, queue=40, ongoing=40, window=window(4))) == 3


def test_dynamo_load_plus_one_when_estimate_above_sla() -> None:
    dl = trained()
    # queue 20 over 2 replicas: q = 10 -> TTFT 200 + 1000 = 1200 > 1000 -> +1 only (not +N)
    assert dl.decide(ob(25, ready=2, queue=20, ongoing=20)) == 3
    # ITL side: 2 * 140 ongoing -> 20 + 140 = 160 > 150 -> +1
    assert trained().decide(ob(25, ready=2, queue=0, ongoing=280)) == 3


def test_dynamo_load_minus_one_when_consolidation_is_safe() -> None:
    dl = trained()
    # N = 4, q = 0, 10 per replica: TTFT queue-induced 0 < (1000 - 200) * 0.8;
    # ITL after consolidation 20 + 10 * 4/3 = 33.3 < 150 * 0.8 = 120 -> -1
    assert dl.decide(ob(25, ready=4, queue=0, ongoing=40)) == 3


def test_dynamo_load_refuses_unsafe_scale_down() -> None:
    dl = trained()
    # N = 2, 60 per replica: ITL now 80 <= 150, after 2 -> 1 it is 20 + 120 = 140 >= 120: hold
    assert dl.decide(ob(25, ready=2, queue=0, ongoing=120)) is None
    # TTFT side: q = 4 -> post-consolidation q = 8 -> queue-induced 100 * 8 = 800 >= the budget
    # (1000 - 200) * 0.8 = 640: hold, although ITL alone (28 < 120) would allow it
    assert dl.decide(ob(30, ready=2, queue=8, ongoing=8)) is None


def test_dynamo_load_observes_only_while_scaling() -> None:
    dl = trained()
    assert dl.decide(ob(25, ready=2, desired=3, queue=40, ongoing=40)) is None  # in progress
    assert dl.decide(ob(30, ready=1, starting=0, desired=1, queue=0, ongoing=1)) is None  # N = 1


# --------------------------------------------------------------------------- Dynamo throughput


def test_dynamo_throughput_requires_capacity() -> None:
    with pytest.raises(BaselineParameterError) as exc:
        DynamoThroughputPlanner()
    assert exc.value.parameter == "replica_capacity_rps"


def test_dynamo_throughput_ceil_of_forecast_over_capacity() -> None:
    th = DynamoThroughputPlanner(replica_capacity_rps=4.0)
    assert th.params.adjustment_interval_s == 180.0
    # 10 rps for 180 s = 1800 requests; constant forecast 1800 / 180 = 10 rps; ceil(10 / 4) = 3
    changes = run(th, lambda t, d: ob(t, ready=d, rate=10.0), t_end=200.0)
    assert changes == [(180.0, 3)]


def test_dynamo_throughput_constant_vs_kalman_on_a_ramp() -> None:
    """Rates 10, 20, 30, 40 rps in four 10 s intervals (counts 100 ... 400)."""

    def sizes(predictor: Literal["constant", "arima", "kalman"]) -> list[tuple[float, int]]:
        th = DynamoThroughputPlanner(
            DynamoThroughputParams(adjustment_interval_s=10.0, predictor=predictor), replica_capacity_rps=4.0
        )
        return run(th, lambda t, d: ob(t, ready=d, rate=10.0 * ((int(t) - 1) // 10 + 1)), t_end=40.0)

    # constant: last count / 10 s / 4 rps: 100 -> 3, 200 -> 5, 300 -> 8, 400 -> 10
    assert sizes("constant") == [(10.0, 3), (20.0, 5), (30.0, 8), (40.0, 10)]
    kalman = dict(sizes("kalman"))
    assert kalman[10.0] == 3 and kalman[40.0] > 10  # the trend term forecasts above 400


def test_dynamo_throughput_skips_leading_idle_and_floors_at_one() -> None:
    th = DynamoThroughputPlanner(DynamoThroughputParams(adjustment_interval_s=10.0), replica_capacity_rps=4.0)
    assert run(th, lambda t, d: ob(t, ready=d, rate=0.0), t_end=30.0, desired=1) == []
    assert th.history == []  # zeros before any traffic are skipped
    assert th.decide(ob(31, ready=3, desired=3)) is None
    assert DynamoThroughputPlanner(replica_capacity_rps=1.0).clamp(0) == 1


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("factory", "parameter"),
    [
        (lambda: HpaParams(target_utilization=0.0), "target_utilization"),
        (lambda: HpaParams(tolerance=1.5), "tolerance"),
        (lambda: ScalingPolicy("Pods", 0), "value"),
        (lambda: KedaParams(metric_type="Sum"), "metric_type"),  # type: ignore[arg-type]
        (lambda: KedaParams(polling_interval_s=0.0), "polling_interval_s"),
        (lambda: KpaParams(panic_threshold_percentage=100.0), "panic_threshold_percentage"),
        (lambda: KpaParams(max_scale_down_rate=1.0), "max_scale_down_rate"),
        (lambda: RayServeParams(target_ongoing_requests=0.0), "target_ongoing_requests"),
        (lambda: RayServeParams(upscale_delay_s=-1.0), "upscale_delay_s"),
        (lambda: DynamoLoadParams(scaling_down_sensitivity=120.0), "scaling_down_sensitivity"),
        (lambda: DynamoThroughputParams(predictor="prophet"), "predictor"),  # type: ignore[arg-type]
        (lambda: StaticParams(replicas=-1), "replicas"),
        (lambda: HorizontalPodAutoscaler(min_replicas=5, max_replicas=4), "max_replicas"),
        (lambda: KnativePodAutoscaler(slo_ttft_ms=0.0), "slo_ttft_ms"),
        (lambda: RayServeAutoscaler(replica_capacity_rps=-2.0), "replica_capacity_rps"),
    ],
)
def test_invalid_parameters_are_named(factory, parameter: str) -> None:
    with pytest.raises(BaselineParameterError) as exc:
        factory()
    assert exc.value.parameter == parameter and isinstance(exc.value, ValueError)
    assert str(exc.value).startswith(parameter + "=")


# --------------------------------------------------------------------------- contract


def build(name: str, lo: int = 1, hi: int = 64) -> Autoscaler:
    return BASELINES[name](
        min_replicas=lo, max_replicas=hi, slo_ttft_ms=1000.0, slo_itl_ms=150.0, replica_capacity_rps=2.0
    )


def test_registry_names_and_protocol() -> None:
    assert set(BASELINES) == {
        "static",
        "hpa",
        "hpa-queue",
        "keda",
        "kpa",
        "rayserve",
        "dynamo-load",
        "dynamo-throughput",
    }
    for name in BASELINES:
        b = build(name)
        assert isinstance(b, Autoscaler) and b.name == name and b.period_s > 0


quantile = st.one_of(st.none(), st.floats(0.0, 20_000.0))
windows = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {
            "window_end_ms": st.integers(0, 10**7),
            "ttft_p95_ms": quantile,
            "itl_p95_ms": quantile,
            "queue_len_mean": st.one_of(st.none(), st.floats(0.0, 200.0)),
            "running_mean": st.one_of(st.none(), st.floats(0.0, 64.0)),
        }
    ),
)
steps = st.lists(
    st.tuples(
        st.integers(0, 70),
        st.integers(0, 5),
        st.integers(0, 2000),
        st.integers(0, 2000),
        st.floats(0.0, 500.0),
        st.floats(0.0, 1.0),
        windows,
        st.floats(0.1, 40.0),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(BASELINES)),
    lo=st.integers(0, 4),
    span=st.integers(0, 20),
    seq=steps,
    start=st.integers(0, 30),
)
def test_decisions_stay_within_bounds(name: str, lo: int, span: int, seq, start: int) -> None:
    hi = max(1, lo + span)
    b = build(name, lo, hi)
    desired, t = start, 0.0
    for ready, starting, ongoing, queue, rate, util, win, dt in seq:
        t += dt
        out = b.decide(
            Observation(
                t_s=t,
                zone="az-a",
                model="m",
                replicas_ready=ready,
                replicas_starting=starting,
                desired=desired,
                ongoing_requests=ongoing,
                queue_len=queue,
                arrival_rate_rps=rate,
                gpu_util=util,
                window=win,
            )
        )
        if out is not None:
            assert isinstance(out, int) and lo <= out <= hi, (name, out, lo, hi)
            desired = out


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_state_pickles_and_resumes_identically(name: str) -> None:
    b = build(name, 1, 16)

    def obs_at(k: int) -> Observation:
        return ob(k * b.period_s, ready=3, ongoing=20 * k, queue=k, rate=float(k), util=0.1 * k, window=window(k))

    for k in range(6):
        b.decide(obs_at(k))
    clone = pickle.loads(pickle.dumps(b))
    for k in range(6, 12):
        assert clone.decide(obs_at(k)) == b.decide(obs_at(k))


def test_no_nan_from_degenerate_windows() -> None:
    dl = DynamoLoadPlanner(DynamoLoadParams(estimate="p95"))
    for k in range(6):  # same load every window: regression falls back to the mean
        dl.decide(ob(5 * k, ready=2, starting=1, window={**window(2), "window_end_ms": k}))
    assert not math.isnan(dl.ttft_fit.predict(3.0))


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_a_peer_declares_only_what_differs_and_takes_the_harness_keywords_from_the_base(name: str) -> None:
    """Issue 32 item 7: the five harness keywords are named once (BaselineBase), not in every peer."""
    cls = BASELINES[name]
    assert isinstance(cls, type) and issubclass(cls, BaselineBase)
    own = inspect.signature(cls.__init__).parameters
    assert [p for p in own if p in Harness.__annotations__] == []
    assert [p.kind for p in own.values()][-1] is inspect.Parameter.VAR_KEYWORD
    harness = {"min_replicas": 2, "max_replicas": 9, "slo_ttft_ms": 700.0, "slo_itl_ms": 90.0}
    peer = cls(**harness, replica_capacity_rps=3.0)
    assert {k: getattr(peer, k) for k in harness} == harness and peer.replica_capacity_rps == 3.0
    with pytest.raises(BaselineParameterError, match="max_replicas"):
        cls(min_replicas=5, max_replicas=4, replica_capacity_rps=3.0)
    with pytest.raises(TypeError):
        cls(replica_capacity_rps=3.0, min_replica=2)  # a misspelt keyword is refused, as before
