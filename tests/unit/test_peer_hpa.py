"""The HPA baselines held to Kubernetes' own unit tests.

Each case is a fact (inputs -> expected replicas) from
kubernetes/kubernetes ``pkg/controller/podautoscaler/replica_calculator_test.go``
or ``horizontal_test.go``, named in its comment and run against our
:func:`~sim.baselines.hpa.plain_metric_replicas` / :class:`~sim.baselines.hpa_behavior.HpaBehavior`
/ :class:`~sim.baselines.hpa.HorizontalPodAutoscaler`.  Translation: CPU
``levels`` (milli-cores) over 1.0-core requests are utilisation percent;
``podReadiness False`` pods carry a metric and are *unready*; pods beyond
``levels`` have no metric and are *missing*.  Where our model differs on
purpose the case says so.  The HPA-on-queue-depth baseline is checked at the end.
"""

from __future__ import annotations

import pytest

from sim.baselines import Observation
from sim.baselines.hpa import HorizontalPodAutoscaler, HpaParams, plain_metric_replicas
from sim.baselines.hpa_behavior import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    HpaBehavior,
    ScalingPolicy,
    ScalingRules,
    convert_legacy,
)
from sim.baselines.hpa_queue import HpaQueueDepth, HpaQueueParams

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------- replica_calculator_test.go
# (usage %, target %, ready, unready, missing, current, fill_down, expected)
CALC = [
    # TestReplicaCalcScaleUp: levels 300/500/700 -> mean 50 %, target 30 -> ceil(3 * 1.67) = 5
    (50.0, 30.0, 3, 0, 0, 3, None, 5),
    # TestReplicaCalcScaleUpUnreadyLessScale: ready 500/700 (mean 60), one unready at 0 -> 120/90 -> 4
    (60.0, 30.0, 2, 1, 0, 3, None, 4),
    # TestReplicaCalcScaleUpUnreadyNoScale: ready 400 only, two unready at 0 -> 40/90 < 1 flips -> keep 3
    (40.0, 30.0, 1, 2, 0, 3, None, 3),
    # TestReplicaCalcScaleDown: 100/300/500/250/250 -> mean 28 %, target 50 -> ceil(5 * 0.56) = 3
    (28.0, 50.0, 5, 0, 0, 5, None, 3),
    # TestReplicaCalcScaleDownIncludeUnreadyPods: ready 100/300/500 (30 %), 2 unready ignored -> ceil(1.8) = 2
    (30.0, 50.0, 3, 2, 0, 5, None, 2),
    # TestReplicaCalcTolerance: 3060 m used of 3000 m requested = 102 % vs 100 -> within 10 % -> 3
    (102.0, 100.0, 3, 0, 0, 3, None, 3),
    # TestReplicaCalcMissingMetrics: 400/95 of 4 pods (24.75 %), 2 missing at 100 % -> 249.5/400 -> 3
    (24.75, 100.0, 2, 0, 2, 4, 100.0, 3),
    # TestReplicaCalcMissingMetricsNoChangeEq: 1000 m of 2 pods = 100 %: ratio 1, missing unused -> 2
    (100.0, 100.0, 1, 0, 1, 2, 100.0, 2),
    # TestReplicaCalcMissingMetricsNoChangeGt: 190 %, missing at 0 -> 0.95 within tolerance -> 2
    (190.0, 100.0, 1, 0, 1, 2, 100.0, 2),
    # TestReplicaCalcMissingMetricsNoChangeLt: 60 %, missing at 100 % -> 0.8 -> ceil(1.6) = 2
    (60.0, 100.0, 1, 0, 1, 2, 100.0, 2),
    # TestReplicaCalcMissingMetricsUnreadyChange: ready 45 % (450 m), 1 unready, 1 missing at 100 %
    #   -> scale-down: (45 + 100) / (2 * 50) = 1.45 > 1 flips direction -> keep 3
    (45.0, 50.0, 1, 1, 1, 3, 100.0, 3),
    # TestReplicaCalcMissingMetricsUnreadyScaleUp: ready 200 %, 1 unready + 1 missing at 0 -> 200/150 -> 4
    (200.0, 50.0, 1, 1, 1, 3, 100.0, 4),
    # TestReplicaCalcMissingMetricsUnreadyScaleDown: ready 10 %, 1 unready ignored, 1 missing at 100 %
    #   -> (10 + 10 + 100) / (3 * 50) = 0.8 -> ceil(2.4) = 3
    (10.0, 50.0, 2, 1, 1, 4, 100.0, 3),
    # TestReplicaCalcDuringRollingUpdateWithMaxSurge: 3 pods, 2 at 10 %, 1 missing at 100 %
    #   -> 0.8 -> ceil(2.4) = 3 > current 2 on a scale-down -> keep 2
    (10.0, 50.0, 2, 0, 1, 2, 100.0, 2),
    # TestReplicaCalcScaleDownCM (Pods metric): 12000 of target 20000 on 5 pods -> ceil(3.0) = 3
    (12000.0, 20000.0, 5, 0, 0, 5, None, 3),
    # TestReplicaCalcToleranceCM: mean 20666 vs 20000 -> within tolerance -> 3
    (20666.0, 20000.0, 3, 0, 0, 3, None, 3),
]


