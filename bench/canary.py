"""``governor bench traffic --scenario canary``: a bad version rolled out 1 -> 5 -> 20 -> 100 %.

``llama2-70b@v2`` is rolled out by :mod:`controllers.canary`.  Versions:
``errors`` (``--canary-error-rate``, 2 %), ``p99`` (TTFT x
``--canary-p99-factor``, 8: its P99 is over 800 ms even unloaded), ``slow``
(TTFT x ``--canary-latency-factor``, 5: P99 under 800 ms at low load, 5x
stable's) and ``good`` (healthy; must be promoted).  Arms: ``canary`` (the
default rules), ``canary-abs`` (the slow versions, without the rule relative
to stable) and ``big-bang`` (100 % at the start).  The canary sees what the
stream worker sees: per window, each version's count, errors and TTFT
P50/P95/P99.  Reported: the share of *all* requests v2 served.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from bench.traffic_sim import (
    FALLBACK,
    FAMILY,
    ZONES,
    _fleet,
    _gpu_seconds,
    _pct,
    _setup_replicas,
    run_arm,
    summarize,
    workload,
)
from controllers import canary as can
from sim.fleet import Fleet


def version_obs(win: list[dict[str, Any]], model: str) -> can.VersionObs:
    """One version's window as the stream worker reports it: count, errors, TTFT quantiles."""
    rs = [r for r in win if r["model"] == model]
    ttft = [r["ttft_ms"] for r in rs]
    return can.VersionObs(
        len(rs), sum(r["status"] == "error" for r in rs), _pct(ttft, 99), _pct(ttft, 50), _pct(ttft, 95)
    )


def scenario_canary(args: argparse.Namespace) -> dict[str, Any]:
    stable, v2 = FALLBACK, f"{FALLBACK}@v2"
    replicas = {stable: args.canary_replicas, v2: args.canary_replicas}
    cfg = _fleet({stable: FALLBACK, v2: FALLBACK}, replicas, args.seed)
    dur = args.canary_duration_s
    arr = workload(args.canary_rate, dur, args.seed, {"voice": 0.7, "trading": 0.3})
    cp = can.CanaryParams(hold_s=args.hold_s, min_requests_per_stage=args.min_stage_requests)
    start_s = args.canary_start_s

    slow_factor = {"p99": args.canary_p99_factor, "slow": args.canary_latency_factor}

    def mk_setup(bad: str) -> Callable[[Fleet], None]:
        def setup(f: Fleet) -> None:
            _setup_replicas(replicas)(f)
            for z in ZONES:
                if bad == "errors":
                    f.inject_errors(z, v2, args.canary_error_rate, 0.0, 1e9)
                elif bad in slow_factor:
                    f.inject_latency_spike(z, v2, 1.0, slow_factor[bad], 0.0, 1e9)

        return setup

    def weights(share: float) -> dict[str, float]:
        w = {f"{stable}|{z}": (1 - share) / len(ZONES) for z in ZONES}
        w.update({f"{v2}|{z}": share / len(ZONES) for z in ZONES})
        return w

    class CanaryPolicy:
        """The worker's view: per window, each version's count, errors and TTFT P50/P95/P99."""

        def __init__(self, params: can.CanaryParams) -> None:
            self.params = params
            self.state = can.CanaryState()
            self.events: list[dict[str, Any]] = []
            self.share = 0.0

        def __call__(self, f: Fleet, t: float, win: list[dict[str, Any]]) -> None:
            cp = self.params
            if self.state.name == "pending" and t >= start_s:
                self.state = can.start(cp, t)
                self.events.append({"t_s": t, "event": "start", "share": can.traffic_share(cp, self.state)})
            elif self.state.name == "running":
                self.state, out = can.step(cp, self.state, version_obs(win, v2), version_obs(win, stable), t)
                if out.changed:
                    self.events.append(
                        {"t_s": t, "event": out.state_name, "share": out.traffic_share, "reason": out.reason}
                    )
            share = can.traffic_share(cp, self.state)
            if t == 0.0 or share != self.share:
                self.share = share
                f.set_routing(FAMILY, weights(share), t)

    def bigbang(f: Fleet, t: float, win: list[dict[str, Any]]) -> None:
        if t == 0.0:
            f.set_routing(FAMILY, weights(0.0), t)
        elif start_s <= t < start_s + args.window_s:
            f.set_routing(FAMILY, weights(1.0), t)

    res: dict[str, Any] = {}
    for bad in ("errors", "p99", "slow", "good"):
        arms: dict[str, Any] = {"canary": CanaryPolicy(cp)}
        if bad in slow_factor:  # absolute rules only: design source's + sequential P99 (docs/model.md §14 (canary))
            arms["canary-abs"] = CanaryPolicy(replace(cp, max_slowdown=None))
        if bad != "good":
            arms["big-bang"] = bigbang
        for name, pol in arms.items():
            recs, _ = run_arm(cfg, arr, dur, args.window_s, mk_setup(bad), pol)
            s = summarize(recs, _gpu_seconds(cfg, replicas, dur + 300), len(arr))
            on_v2 = [r for r in recs if r["model"] == v2]
            s["v2_requests"] = len(on_v2)
            s["v2_share_of_all"] = len(on_v2) / len(arr)
            s["v2_ttft_p99_ms"] = _pct([r["ttft_ms"] for r in on_v2], 99)
            s["v2_errors"] = sum(r["status"] == "error" for r in on_v2)
            if isinstance(pol, CanaryPolicy):
                s["events"] = pol.events
                s["final"] = pol.state.name
                end = next((e["t_s"] for e in pol.events if e["event"] in can.TERMINAL), dur)
                during = [r for r in recs if start_s * 1000 <= r["arrival_ms"] < end * 1000]
                s["rollout_s"] = [start_s, end]
                s["v2_share_during_rollout"] = sum(r["model"] == v2 for r in during) / len(during) if during else 0.0
                first = next((e["t_s"] for e in pol.events if e["event"] != "start"), end)
                s["v2_ttft_p99_first_stage_ms"] = _pct(
                    [r["ttft_ms"] for r in on_v2 if r["arrival_ms"] < first * 1000], 99
                )
            res[f"{bad}/{name}"] = s
    return res
