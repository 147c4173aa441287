"""governor bench traffic on short runs: each scenario's A/B shows the action's effect."""

from __future__ import annotations

import argparse

from bench import traffic as bt


def _args(**kw: object) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bt.add_parser(p.add_subparsers(dest="bench"))
    ns = p.parse_args(["traffic"])
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


def test_routing_cuts_p95_at_equal_gpu_seconds() -> None:
    res = bt.scenario_routing(_args(duration_s=240.0, spikes=1, spike_start_s=60.0, spike_s=90.0))
    a, b = res["static-primary"], res["routing"]
    assert a["gpu_seconds"] == b["gpu_seconds"] == res["static-all"]["gpu_seconds"]
    assert res["p95_ttft_cut_ms"] > 380.0
    assert b["on_time"] > a["on_time"]
    # against the capacity-proportional static split: TTFT P95 lower, e2e P95 by > 380 ms,
    # with fewer requests degraded to the smaller model
    assert res["p95_ttft_cut_vs_static_all_ms"] > 0.0
    assert res["p95_e2e_cut_vs_static_all_ms"] > 380.0
    assert b["fallback_share"] < res["static-all"]["fallback_share"]
    assert b["route_commands"] > 0 and b["fallback_windows"]  # the worker's RoutingDriver moved the weights


def test_breaker_opens_and_lowers_client_errors() -> None:
    res = bt.scenario_breaker(_args(duration_s=300.0, fault_start_s=60.0, fault_s=200.0))
    assert res["breaker"]["errors"] < res["no-breaker"]["errors"]
    assert any(e["state"] == "open" for e in res["breaker"]["timeline"])


def test_canary_rolls_back_a_bad_version_before_one_percent() -> None:
    res = bt.scenario_canary(
        _args(
            canary_duration_s=400.0,
            canary_rate=20.0,
            canary_replicas=2,
            min_stage_requests=50,
            hold_s=30.0,
            canary_error_rate=0.1,
        )
    )
    bad = res["errors/canary"]
    assert bad["final"] == "rolled_back"
    assert bad["v2_share_of_all"] < 0.05  # short run; the full-size run is in the report
    assert res["errors/big-bang"]["v2_errors"] > bad["v2_errors"]


def test_canary_catches_a_slow_version_at_the_first_stage_and_promotes_a_good_one() -> None:
    """TTFT x5 stays under 800 ms unloaded: only the rule relative to stable sees it at 1 %."""
    res = bt.scenario_canary(
        _args(canary_duration_s=500.0, canary_rate=20.0, canary_replicas=2, min_stage_requests=50, hold_s=30.0)
    )
    slow = res["slow/canary"]
    assert slow["final"] == "rolled_back" and "rolled back at 1%" in slow["events"][-1]["reason"]
    assert slow["v2_share_of_all"] < 0.01
    assert res["slow/canary-abs"]["v2_requests"] > slow["v2_requests"]  # caught later without it
    assert res["good/canary"]["final"] == "promoted"


def test_agents_dynamic_vs_static_same_turns() -> None:
    res = bt.scenario_agents(_args(duration_s=120.0, agent_rate=2.0))
    s, d = res["static-1:1:1"], res["dynamic"]
    assert s["turns"] == d["turns"] > 0
    assert 0.0 <= d["completion"] <= 1.0 and d["mean_response_ms"] > 0


def test_cli_prints_json() -> None:
    assert bt.run_traffic_bench(_args(scenario="agents", duration_s=30.0, agent_rate=1.0, json=True)) == 0