@pytest.mark.parametrize(("usage", "target", "ready", "unready", "missing", "current", "fill", "expected"), CALC)
def test_replica_calculator(
    usage: float, target: float, ready: int, unready: int, missing: int, current: int, fill: float | None, expected: int
) -> None:
    got = plain_metric_replicas(usage, target, ready, unready, current, 0.1, missing=missing, fill_down=fill)
    assert got == expected


def test_pods_metric_missing_pods_fill_at_the_target_on_scale_down() -> None:
    # replica_calculator.go calcPlainMetricReplicas: a Pods metric fills missing pods with targetUsage
    # (the CPU Resource path above uses max(100, target) % of the request): 45 + 50 = 95 / 100 -> keep 3
    assert plain_metric_replicas(45.0, 50.0, 1, 1, 3, 0.1, missing=1) == 3
    # ... and our GPU-utilisation HPA reads a starting replica as such a pod: 2 ready at 0.2, 2 starting
    # -> (0.4 + 1.4) / (4 * 0.7) = 0.643 -> ceil(2.57) = 3 (without the fill it would be ceil(1.14) = 2)
    hpa = HorizontalPodAutoscaler(HpaParams(smoothing_window_s=0.0, downscale_stabilization_s=0.0))
    assert hpa.decide(Observation(0.0, "az-a", "m", 2, 2, 4, 0, 0, 0.0, 0.2, None)) is None  # the seed 4 counts now
    assert hpa.decide(Observation(15.0, "az-a", "m", 2, 2, 4, 0, 0, 0.0, 0.2, None)) == 3


# ---------------------------------------------------------------- horizontal_test.go (legacy path)


@pytest.mark.parametrize(
    ("current", "desired", "lo", "hi", "expected"),
    [
        (5, 7, 3, 8, 7),  # TestConvertDesiredReplicasWithRules: "prenormalized desired replicas within range"
        (3, 1, 2, 8, 2),  # ... "prenormalized desired replicas < minReplicas"
        (1, 0, 0, 10, 1),  # ... "1 is minLimit because hpaMinReplicas < 1"
        (20, 1000, 1, 10, 10),  # ... "maxReplicas is the limit because maxReplicas < scaleUpLimit"
        (3, 1000, 1, 2000, 6),  # ... "scaleUpLimit is the limit": calculateScaleUpLimit(3) = max(6, 4)
    ],
)
def test_convert_desired_replicas_with_rules(current: int, desired: int, lo: int, hi: int, expected: int) -> None:
    assert convert_legacy(current, desired, lo, hi) == expected


NOW = 1000.0


