"""The physical limit bracketed (sim/oracle.py): ceiling, lower bound on GPU-seconds, oracle schedule."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench.control import _factory
from governor.cli import build_parser
from sim.fastloop import LoopConfig, run
from sim.fleet import Fleet, FleetConfig
from sim.oracle import (
    ceiling,
    lower_bound_gpu_seconds,
    oracle_factory,
    request_slo_ok,
    zone_assignment,
)
from sim.perf_model import PerfModel
from sim.profiling import replica_capacity_rps
from sim.scenarios import build
from sim.traces import load_trace
from sim.workloads import Workload

pytestmark = pytest.mark.timeout(120)

AZURE = load_trace("azure-conv")
PERF = PerfModel.from_splitwise()


def test_ceiling_worked_by_hand_on_three_requests() -> None:
    # TTFT SLO 1000 ms, ITL SLO 31 ms.  By hand, from the perf model's documented values:
    # r0: 512 prompt tokens: TTFT = 2 (network) + 0.5 + 0.256 (preprocess) + prefill(512) < 2.8 + prefill(2048)
    #     = 2.8 + 134 ms; ITL = the batch-1 step 30.4 ms at ~517 context tokens (below the 576 reference): ok.
    # r1: 100,000 prompt tokens: the prefill alone is over 1 s: unservable on any fleet.
    # r2: 8,000 prompt, 100 output: TTFT fine, ITL = 30.4 + slope * (8,050 - 576) > 31 ms: unservable.
    w = Workload(np.array([0.0, 0.5, 1.0]), np.array([512, 100_000, 8_000]), np.array([10, 10, 100]), None, "3")
    cfg = LoopConfig.of(ttft_slo_ms=1000.0, itl_slo_ms=31.0)
    assert PERF.prefill_ms(512) <= PERF.prefill_ms(2048) < 135
    assert PERF.prefill_ms(100_000) > 1000
    assert round(PERF.decode_step_ms(1), 1) == 30.4
    assert PERF.decode_step_ms(1) + PERF.decode_ctx_slope_ms * (8_050 - 576) > 31
    assert request_slo_ok(w, cfg).tolist() == [True, False, False]
    assert ceiling(w, cfg) == pytest.approx(1 / 3)
    assert ceiling(w, cfg.replace(itl_slo_ms=150.0)) == pytest.approx(2 / 3)


def test_ceiling_is_what_a_huge_idle_fleet_serves_request_by_request() -> None:
    # An independent reference: the event-driven fleet itself, jitter off, far more replicas than load.
    w = build("replay", load_trace("mooncake"), 1.0, 120.0).workload
    cfg = LoopConfig.of(ttft_slo_ms=6000.0, itl_slo_ms=150.0)
    fleet = Fleet(FleetConfig(models={"m": PERF}, zones=("z",), initial_replicas=150, jitter=False))
    for i in range(len(w)):
        fleet.submit(float(w.arrival_s[i]), "z", "m", int(w.prompt_tokens[i]), int(w.output_tokens[i]), f"r{i}")
    done = {r["request_id"]: r for r in fleet.advance_to(1000.0)}
    served = [done[f"r{i}"]["ttft_ms"] <= 6000 and done[f"r{i}"]["itl_ms"] <= 150 for i in range(len(w))]
    ok = request_slo_ok(w, cfg)
    assert served == ok.tolist()
    assert 0.9 < ceiling(w, cfg) < 1.0  # Mooncake has requests no fleet serves within 6 s
    assert ceiling(w, cfg, prefix_cache=True) >= ceiling(w, cfg)


def test_zone_assignment_is_the_fast_loops_draw() -> None:
    sc = build("replay", AZURE, 4.0, 30.0)
    cfg = LoopConfig.of(initial_replicas=2)
    r = run(_factory("static", cfg, 1.0, 2), sc.workload, cfg, (), sc.duration_s)
    zones = {rec["request_id"]: rec["zone"] for rec in r.finished}
    drawn = zone_assignment(sc.workload, cfg)
    assert [zones[f"r{i}"] for i in range(len(sc.workload))] == [cfg.zones[k] for k in drawn]


@pytest.mark.parametrize(("scenario", "seed"), [("step", 0), ("burst", 1), ("spike", 2)])
def test_lower_bound_is_below_every_strategys_gpu_seconds(scenario: str, seed: int) -> None:
    cfg = LoopConfig.of(initial_replicas=3, seed=seed)
    sc = build(scenario, AZURE, 3.0, 300.0, cfg.zones)  # >= 240 s: burst keeps its bursts apart
    lb = lower_bound_gpu_seconds(sc.workload, cfg)
    assert lb > 0
    strategies = {
        "static": _factory("static", cfg, 1.0, 8),
        "kpa": _factory("kpa", cfg, 1.0, 8),
        "oracle": oracle_factory(sc.workload, cfg, 3.0, sc.faults, sc.duration_s),
        "governor": "governor",
    }
    for name, strat in strategies.items():
        res = run(strat, sc.workload, cfg, sc.faults, sc.duration_s, name=name)
        assert lb <= res.metrics["gpu_seconds"], name
        # the bound is the work at the cheapest batching: below the run's own busy GPU-seconds too
        busy = res.metrics["gpu_seconds"] * (1 - res.metrics["waste"])
        assert lb <= busy, name


def test_oracle_reaches_the_ceiling_on_a_step_at_no_less_than_the_bound() -> None:
    cfg = LoopConfig.of(initial_replicas=2)
    sc = build("step", AZURE, 6.0, 300.0, cfg.zones)
    cap = replica_capacity_rps(AZURE, cfg, duration_s=120.0, iters=6)
    res = run(oracle_factory(sc.workload, cfg, cap, sc.faults, sc.duration_s), sc.workload, cfg, (), sc.duration_s)
    ceil = ceiling(sc.workload, cfg)
    assert res.metrics["slo_attainment"] >= 0.99 * ceil
    assert res.metrics["gpu_seconds"] >= lower_bound_gpu_seconds(sc.workload, cfg)
    # it orders ahead of need: the replicas it holds follow the step up, never a fixed peak fleet
    ready = res.timeline["az-a.ready"]
    assert ready[: len(ready) // 10].max() < ready[-len(ready) // 10 :].min()


def test_the_causal_oracle_follows_a_step_only_after_it_came_and_pays_for_not_knowing() -> None:
    """Same schedule, read only up to now: the oracle orders for a step one start-up before it
    arrives, the causal oracle only after it has seen it, so it never knows the step in advance
    and at the same headroom it is no better than the oracle."""
    cfg = LoopConfig.of(initial_replicas=1, actuation_delay_s=0.0)
    rng = np.random.default_rng(3)
    step_at, end = 150.0, 300.0
    arrivals = np.sort(np.concatenate([rng.uniform(0, step_at, 150), rng.uniform(step_at, end, 1800)]))
    n = len(arrivals)
    w = Workload(arrivals, np.full(n, 512), np.full(n, 100), None, "step")
    cap = 3.0
    t_up = {}
    results = {}
    for causal in (False, True):
        res = run(oracle_factory(w, cfg, cap, (), end, causal=causal), w, cfg, (), end)
        t = np.asarray(res.timeline["t_s"])
        desired = np.asarray(res.timeline["az-a.desired"])
        t_up[causal] = float(t[desired > desired[(t > 20) & (t < 80)].max() + 1][0])
        results[causal] = res.metrics["slo_attainment"]
    assert t_up[False] < step_at - cfg.startup_s / 2  # ordered a start-up ahead (its window is 20 s)
    assert step_at <= t_up[True] <= step_at + 20  # seen as it comes: half a window late at most
    assert results[True] <= results[False]


def test_bench_control_json_carries_the_limits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.control import run_bench

    argv = ["bench", "control", "--scenario", "burst", "--qps", "2", "--duration-s", "120"]
    argv += ["--strategies", "static,oracle", "--json", "--out", str(tmp_path)]
    assert run_bench(build_parser().parse_args(argv)) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    meta = out["meta"]
    assert meta["warm_start"] is True and meta["initial_replicas_per_zone"] == meta["static_replicas_per_zone"]
    assert 0 < meta["ceiling"] <= meta["ceiling_prefix_cache"] <= 1
    assert meta["lower_bound_gpu_seconds"] > 0 and meta["oracle_headroom"] >= 1.0
    by = {s["strategy"]: s for s in out["strategies"]}
    assert set(by) == {"static", "oracle"}
    for s in by.values():
        assert s["ceiling"] == meta["ceiling"]
        assert s["attainment_over_ceiling"] == pytest.approx(s["slo_attainment"] / meta["ceiling"], abs=1e-4)
        assert s["gpu_seconds"] >= meta["lower_bound_gpu_seconds"]
    cold = build_parser().parse_args([*argv[:-3], "--no-warm-start", "--replicas", "1"])
    assert cold.warm_start is False
