"""The KPA baseline held to Knative's own unit tests.

Facts from knative/serving ``pkg/autoscaler/scaling/autoscaler_test.go``
(each case names its test), run against
:meth:`~sim.baselines.kpa.KnativePodAutoscaler.scale`, the re-implemented
``Scale``.  Upstream's test decider (``newTestAutoscaler``): ``TargetValue`` as
given, ``PanicThreshold`` 2 (200 %), ``MaxScaleUpRate`` and
``MaxScaleDownRate`` 10, stable window 60 s, one ready pod unless set.  The
metric client's stable / panic concurrency are passed straight in: the
window averaging that produces them is ours (checked in test_baselines.py).
"""

from __future__ import annotations

import pytest

from sim.baselines import Observation
from sim.baselines.kpa import KnativePodAutoscaler, KpaParams

pytestmark = pytest.mark.timeout(60)


def kpa(target: float, **kw: float) -> KnativePodAutoscaler:
    params = dict(target_concurrency=target, target_utilization=1.0, max_scale_up_rate=10.0, max_scale_down_rate=10.0)
    params.update(kw)
    a = KnativePodAutoscaler(KpaParams(**params), min_replicas=0, max_replicas=100_000)
    a.start(0.0, 1)  # newTestAutoscaler: one ready pod, not in panic
    return a


@pytest.mark.parametrize(
    ("label", "target", "stable", "panic", "ready", "extra", "prep_panic_pods", "expected"),
    [
        ("AutoscalerNoDataAtZeroNoAutoscale", 10, 0, 0, 1, {}, 0, 0),
        ("AutoscalerStableModeUnlimitedTBC", 181, 21, 26, 1, {}, 0, 1),
        ("Autoscaler0TBC", 10, 50, 49, 1, {}, 0, 5),
        ("AutoscalerStableModeNoChange", 10, 50, 50, 1, {}, 0, 5),
        ("AutoscalerPanicStableLargerThanPanic", 1, 50, 30, 5, {}, 5, 50),  # stable wins while panicking
        ("AutoscalerPanicStableLessThanPanic", 1, 20, 30, 5, {}, 5, 30),  # panic wins
        ("AutoscalerStableModeNoChangeAlreadyScaled", 10, 50, 50, 5, {}, 0, 5),
        ("AutoscalerStableModeIncreaseWithSmallScaleUpRate", 1, 3, 3.1, 2, {"max_scale_up_rate": 1.1}, 0, 3),
        ("AutoscalerStableModeDecreaseWithSmallScaleDownRate", 10, 1, 1, 100, {"max_scale_down_rate": 1.1}, 0, 90),
        ("AutoscalerPanicModeDoublePodCount", 10, 50, 100, 1, {}, 0, 10),  # panic concurrency takes precedence
    ],
)
def test_autoscaler_scale_table(
    label: str,
    target: float,
    stable: float,
    panic: float,
    ready: int,
    extra: dict[str, float],
    prep_panic_pods: int,
    expected: int,
) -> None:
    """TestAutoscalerScale (the table)."""
    a = kpa(target, **extra)
    if prep_panic_pods:  # prepFunc: panicTime = now - 5 s, maxPanicPods = 5
        a.panic_time_s, a.max_panic_pods = -5.0, prep_panic_pods
    assert a.scale(0.0, stable, panic, ready, target) == expected, label


def test_stable_mode_increase_and_decrease() -> None:
    a = kpa(10)  # TestAutoscalerStableModeIncreaseWithConcurrencyDefault: stable 50 -> 5, then 100 -> 10
    assert a.scale(0.0, 50, 10, 1, 10) == 5
    assert a.scale(0.0, 100, 10, 1, 10) == 10
    b = kpa(10)  # TestAutoscalerStableModeDecrease: 8 ready, 100 -> 10, then 50 -> 5
    assert b.scale(0.0, 100, 100, 8, 10) == 10
    assert b.scale(0.0, 50, 50, 8, 10) == 5


