"""``governor bench traffic --scenario canary``: a bad version rolled out 1 -> 5 -> 20 -> 100 %.

``llama2-70b@v2`` is rolled out by the canary driver's steps
(:meth:`loop.canary_driver.CanaryDriver.step`) on the windows of the stream
worker's control loop (:class:`bench.traffic_sim.LoopPolicy`), and its
``canary`` commands set the share a gateway sends to v2 (the loop's breaker
commands apply too).  Versions:
``errors`` (``--canary-error-rate``, 2 %), ``p99`` (TTFT x
``--canary-p99-factor``, 8: its P99 is over 800 ms even unloaded), ``slow``
(TTFT x ``--canary-latency-factor``, 5: P99 under 800 ms at low load, 5x
stable's), ``good`` (healthy; must be promoted) and ``both`` (the errors and
the P99 together: the design source's bad release, run by ``governor bench
design-source``; not in ``bench traffic``, whose versions are :data:`VERSIONS`).  Arms: ``canary`` (the
default rules), ``canary-abs`` (the slow versions, without the rule relative
to stable) and ``big-bang`` (100 % at the start).  The canary sees what the
stream worker sees: per window, each version's count, errors and TTFT
P50/P95/P99.  Reported: the share of *all* requests v2 served.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from bench.traffic_sim import (
    FALLBACK,
    ZONES,
    LoopPolicy,
    Policy,
    _fleet,
    _gpu_seconds,
    _pct,
    _setup_replicas,
    run_arm,
    summarize,
    workload,
)
from core.settings import ModelSpec, Settings
from loop.canary_driver import new_rollout, params_from_dict
from sim.fastloop import EPOCH_MS0
from sim.fleet import Fleet
from sim.gateway import CommandGateway

TERMINAL = ("promoted", "rolled_back", "aborted")  # a rollout's final states (controllers.canary)
VERSIONS = ("errors", "p99", "slow", "good")  # the bad (and good) v2s ``bench traffic`` rolls out


def rollout_events(pol: LoopPolicy, start_s: float) -> list[dict[str, Any]]:
    """The rollout's start, then each stage it entered and its end, with the share published and the reason."""
    events: list[dict[str, Any]] = [{"t_s": start_s, "event": "start", "share": 0.0}]
    stage = 0
    for e in pol.rollout_log:
        st = e["state"]
        if st["name"] != "running" or st["stage"] != stage:
            stage = st["stage"]
            events.append({"t_s": e["t_s"], "event": st["name"], "share": e["share"], "reason": st["reason"]})
    return events


def scenario_canary(args: argparse.Namespace) -> dict[str, Any]:
    stable, v2 = FALLBACK, f"{FALLBACK}@v2"
    replicas = {stable: args.canary_replicas, v2: args.canary_replicas}
    cfg = _fleet({stable: FALLBACK, v2: FALLBACK}, replicas, args.seed)
    dur = args.canary_duration_s
    arr = workload(args.canary_rate, dur, args.seed, {"voice": 0.7, "trading": 0.3})
    start_s = args.canary_start_s
    settings = Settings(
        models=tuple(ModelSpec(m, min_replicas=n, max_replicas=n) for m, n in replicas.items()),
        zones=ZONES,
        window_s=args.window_s,
        breaker_min_requests=args.breaker_min_requests,
    )

    def rollout(relative: bool) -> dict[str, Any]:
        """What ``governor canary start`` stores (the loop's clock: epoch milliseconds)."""
        p = {"hold_s": args.hold_s, "min_requests_per_stage": args.min_stage_requests}
        params = params_from_dict(p if relative else {**p, "max_slowdown": None})
        return new_rollout(stable, "v2", params, EPOCH_MS0 / 1000 + start_s)

    slow_factor = {"p99": args.canary_p99_factor, "slow": args.canary_latency_factor}

    def mk_setup(bad: str) -> Callable[[Fleet], None]:
        def setup(f: Fleet) -> None:
            _setup_replicas(replicas)(f)
            for z in ZONES:
                if bad in ("errors", "both"):
                    f.inject_errors(z, v2, args.canary_error_rate, 0.0, 1e9)
                if bad in slow_factor or bad == "both":
                    f.inject_latency_spike(z, v2, 1.0, slow_factor.get(bad, args.canary_p99_factor), 0.0, 1e9)

        return setup

    def bigbang(gw: CommandGateway, t: float, win: list[dict[str, Any]]) -> None:
        if start_s <= t < start_s + 1.0:
            for z in ZONES:
                gw.gate.set_canary(z, stable, v2, 1.0)

    routes = {f"{stable}|{z}": 1.0 / len(ZONES) for z in ZONES}
    res: dict[str, Any] = {}
    for bad in getattr(args, "canary_versions", VERSIONS):
        arms: dict[str, Policy] = {"canary": LoopPolicy(settings, rollout(True), start_s)}
        if bad in slow_factor:  # absolute rules only: design source's + sequential P99 (docs/model.md §14 (canary))
            arms["canary-abs"] = LoopPolicy(settings, rollout(False), start_s)
        if bad != "good":
            arms["big-bang"] = bigbang
        for name, pol in arms.items():
            recs, _ = run_arm(cfg, arr, dur, mk_setup(bad), routes, pol)
            s = summarize(recs, _gpu_seconds(cfg, replicas, dur + 300), len(arr))
            on_v2 = [r for r in recs if r["model"] == v2]
            s["v2_requests"] = len(on_v2)
            s["v2_share_of_all"] = len(on_v2) / len(arr)
            s["v2_ttft_p99_ms"] = _pct([r["ttft_ms"] for r in on_v2], 99)
            s["v2_errors"] = sum(r["status"] == "error" for r in on_v2)
            if isinstance(pol, LoopPolicy):
                _rollout_figures(s, pol, recs, on_v2, start_s, dur)
            res[f"{bad}/{name}"] = s
    return res


def _rollout_figures(
    s: dict[str, Any],
    pol: LoopPolicy,
    recs: list[dict[str, Any]],
    on_v2: list[dict[str, Any]],
    start_s: float,
    dur: float,
) -> None:
    """The rollout's events, final state, span and v2's share and P99 during it."""
    assert pol.rollout is not None
    s["events"] = events = rollout_events(pol, start_s)
    s["final"] = pol.rollout["state"]["name"]
    s["breaker_commands"] = len(pol.applied("breaker"))
    end = next((e["t_s"] for e in events if e["event"] in TERMINAL), dur)
    during = [r for r in recs if EPOCH_MS0 + start_s * 1000 <= r["arrival_ms"] < EPOCH_MS0 + end * 1000]
    v2 = {r["model"] for r in on_v2}
    s["rollout_s"] = [start_s, end]
    s["v2_share_during_rollout"] = sum(r["model"] in v2 for r in during) / len(during) if during else 0.0
    first = next((e["t_s"] for e in events if e["event"] != "start"), end)  # the end of the first stage
    first_ms = EPOCH_MS0 + first * 1000
    s["v2_ttft_p99_first_stage_ms"] = _pct([r["ttft_ms"] for r in on_v2 if r["arrival_ms"] < first_ms], 99)
