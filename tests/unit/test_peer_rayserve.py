"""The Ray Serve baseline held to Ray's own unit tests.

Facts from ray-project/ray ``python/ray/serve/tests/unit/test_autoscaling_policy.py``
(each case names its test), run against
:meth:`~sim.baselines.rayserve.RayServeAutoscaler.policy` -- the default
policy with scaling factors, bounds and the delay logic -- with the context's
``total_num_requests``, running replicas and ``target_num_replicas`` passed
in.  Ray's control loop runs every 0.1 s and waits ``ceil(delay x 10)``
iterations; ours runs every 1 s and waits ``delay`` iterations: the same
delay in seconds, so the wait counts below are seconds.
"""

from __future__ import annotations

import pytest

from sim.baselines import Observation
from sim.baselines.rayserve import RayServeAutoscaler, RayServeParams

pytestmark = pytest.mark.timeout(60)


def ray(target: float, lo: int = 0, hi: int = 1000, **kw: float | None) -> RayServeAutoscaler:
    return RayServeAutoscaler(
        RayServeParams(target_ongoing_requests=target, **kw),  # type: ignore[arg-type]
        min_replicas=lo,
        max_replicas=hi,
    )


@pytest.mark.parametrize(("ongoing", "expected"), [(20, 4), (100, 20), (10, 2)])
def test_single_replica_receives_all_requests(ongoing: int, expected: int) -> None:
    """test_single_replica_receives_all_requests: 4 running, target 5 -> ongoing / 5."""
    r = ray(5, lo=1, hi=50, upscale_delay_s=0.0, downscale_delay_s=0.0)
    assert r.policy(ongoing, 4, 4, 5) == expected


def test_replicas_delayed_startup() -> None:
    """test_replicas_delayed_startup (target 1, no upscale delay, downscale delay 100000 s)."""
    r = ray(1, lo=1, hi=200, upscale_delay_s=0.0, downscale_delay_s=100000.0)
    assert r.policy(100, 1, 1, 1) == 100
    assert r.policy(100, 1, 100, 1) == 100  # target 100, none of the new replicas up yet
    assert r.policy(123, 3, 100, 1) == 123  # two more up, more requests
    assert r.policy(10, 4, 123, 1) == 123  # drained, but the downscale delay holds


@pytest.mark.parametrize("delay_s", [30.0, 0.0])
def test_fluctuating_ongoing_requests(delay_s: float) -> None:
    """test_fluctuating_ongoing_requests: alternating over/under load never outlasts a delay."""
    r = ray(50, lo=1, hi=10, upscale_delay_s=delay_s, downscale_delay_s=delay_s)
    for trial in range(1000):
        if trial % 2 == 0:
            assert r.policy(100, 1, 1, 50) == (1 if delay_s > 0 else 2), trial
        else:
            assert r.policy(40, 2, 2, 50) == (2 if delay_s > 0 else 1), trial