@pytest.mark.parametrize(
    ("recs", "desired", "expected", "log_len"),
    [
        ([], 5, 5, 1),  # TestNormalizeDesiredReplicas "empty log"
        ([(4, -120), (5, -60)], 3, 5, 3),  # "stabilize": max over the 5 min window
        ([(1, -120), (2, -60)], 3, 3, 3),  # "no stabilize"
        ([(10, -600), (9, -540)], 3, 3, 1),  # "no stabilize - old recommendations" (upstream reuses a slot: 2)
        ([(10, -600), (4, -60), (5, -120), (9, -540)], 3, 5, 3),  # "stabilize - old recommendations" (4)
    ],
)
def test_normalize_desired_replicas_legacy(
    recs: list[tuple[int, float]], desired: int, expected: int, log_len: int
) -> None:
    b = HpaBehavior(downscale_stabilization_s=300.0)
    assert b.legacy
    b.recommendations = [(NOW + dt, r) for r, dt in recs]
    assert b.stabilize_legacy(NOW, desired) == expected
    # deliberate difference: upstream overwrites one expired entry in place (log lengths 2 and 4);
    # we drop every expired one and append, so the log holds only the window (1 and 3)
    assert len(b.recommendations) == log_len


# ---------------------------------------------------------------- horizontal_test.go (behavior path)


@pytest.mark.parametrize(
    ("recs", "current", "desired", "up_window", "down_window", "expected"),
    [
        ([], 100, 5, 0, 0, 5),  # TestNormalizeDesiredReplicasWithBehavior "empty recommendations for scaling down"
        ([(4, -120), (5, -60)], 100, 3, 0, 180, 5),  # "simple scale down stabilization"
        ([(4, -120), (5, -60)], 1, 7, 300, 0, 4),  # "simple scale up stabilization"
        ([(1, -120), (2, -60)], 100, 3, 300, 0, 3),  # "no scale down stabilization"
        ([(4, -120), (5, -60)], 1, 3, 0, 300, 3),  # "no scale up stabilization"
        ([(10, -600), (9, -540)], 100, 3, 0, 0, 3),  # "no scale down stabilization, reuse recommendation element"
        ([(10, -600), (9, -540)], 1, 100, 0, 0, 100),  # "no scale up stabilization, reuse recommendation element"
        ([(10, -600), (4, -60), (5, -120), (9, -540)], 100, 3, 0, 180, 5),  # "scale down stabilization, reuse ..."
        ([(10, -6000), (6, -60), (5, -120), (9, -180)], 1, 100, 300, 0, 5),  # "scale up stabilization, reuse ..."
    ],
)
def test_stabilize_recommendation_with_behaviors(
    recs: list[tuple[int, float]], current: int, desired: int, up_window: float, down_window: float, expected: int
) -> None:
    pol = (ScalingPolicy("Percent", 100, 15.0),)
    b = HpaBehavior(ScalingRules(up_window, pol), ScalingRules(down_window, pol))
    b.recommendations = [(NOW + dt, r) for r, dt in recs]
    assert b.stabilize(NOW, current, desired) == expected


def test_a_proposal_below_current_never_scales_up() -> None:
    # stabilizeRecommendationWithBehaviors brings *current* into [up, down]: current 5, proposal 3 and an
    # 8 in the scale-down window -> up = 3, down = 8 -> stays 5 (the old form took max(3, 8) = 8: a scale-up)
    b = HpaBehavior(DEFAULT_SCALE_UP, DEFAULT_SCALE_DOWN)
    b.recommendations = [(NOW - 60, 8)]
    assert b.stabilize(NOW, 5, 3) == 5


@pytest.mark.parametrize(
    ("up", "down", "current", "desired", "expected"),
    [
        # TestScalingWithRules "scaleUp with default behavior": max(100 % -> 20, 4 pods -> 14) = 20
        (DEFAULT_SCALE_UP, None, 10, 50, 20),
        # "scaleUp with pods policy larger than percent policy": Pods 100 / 60 s vs 100 % / 60 s -> 110
        (ScalingRules(0, (ScalingPolicy("Pods", 100, 60), ScalingPolicy("Percent", 100, 60))), None, 10, 500, 110),
        # "scaleUp with percent policy larger than pods policy": Pods 2 vs 100 % -> 20
        (ScalingRules(0, (ScalingPolicy("Pods", 2, 60), ScalingPolicy("Percent", 100, 60))), None, 10, 500, 20),
        # "scaleDown with default behavior": 100 % per 15 s -> straight to 5
        (None, ScalingRules(0, (ScalingPolicy("Percent", 100, 15),)), 10, 5, 5),
        # "scaleDown with pods policy larger than percent policy": Pods 20 vs 1 % -> 80
        (None, ScalingRules(0, (ScalingPolicy("Pods", 20, 60), ScalingPolicy("Percent", 1, 60))), 100, 2, 80),
        # "scaleDown with percent policy larger than pods policy": Pods 2 vs 1 % (99) -> 98
        (None, ScalingRules(0, (ScalingPolicy("Pods", 2, 60), ScalingPolicy("Percent", 1, 60))), 100, 2, 98),
    ],
)
def test_scaling_with_rules(
    up: ScalingRules | None, down: ScalingRules | None, current: int, desired: int, expected: int
) -> None:
    b = HpaBehavior(up, down)
    assert b.normalize(NOW, current, desired, 1, 1000) == expected


