"""Issue 17, item 5, pinned: the shipped defaults at the knee on both traces.

The feedforward plans with the profile's headroom (``sim.profiling.replica_headroom``:
1.237-1.246 on Azure conversation's cliff, 1.000-1.007 on Mooncake's slope) and lifts
only on evidence beyond one window's counting noise (``controllers.feedforward.lifts``).
On seed 0 (the runs the frontier is made of) every replay-like run, on both traces, holds
99.5 % of the ceiling with at most 11 % waste: the seed's 99.4 % / 11 %.  Over seeds 0-4
Mooncake's slow-start (a 3x slower start-up: a starting replica's GPUs held three times as
long) holds 99.5 % on every seed at 9.3 % mean waste (11.3 % before the lift needed
evidence).  Over seeds 0-4 Mooncake's replay-like three hold 99.5 % of the ceiling pooled
(every seed's met requests over its servable ones, ``bench.seeds.pooled``) with at
most 11 % mean waste, and every seed within two binomial sd of 99.5 % (its counting noise: one
Mooncake request is 0.05 points, a run's sd ~0.17): replica-loss seed 3 is 2 requests short
(99.42 %).  docs/benchmarks.md ("The knee over seeds") reports every scenario over seeds.
"""

from __future__ import annotations

from argparse import Namespace

import pytest

from bench.control import base_config, run_all
from bench.seeds import pooled
from sim.profiling import profile
from sim.traces import load_trace

REPLAY_LIKE = ("replay", "replica-loss", "slow-start")
QPS = {"azure-conv": 20.0, "mooncake": 4.0}


def _governor(trace: str, scenario: str, seed: int, prof: tuple[float, float]) -> dict[str, float]:
    args = Namespace(trace=trace, scenario=scenario, qps=QPS[trace], duration_s=600.0, seed=seed, startup_s=30.0,
                     window_s=10.0, strategies="governor")  # fmt: skip
    (result,), meta = run_all(args, load_trace(trace), *prof)
    assert meta["replica_headroom"] == pytest.approx(prof[1], abs=1e-3)
    return result.metrics


def _profile(trace: str, seed: int) -> tuple[float, float]:
    args = Namespace(trace=trace, qps=QPS[trace], seed=seed, startup_s=30.0, window_s=10.0)
    return profile(load_trace(trace), base_config(args))


@pytest.mark.parametrize("trace", sorted(QPS))
def test_the_defaults_hold_the_knee_on_seed_0(trace: str) -> None:
    prof = _profile(trace, 0)
    for scenario in REPLAY_LIKE:
        m = _governor(trace, scenario, 0, prof)
        assert m["attainment_over_ceiling"] >= 0.995, (trace, scenario, m["attainment_over_ceiling"])
        assert m["waste"] <= 0.11, (trace, scenario, m["waste"])


@pytest.fixture(scope="module")
def mooncake_seeds() -> dict[str, list[dict[str, float]]]:
    profiles = [_profile("mooncake", seed) for seed in range(5)]
    return {sc: [_governor("mooncake", sc, seed, profiles[seed]) for seed in range(5)] for sc in REPLAY_LIKE}


@pytest.fixture(scope="module")
def mooncake_slow_start(mooncake_seeds: dict[str, list[dict[str, float]]]) -> list[dict[str, float]]:
    return mooncake_seeds["slow-start"]


@pytest.mark.parametrize("scenario", REPLAY_LIKE)
def test_mooncake_replay_like_holds_the_knee_pooled_and_within_noise_on_every_seed(
    mooncake_seeds: dict[str, list[dict[str, float]]], scenario: str
) -> None:
    runs = mooncake_seeds[scenario]
    rows = [
        {
            "share": m["attainment_over_ceiling"],
            "attainment": m["slo_attainment"],
            "ceiling": m["ceiling"],
            "requests": m["requests"],
        }
        for m in runs
    ]
    share, within = pooled(rows)
    assert share is not None and share >= 0.995, (scenario, share)
    assert within == len(runs), (scenario, [r["share"] for r in rows])
    assert sum(m["waste"] for m in runs) / len(runs) <= 0.11, (scenario, [m["waste"] for m in runs])


def test_mooncake_slow_start_holds_the_ceiling_on_every_seed(mooncake_slow_start: list[dict[str, float]]) -> None:
    assert all(m["attainment_over_ceiling"] >= 0.995 for m in mooncake_slow_start), mooncake_slow_start


def test_mooncake_slow_start_wastes_at_most_11_percent_over_seeds(mooncake_slow_start: list[dict[str, float]]) -> None:
    wastes = [m["waste"] for m in mooncake_slow_start]
    assert sum(wastes) / len(wastes) <= 0.11, wastes  # what item 5 asks (measured: 9.3 %)