@pytest.mark.parametrize("to_zero_delay", [None, 300.0])
def test_upscale_downscale_delay(to_zero_delay: float | None) -> None:
    """test_upscale_downscale_delay / _run_upscale_downscale_flow (target 1, up 30 s, down 600 s)."""
    r = ray(1, lo=0, hi=2, upscale_delay_s=30.0, downscale_delay_s=600.0, downscale_to_zero_delay_s=to_zero_delay)
    # cold start: 0 running, 1 request -> 1 at once (decide's fast path)
    assert r.decide(Observation(0.0, "az-a", "m", 0, 0, 0, 1, 1, 0.0, 0.0, None)) == 1
    up, down = 30, 600
    to_zero = int(to_zero_delay) if to_zero_delay is not None else down
    assert all(r.policy(2, 1, 1, 1) == 1 for _ in range(up)) and r.policy(2, 1, 1, 1) == 2
    assert all(r.policy(0, 2, 2, 1) == 2 for _ in range(down)) and r.policy(0, 2, 2, 1) == 1
    assert all(r.policy(0, 1, 1, 1) == 1 for _ in range(to_zero)) and r.policy(0, 1, 1, 1) == 0
    # a few scale-up decisions, interrupted by a scale-down one: the counter restarts
    for _ in range(up // 2):
        assert r.policy(2, 1, 1, 1) == 1
    r.policy(0, 1, 1, 1)
    assert all(r.policy(2, 1, 1, 1) == 1 for _ in range(up)) and r.policy(2, 1, 1, 1) == 2


def test_scaling_factor_scale_up_from_0_replicas() -> None:
    """test_scaling_factor_scale_up_from_0_replicas: cold start jumps to ceil(upscaling_factor)."""
    o = Observation(0.0, "az-a", "m", 0, 0, 0, 1, 1, 0.0, 0.0, None)
    assert ray(1, upscaling_factor=10.0).decide(o) == 10  # 1 x 10
    assert ray(1, upscaling_factor=0.5).decide(o) == 1  # ceil(1 x 0.5)


def test_scaling_factor_scale_down_to_0_replicas() -> None:
    """test_scaling_factor_scale_down_to_0_replicas: first stop at 1, then 0; a factor < 1 never sticks."""
    r = ray(1, downscaling_factor=10.0, upscale_delay_s=0.0, downscale_delay_s=0.0)
    assert r.policy(0, 5, 5, 1) == 1
    assert r.policy(0, 1, 1, 1) == 0
    slow = ray(1, downscaling_factor=0.2, upscale_delay_s=0.0, downscale_delay_s=0.0)
    n = 5
    for _ in range(5):
        n = slow.policy(0, n, n, 1) if n > 0 else 0
    assert n == 0


@pytest.mark.parametrize(
    ("factors", "ongoing", "lo_hi"),
    [
        # TestCalculateDesiredNumReplicas.test_scaling_factor (smoothing 0.5): 10 + 0.5 (40 - 10) = 25
        ({"smoothing_factor": 0.5}, 80.0, (24, 26)),
        # ... and down: 10 + 0.5 (1.25 - 10) = 5.6
        ({"smoothing_factor": 0.5}, 2.5, (5, 8)),
        # test_upscaling_factor: up with 0.5 -> 25; down with the default 1 -> 1.25 -> 2
        ({"upscaling_factor": 0.5}, 80.0, (24, 26)),
        ({"upscaling_factor": 0.5}, 2.5, (1, 4)),
        # test_downscaling_factor: up with the default 1 -> 40; down with 0.5 -> 5.6
        ({"downscaling_factor": 0.5}, 80.0, (39, 41)),
        ({"downscaling_factor": 0.5}, 2.5, (5, 8)),
    ],
)
def test_scaling_factors(factors: dict[str, float], ongoing: float, lo_hi: tuple[int, int]) -> None:
    r = RayServeAutoscaler(
        RayServeParams(target_ongoing_requests=2.0, upscale_delay_s=0.0, downscale_delay_s=0.0, **factors),
        min_replicas=0,
        max_replicas=1000,
    )
    assert lo_hi[0] <= r.policy(ongoing, 10, 10, 2) <= lo_hi[1]


@pytest.mark.parametrize("target", [0.5, 1.0, 1.5])
def test_scale_up_and_down_by_ratio(target: float) -> None:
    """TestCalculateDesiredNumReplicas test_scale_up / test_scale_down: 10 replicas at 2x / 0.5x target."""
    assert 19 <= ray(target, upscale_delay_s=0.0).policy(2 * target * 10, 10, 10, target) <= 21
    assert 4 <= ray(target, downscale_delay_s=0.0).policy(0.5 * target * 10, 10, 10, target) <= 6


def test_handle_queued_requests_count() -> None:
    # Ray's handles report requests queued before a replica takes them; zone_queued is that number:
    # 2 running, 64 in them + 64 held -> 128 / 32 = 4
    r = ray(32, upscale_delay_s=0.0, look_back_period_s=1.0, metrics_interval_s=1.0)
    o = Observation(0.0, "az-a", "m", 2, 0, 2, 64, 0, 0.0, 0.5, None, zone_queued=64)
    assert r.decide(o) == 4
