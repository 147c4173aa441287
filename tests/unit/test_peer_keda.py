"""The KEDA baseline held to its upstream tests.

KEDA's trigger turns a PromQL result into an HPA ``External`` metric; the
replica arithmetic is the HPA's ``GetExternalMetricReplicas`` (``Value``) and
``GetExternalPerPodMetricReplicas`` (``AverageValue``), checked here against
kubernetes/kubernetes ``pkg/controller/podautoscaler/replica_calculator_test.go``;
the query reading against kedacore/keda ``pkg/scalers/prometheus_scaler_test.go``
(``TestPrometheusScalerExecutePromQuery``); activation and cooldown against
kedacore/keda ``pkg/scaling/executor/scale_scaledobjects.go`` as its tests
(``scale_scaledobjects_test.go``) exercise it.  Each case names its source.
"""

from __future__ import annotations

import math

import pytest

from sim.baselines import Observation
from sim.baselines.keda import KedaParams, KedaPrometheus, external_metric_replicas

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("value", "target", "kind", "ready", "current", "expected"),
    [
        (8600, 4400, "Value", 1, 1, 2),  # TestReplicaCalcScaleUpCMExternal: ceil(1.95 x 1)
        (8600, 4400, "Value", 1, 3, 2),  # TestReplicaCalcScaleUpCMExternalIgnoresUnreadyPods: 1 ready of 3
        (8600, 2150, "AverageValue", 3, 3, 4),  # TestReplicaCalcScaleUpPerPodCMExternal: ceil(8600 / 2150)
        (8600, 14334, "Value", 5, 5, 3),  # TestReplicaCalcScaleDownCMExternal: ceil(0.6 x 5)
        (8600, 2867, "AverageValue", 5, 5, 3),  # TestReplicaCalcScaleDownPerPodCMExternal: ceil(2.9997)
        (8600, 8888, "Value", 3, 3, 3),  # TestReplicaCalcToleranceCMExternal: 0.968 within 10 %
        (8600, 2900, "AverageValue", 3, 3, 3),  # TestReplicaCalcTolerancePerPodCMExternal: 8600/8700
        (8600, 4400, "Value", 0, 0, 2),  # getUsageRatioReplicaCount with current 0: ceil(ratio)
    ],
)
def test_external_metric_replicas(
    value: float, target: float, kind: str, ready: int, current: int, expected: int
) -> None:
    assert external_metric_replicas(value, target, kind, ready, current) == expected


@pytest.mark.xfail(
    strict=True,
    reason="deliberate: upstream computes ceil(ratio x 0 ready) = 0 when no pod is ready (a scale-down to the "
    "floor while every replica is still starting); we hold, as for missing metrics",
)
def test_external_value_with_no_ready_pod_is_zero_upstream() -> None:
    assert external_metric_replicas(8600, 4400, "Value", 0, 3) == 0


def obs(t: float, ready: int, desired: int, window: dict[str, float | None] | None) -> Observation:
    return Observation(t, "az-a", "m", ready, 0, desired, 0, 0, 0.0, 0.5, window)


@pytest.mark.parametrize(
    ("window", "expected"),
    [
        (None, 0.0),  # TestPrometheusScalerExecutePromQuery "no results" with ignoreNullValues (default) -> 0
        ({"ttft_p95_ms": None}, 0.0),  # an empty window (no requests): the query is null -> 0
        ({"ttft_p95_ms": math.nan}, 0.0),  # "NaN" result, ignoreNullValues -> 0
        ({"ttft_p95_ms": 1500.0}, 1500.0),  # "valid value" -> the value
    ],
)
def test_query_reads_null_as_zero(window: dict[str, float | None] | None, expected: float) -> None:
    assert KedaPrometheus()._query(obs(0.0, 1, 1, window)) == expected


def test_activation_from_zero_and_cooldown_to_zero() -> None:
    # scale_scaledobjects.go: active (value > activationThreshold) at 0 replicas -> max(1, minReplicaCount);
    # inactive for cooldownPeriod (300 s) with minReplicaCount 0 -> 0
    k = KedaPrometheus(KedaParams(activation_threshold_ms=100.0), min_replicas=0)
    assert k.decide(obs(0.0, 0, 0, {"ttft_p95_ms": 50.0})) is None  # 50 <= activation 100: stays at 0
    assert k.decide(obs(30.0, 0, 0, {"ttft_p95_ms": 500.0})) == 1  # active: 0 -> 1
    outs = [k.decide(obs(30.0 + 15 * i, 1, 1, {"ttft_p95_ms": 0.0})) for i in range(1, 25)]
    # last active at 30; polls every 30 s; lastActiveTime + cooldown must be *before* now: 330 is not, 360 is
    assert outs.index(0) == 21 and 30.0 + 15 * 22 == 360.0


def test_keda_hpa_has_no_behavior_so_runs_the_legacy_path() -> None:
    # KEDA creates its HPA without spec.behavior (unless advanced.horizontalPodAutoscalerConfig sets one):
    # P95 5 s vs threshold 1 s on 2 replicas -> ceil(5 x 2) = 10, legacy limit max(2 x 2, 4) = 4
    k = KedaPrometheus()
    assert k.behavior.legacy
    assert k.decide(obs(0.0, 2, 2, {"ttft_p95_ms": 5000.0})) == 4