def test_rate_limits() -> None:
    up = kpa(10)  # TestAutoscalerRateLimitScaleUp: need 100, only x10 per decision
    assert up.scale(0.0, 1000, 1001, 1, 10) == 10
    assert up.scale(0.0, 1000, 1001, 10, 10) == 100
    down = kpa(10)  # TestAutoscalerRateLimitScaleDown: need 1, only /10 per decision
    assert down.scale(0.0, 1, 1, 100, 10) == 10
    assert down.scale(0.0, 1, 1, 10, 10) == 1
    # TestAutoscalerUseOnePodAsMinimumIfEndpointsNotFound: 0 ready counts as 1 -> limit 10
    assert kpa(10).scale(0.0, 1000, 888, 0, 10) == 10


def test_panic_then_unpanic_scale_down() -> None:
    """TestAutoscalerPanicThenUnPanicScaleDown."""
    a = kpa(10)
    assert a.scale(0.0, 100, 100, 1, 10) == 10
    assert a.scale(0.0, 100, 1000, 10, 10) == 100  # panic: 1000 / 10 = 100 >= 2 x 10
    assert a.scale(30.0, 1, 1, 10, 10) == 100  # traffic gone, still panicking: no scale-down
    assert a.scale(61.0, 1, 1, 10, 10) == 1  # a stable window after the last panic tick


def test_unpanic_after_slow_increase_and_extend_panic_window() -> None:
    a = kpa(1)  # TestAutoscalerUnpanicAfterSlowIncrease
    assert a.scale(0.0, 11, 25, 10, 1) == 25 and a.panic_time_s == 0.0
    assert a.scale(30.0, 30, 41, 40, 1) == 41 and a.panic_time_s == 0.0  # panic time does not move
    assert a.scale(62.0, 50, 56, 55, 1) == 50 and a.panic_time_s is None  # no longer in panic
    b = kpa(1)  # TestAutoscalerExtendPanicWindow
    assert b.scale(0.0, 11, 25, 10, 1) == 25
    assert b.scale(30.0, 30, 80, 40, 1) == 80 and b.panic_time_s == 30.0  # still surging: extended


def test_exponential_track_and_stabilize() -> None:
    """TestAutoscalerPanicModeExponentialTrackAndStabilize."""
    a = kpa(1)
    assert a.scale(0.0, 6, 6, 1, 1) == 6
    assert a.scale(1.0, 36, 36, 6, 1) == 36
    assert a.scale(2.0, 216, 216, 36, 1) == 216
    assert a.scale(2.0, 1296, 1296, 216, 1) == 1296
    assert a.scale(3.0, 1296, 1296, 1296, 1) == 1296


def test_scale_down_delay() -> None:
    """TestAutoscalerScaleDownDelay "simple" (panic threshold out of reach: 1000 %, our maximum)."""
    a = kpa(10, scale_down_delay_s=300.0, panic_threshold_percentage=1000.0)
    assert a.scale(2.0, 40, 40, 0, 10) == 4
    assert a.scale(300.0, 0, 0, 0, 10) == 4  # five minutes at zero: less than the delay
    assert a.scale(302.0, 0, 0, 0, 10) == 0  # 5 min 2 s: the 4 scrolled out


@pytest.mark.parametrize(("ready", "panicking", "max_panic"), [(0, False, 0), (1, False, 0), (2, True, 2)])
def test_start_in_panic_mode(ready: int, panicking: bool, max_panic: int) -> None:
    """TestStartInPanicMode: a new autoscaler with more than one ready pod starts panicking."""
    a = KnativePodAutoscaler(KpaParams(target_concurrency=100.0))
    a.start(0.0, ready)
    assert a.panicking is panicking and a.max_panic_pods == max_panic


def test_activator_requests_count_as_concurrency() -> None:
    # the activator reports the requests it holds while no pod is ready (zone_queued); the queue-proxies
    # report the rest: 0 ready, 30 held, target 10 -> ceil(30 / 10) = 3, capped at ceil(10 x max(1, 0)) = 10
    a = KnativePodAutoscaler(KpaParams(target_concurrency=10.0, target_utilization=1.0), min_replicas=0)
    o = Observation(0.0, "az-a", "m", 0, 1, 1, 0, 0, 0.0, 0.0, None, zone_queued=30)
    assert a.decide(o) == 3