# ---------------------------------------------------------------- the baseline end to end


def test_no_behavior_means_legacy_limit_and_window() -> None:
    # every HPA KEDA creates has no behavior: 4 replicas at util 1.0 / target 0.1 -> proposal 40,
    # legacy limit max(2 x 4, 4) = 8 (the documented default policies would allow max(8, 8) too,
    # but from 10 they differ: legacy 20 vs policies max(20, 14) = 20 -- and for 2: legacy 4, policies 6)
    hpa = HorizontalPodAutoscaler(HpaParams(target_utilization=0.1, smoothing_window_s=0.0))
    assert hpa.decide(Observation(0.0, "az-a", "m", 2, 0, 2, 0, 0, 0.0, 1.0, None)) == 4


def test_utilisation_is_smoothed_over_30s() -> None:
    # a 1 s spike to 100 % among 0.7 samples: 30 s mean 0.71 -> ratio 1.01 within tolerance -> no change
    hpa = HorizontalPodAutoscaler()
    out = None
    for t in range(31):
        util = 1.0 if t == 30 else 0.7
        out = hpa.decide(Observation(float(t), "az-a", "m", 4, 0, 4, 0, 0, 0.0, util, None))
    assert out is None
    # the same spike with no smoothing: ceil(4 x 1.0 / 0.7) = 6
    raw = HorizontalPodAutoscaler(HpaParams(smoothing_window_s=0.0))
    raw.decide(Observation(0.0, "az-a", "m", 4, 0, 4, 0, 0, 0.0, 0.7, None))
    assert raw.decide(Observation(15.0, "az-a", "m", 4, 0, 4, 0, 0, 0.0, 1.0, None)) == 6


# ---------------------------------------------------------------- HPA on queue depth


def test_queue_depth_target_is_littles_law_on_the_waiting_room() -> None:
    hq = HpaQueueDepth(replica_capacity_rps=3.0, slo_ttft_ms=1000.0)
    assert hq.target_waiting == pytest.approx(1.5)  # 3 req/s x 0.5 x 1 s
    assert HpaQueueDepth(HpaQueueParams(target_waiting=4.0)).target_waiting == 4.0


@pytest.mark.parametrize(
    ("ready", "starting", "waiting", "expected"),
    [
        (4, 0, 12, 8),  # 3 per replica / 1 -> proposal 12, legacy limit 8 (replica_calculator + legacy rule)
        (4, 0, 4, None),  # 1 per replica = target -> keep
        (4, 0, 5, 5),  # 1.25 per replica: outside the 10 % tolerance -> ceil(4 x 1.25) = 5
        (4, 0, 2, None),  # 0.5 per replica -> ceil(2) = 2, but the legacy 300 s window holds the seed 4
        (2, 2, 8, 8),  # 4 per ready replica; 2 starting export no gauge: missing at 0 -> 8 / 4 = 2 -> ceil(8) = 8
    ],
)
def test_queue_depth_ratio_rule(ready: int, starting: int, waiting: int, expected: int | None) -> None:
    hq = HpaQueueDepth(HpaQueueParams(target_waiting=1.0, hpa=HpaParams(smoothing_window_s=0.0)))
    obs = Observation(0.0, "az-a", "m", ready, starting, ready + starting, waiting, waiting, 0.0, 1.0, None)
    assert hq.decide(obs) == expected
