"""engines.profiling: the capacity bisection, sequential measurement and the SLOs it states.

The replay function is a stand-in with a known answer (attainment falls past a true capacity),
so the bisection's own logic is what is tested; the real engines are profiled by the demo's
end-to-end test (tests/e2e/test_demo_local.py).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from engines.loadgen import LoadResult, RequestResult, RequestSpec
from engines.profiling import Unloaded, capacity_at_slo, poisson_specs, service_knots, slos_from, unloaded


class Plant:
    """A server of true capacity ``cap`` req/s: every request in time below it, a growing share late above."""

    def __init__(self, cap: float) -> None:
        self.cap = cap
        self.calls: list[list[RequestSpec]] = []
        self.busy = False

    async def __call__(self, url: str, model: str, specs: list[RequestSpec], **kw: Any) -> LoadResult:
        assert not self.busy, "a measurement overlapped another"
        self.busy = True
        await asyncio.sleep(0)
        self.busy = False
        self.calls.append(list(specs))
        dur = max((s.at_s for s in specs), default=0.0) or 1.0
        rate = len(specs) / dur
        late = 0.0 if rate <= self.cap else min(1.0, (rate - self.cap) / self.cap * 4)
        results = []
        for i, s in enumerate(specs):
            slow = i < late * len(specs)
            results.append(
                RequestResult(spec=s, sent_s=s.at_s, status="ok", ttft_s=1.0 if slow else 0.01, itl_s=0.002,
                              e2e_s=1.1 if slow else 0.1, output_tokens=s.output_tokens)
            )  # fmt: skip
        return LoadResult(results=results, started_unix_s=0.0, duration_s=dur)


def test_the_bisection_finds_the_capacity_within_its_resolution() -> None:
    plant = Plant(cap=9.0)
    prof = asyncio.run(
        capacity_at_slo(
            "u", "m", ttft_slo_ms=100, itl_slo_ms=10, lo_rps=1, hi_rps=64, steps=8, trial_s=60, seed=3,
            replay_fn=plant,
        )
    )  # fmt: skip
    # 8 geometric halvings of [1, 64] leave a bracket of 64**(1/256); Poisson noise moves the rate a little
    assert 7.5 <= prof.capacity_rps <= 9.5, prof.trials
    assert [t["passed"] for t in prof.trials[:2]] == [True, False]
    assert len(prof.trials) == 2 + 8


def test_a_failing_low_end_gives_zero_and_a_passing_high_end_gives_the_high_end() -> None:
    low = asyncio.run(capacity_at_slo("u", "m", ttft_slo_ms=100, itl_slo_ms=10, lo_rps=4, hi_rps=64, trial_s=30,
                                      replay_fn=Plant(cap=1.0)))  # fmt: skip
    assert low.capacity_rps == 0.0 and len(low.trials) == 1
    high = asyncio.run(capacity_at_slo("u", "m", ttft_slo_ms=100, itl_slo_ms=10, lo_rps=1, hi_rps=8, trial_s=30,
                                       replay_fn=Plant(cap=100.0)))  # fmt: skip
    assert high.capacity_rps == 8 and len(high.trials) == 2


def test_unloaded_measures_one_request_at_a_time_after_its_warm_up() -> None:
    plant = Plant(cap=1e9)
    base = asyncio.run(unloaded("u", "m", n=5, warmup=3, replay_fn=plant))
    assert [len(c) for c in plant.calls] == [1] * 8  # each request alone: no wait for a slot in any TTFT
    assert base.n == 5 and math.isclose(base.ttft_p95_s, 0.01)


def test_service_knots_send_each_batch_together_and_each_repeat_after_the_last() -> None:
    plant = Plant(cap=1e9)
    knots = asyncio.run(service_knots("u", "m", prompt_sizes=(16, 64), batches=(1, 4), repeats=2, replay_fn=plant))
    assert [len(c) for c in plant.calls] == [1, 1, 1, 1, 1, 1, 4, 4]
    assert [x for x, _ in knots["prefill"]] == [16.0, 64.0] and [b for b, _ in knots["decode"]] == [1.0, 4.0]


def test_slos_are_the_stated_multiple_and_a_bad_multiple_is_refused() -> None:
    base = Unloaded(20, 0.007, 0.0084, 0.0013, 0.0015, 0.05)
    assert slos_from(base, 5.0) == (42.0, 7.5)
    assert slos_from(base, 5.0, ttft_edges_s=(0.04, 0.06), itl_edges_s=(0.01, 0.025)) == (60.0, 10.0)
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="multiple"):
            slos_from(base, bad)


def test_poisson_specs_are_seeded_and_bounded() -> None:
    a = poisson_specs(20.0, 10.0, 16, 8, seed=1)
    assert a == poisson_specs(20.0, 10.0, 16, 8, seed=1) != poisson_specs(20.0, 10.0, 16, 8, seed=2)
    assert all(0 < s.at_s < 10.0 for s in a) and 120 < len(a) < 280
    with pytest.raises(ValueError):
        poisson_specs(0.0, 10.0, 16, 8, seed=1)
