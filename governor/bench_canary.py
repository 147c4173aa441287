"""``governor bench traffic --scenario canary``: a bad version rolled out 1 -> 5 -> 20 -> 100 %.

A bad ``llama2-70b@v2`` (errors, or slow) is rolled out by
:mod:`controllers.canary`; arms ``big-bang`` (100 % at the start),
``canary``, and ``canary-good`` (a healthy v2, which must be promoted).
Reported: the share of *all* requests v2 served before the rollback.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from controllers import canary as can
from governor.traffic_sim import (
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
from sim.fleet import Fleet


def scenario_canary(args: argparse.Namespace) -> dict[str, Any]:
    stable, v2 = FALLBACK, f"{FALLBACK}@v2"
    replicas = {stable: args.canary_replicas, v2: args.canary_replicas}
    cfg = _fleet({stable: FALLBACK, v2: FALLBACK}, replicas, args.seed)
    dur = args.canary_duration_s
    arr = workload(args.canary_rate, dur, args.seed, {"voice": 0.7, "trading": 0.3})
    cp = can.CanaryParams(hold_s=args.hold_s, min_requests_per_stage=args.min_stage_requests)
    start_s = args.canary_start_s

    def mk_setup(bad: str) -> Callable[[Fleet], None]:
        def setup(f: Fleet) -> None:
            _setup_replicas(replicas)(f)
            for z in ZONES:
                if bad == "errors":
                    f.inject_errors(z, v2, args.canary_error_rate, 0.0, 1e9)
                elif bad == "latency":
                    f.inject_latency_spike(z, v2, 1.0, args.canary_latency_factor, 0.0, 1e9)
        return setup

    def weights(share: float) -> dict[str, float]:
        w = {f"{stable}|{z}": (1 - share) / len(ZONES) for z in ZONES}
        w.update({f"{v2}|{z}": share / len(ZONES) for z in ZONES})
        return w

    class CanaryPolicy:
        def __init__(self) -> None:
            self.state = can.CanaryState()
            self.events: list[dict] = []
            self.stage_ttft: list[float] = []
            self.share = 0.0

        def __call__(self, f: Fleet, t: float, win: list[dict]) -> None:
            if self.state.name == "pending" and t >= start_s:
                self.state = can.start(cp, t)
                self.events.append({"t_s": t, "event": "start", "share": can.traffic_share(cp, self.state)})
            elif self.state.name == "running":
                cr = [r for r in win if r["model"] == v2]
                sr = [r for r in win if r["model"] == stable]
                self.stage_ttft += [r["ttft_ms"] for r in cr]
                p99 = _pct(self.stage_ttft, 99) if len(self.stage_ttft) >= cp.min_p99_requests else None
                stage = self.state.stage
                self.state, out = can.step(
                    cp, self.state, can.VersionObs(len(cr), sum(r["status"] == "error" for r in cr), p99),
                    can.VersionObs(len(sr), sum(r["status"] == "error" for r in sr), _pct([r["ttft_ms"] for r in sr], 99)), t)
                if out.changed:
                    self.events.append({"t_s": t, "event": out.state_name, "share": out.traffic_share,
                                        "reason": out.reason})
                if self.state.stage != stage:
                    self.stage_ttft = []
            share = can.traffic_share(cp, self.state)
            if t == 0.0 or share != self.share:
                self.share = share
                f.set_routing(FAMILY, weights(share), t)

    def bigbang(f: Fleet, t: float, win: list[dict]) -> None:
        if t == 0.0:
            f.set_routing(FAMILY, weights(0.0), t)
        elif start_s <= t < start_s + args.window_s:
            f.set_routing(FAMILY, weights(1.0), t)

    res: dict[str, Any] = {}
    for bad in ("errors", "latency", "good"):
        arms: dict[str, Any] = {"canary": CanaryPolicy()}
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
                s["v2_share_during_rollout"] = (sum(r["model"] == v2 for r in during) / len(during)
                                                if during else 0.0)
            res[f"{bad}/{name}"] = s
    return res


