"""The Dynamo load planner held to Dynamo's own load-scaling facts.

Sources: ai-dynamo/dynamo ``components/src/dynamo/planner/core/load_scaling.py``
(``_advance_load_agg``: "insufficient_data", "scaling_in_progress", prefill
scale-up wins, decode scale-up next, scale-down only when both sides allow it
and then ``max(p, d)``, the ``min_endpoint`` floor, and ``desired = max(desired,
throughput_lower_bound)`` applied also when load sees "no change" --
"scale_down_capped_by_throughput"), ``config/defaults.py`` (interval 5 s,
5 observations, sensitivity 80, ``enable_throughput_scaling = True``) and the
planner tests that exercise them (``tests/plugins/builtins/test_load_propose.py``,
``test_load_propose_diagnostics.py``).  The regressions stand in for Dynamo's
forward-pass-metric regressions (see :mod:`sim.baselines.dynamo`); latencies
are linear in load here so the expected decisions are hand-computable.
"""

from __future__ import annotations

from typing import Any

import pytest

from sim.baselines import Observation
from sim.baselines.dynamo import DynamoLoadParams, DynamoLoadPlanner, DynamoThroughputParams

pytestmark = pytest.mark.timeout(60)

# ttft_p50 = 200 + 100 q ; decode time e2e_p50 - ttft_p50 = (20 + (q + r)) x (11 - 1) -> mean ITL = 20 + q + r
# (11 output tokens per request: 110 output tokens over 10 requests)


def mean_window(k: int) -> dict[str, Any]:
    q, r = float(k), 10.0 * k
    ttft = 200.0 + 100.0 * q
    return {
        "window_end_ms": 10_000 * (k + 1),
        "queue_len_mean": q,
        "running_mean": r,
        "ttft_p50_ms": ttft,
        "e2e_p50_ms": ttft + (20.0 + q + r) * 10.0,
        "count": 10,
        "output_tokens": 110,
        # deliberately absurd tails: the mean-like estimate must not read them
        "ttft_p95_ms": 99_999.0,
        "itl_p95_ms": 99_999.0,
    }


def obs(
    t: float,
    ready: int,
    *,
    desired: int | None = None,
    starting: int = 0,
    queue: int = 0,
    ongoing: int = 0,
    rate: float = 0.0,
    window: dict[str, Any] | None = None,
    held: int = 0,
) -> Observation:
    d = ready + starting if desired is None else desired
    return Observation(t, "az-a", "m", ready, starting, d, ongoing, queue, rate, 0.5, window, zone_queued=held)


def trained(params: DynamoLoadParams | None = None, capacity: float | None = None, n: int = 5) -> DynamoLoadPlanner:
    dl = DynamoLoadPlanner(
        params or DynamoLoadParams(), slo_ttft_ms=1000.0, slo_itl_ms=150.0, replica_capacity_rps=capacity
    )
    for k in range(n):  # observed while a scaling is in flight: learn only
        assert dl.decide(obs(5.0 * k, 2, starting=1, window=mean_window(k))) is None
    return dl


def test_defaults_are_dynamos() -> None:
    p = DynamoLoadParams()
    assert (p.adjustment_interval_s, p.min_observations, p.max_samples, p.scaling_down_sensitivity) == (
        5.0,
        5,
        64,
        80.0,
    )
    assert p.throughput_floor and p.estimate == "mean"


def test_insufficient_data_holds() -> None:
    dl = trained(n=4)  # "insufficient_data": 4 < load_min_observations
    assert dl.decide(obs(20.0, 2, queue=40, ongoing=40)) is None


def test_scaling_in_progress_observes_only() -> None:
    dl = trained()
    assert dl.decide(obs(25.0, 2, desired=3, queue=40, ongoing=40)) is None  # "scaling_in_progress"


@pytest.mark.parametrize(
    ("ready", "queue", "ongoing", "expected"),
    [
        (2, 20, 20, 3),  # prefill side: q = 10 -> TTFT 1200 > 1000 -> +1 (one step, not N)
        (2, 0, 280, 3),  # decode side: 140 per engine -> ITL 160 > 150 -> +1
        (4, 0, 40, 3),  # both allow a scale-down: 4 -> 3 (ITL after consolidation 33 < 120, no queue)
        (2, 0, 120, None),  # decode refuses (ITL 20 + 120 = 140 >= 120 after 2 -> 1): no change
        (2, 8, 8, None),  # prefill refuses (queue-induced 800 >= (1000 - 200) x 0.8): no change
        (1, 0, 1, None),  # one engine: never below min_endpoint = 1
    ],
)
def test_agg_decisions_on_mean_like_estimates(ready: int, queue: int, ongoing: int, expected: int | None) -> None:
    assert trained().decide(obs(25.0, ready, queue=queue, ongoing=ongoing)) == expected


def test_tail_estimate_would_scale_where_the_mean_does_not() -> None:
    # the windows' P95 is absurd (99999 ms): read as the estimate, every decision is +1
    dl = trained(DynamoLoadParams(estimate="p95"))
    assert dl.decide(obs(25.0, 4, queue=0, ongoing=40)) == 5
    assert trained().decide(obs(25.0, 4, queue=0, ongoing=40)) == 3  # the mean-like estimate scales down


def test_throughput_floor_caps_a_scale_down_and_lifts_no_change() -> None:
    params = DynamoLoadParams(throughput=DynamoThroughputParams(adjustment_interval_s=10.0, predictor="constant"))
    dl = trained(params, capacity=1.0)
    # one 10 s interval at 5 req/s (decides at 25, 30, 35; the rate integrates over the 5 s steps)
    assert dl.decide(obs(25.0, 4, queue=0, ongoing=40, rate=5.0)) == 3  # floor not known yet: load alone
    dl.decide(obs(30.0, 3, queue=0, ongoing=30, rate=5.0, desired=4))  # in progress: learn the arrivals only
    # interval over: 50 requests / 10 s / 1 req/s per engine -> floor 5
    # load says 4 -> 3 ("scale_down"), the floor lifts it to 5 ("scale_down_capped_by_throughput" then up)
    assert dl.decide(obs(35.0, 4, queue=0, ongoing=40, rate=5.0)) == 5
    assert dl.floor == 5
    # "no change" from load on 2 engines, still lifted to the floor
    assert dl.decide(obs(40.0, 2, queue=0, ongoing=120, rate=5.0)) == 5


def test_no_floor_without_a_profiled_capacity_or_when_disabled() -> None:
    assert trained().floor_forecast is None  # no capacity: load scaling alone
    assert trained(DynamoLoadParams(throughput_floor=False), capacity=1.0).floor_forecast is None


def test_requests_held_at_the_zone_count_as_queued_work() -> None:
    # 2 engines with 120 running (decode refuses a scale-down) and an empty engine queue: no change;
    # 20 more held in the frontend: q = 10 -> TTFT 1200 > SLA -> +1
    assert trained().decide(obs(25.0, 2, queue=0, ongoing=120, held=0)) is None
    assert trained().decide(obs(25.0, 2, queue=0, ongoing=120, held=20)) == 3
